"""aten::mm, aten::bmm and aten::addmm routed to the `matmul` (and `linear`) ops, at the backend key; and
aten::linear under autocast routed to `autocast_linear`, at the Autocast key.

Backward of a matrix product is made of matrix products (autograd calls mm/bmm for the gradients),
so overriding at the backend key makes forward and backward follow the policy, under autocast,
no_grad and inference_mode alike. PyTorch's own kernels stay reachable through the out= variants,
which are separate aten operators and never overridden.

`autocast_linear` sits above autograd: its kernels return outputs that carry their own graph (the
`fused_cast` kernel is one C++ autograd node whose backward writes fp32 gradients straight from its
GEMMs). Outside autocast, aten::linear never reaches that key and runs as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..backends.torch.common import autocast_linear as _autocast_default
from ..policy import KernelPolicy, current_policy
from .autograd_common import plain
from .families import family_policy
from .native_routes import FUSED_CAST, PYTHON, PYTORCH, Decision, python_route
from .routing import attrs_for, dispatch, memoized, nested, routed_ops, runs_pytorch_kernel, torch_kernel_ran

# the out= overloads are separate aten operators (never overridden); the torch.* bindings reach them
# with less Python overhead than torch.ops.aten.*.out
_mm_out, _bmm_out, _addmm_out = torch.mm, torch.bmm, torch.addmm


def _routed_product(
    aten_out: Callable, shape: tuple[int, ...], a: torch.Tensor, b: torch.Tensor
) -> tuple[Any, Decision]:
    """mm / bmm: the product through `matmul` when the policy steers it, else `aten_out` (PyTorch's kernel,
    into a new `shape` output); and whether PyTorch's own kernel ran (see `native_routes.python_route`)."""
    if nested():
        return aten_out(a, b, out=a.new_empty(shape)), None
    if "matmul" in routed_ops(current_policy()):
        out = dispatch("matmul", (a, b))
        if out is not None:
            return out, lambda: runs_pytorch_kernel("matmul", (a, b))
    return aten_out(a, b, out=a.new_empty(shape)), True


@python_route("mm")
def routed_mm(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, Decision]:
    """aten::mm: 2-D product."""
    return _routed_product(_mm_out, (a.shape[0], b.shape[1]), a, b)


@python_route("bmm")
def routed_bmm(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, Decision]:
    """aten::bmm: batched product."""
    return _routed_product(_bmm_out, (a.shape[0], a.shape[1], b.shape[2]), a, b)


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return routed_mm(a, b)[0]


def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return routed_bmm(a, b)[0]


def _as_linear(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, policy: KernelPolicy) -> torch.Tensor | None:
    """x Wᵀ + b through `linear` when the (family-extended) policy names a kernel for it."""
    derived = family_policy(policy)
    if "linear" not in routed_ops(derived):
        return None
    attrs = memoized("linear attrs", lambda: attrs_for("linear", {}))
    return dispatch("linear", (a, b.t(), bias), attrs, policy=derived)


@python_route("addmm")
def routed_addmm(
    bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, beta: float = 1, alpha: float = 1
) -> tuple[torch.Tensor, Decision]:
    """aten::addmm (nn.Linear with bias): the `linear` op (fused bias epilogue) for a plain x Wᵀ + b when
    the policy names linear, or names for matmul a kernel that linear also has; else `matmul` followed
    by the scaled bias add; else PyTorch's kernel. And whether PyTorch's own kernel ran."""
    if nested():
        return _addmm_out(bias, a, b, beta=beta, alpha=alpha, out=a.new_empty((a.shape[0], b.shape[1]))), None
    policy = current_policy()
    steered = routed_ops(policy)
    if beta == 1 and alpha == 1 and bias.dim() == 1 and ("linear" in steered or "matmul" in steered):
        out = _as_linear(bias, a, b, policy)
        if out is not None:  # linear's `torch` kernel is aten's addmm for this call
            return out, lambda: runs_pytorch_kernel("linear", (a, b.t(), bias), family_policy(policy))
    if "matmul" in steered:
        out = dispatch("matmul", (a, b))
        if out is not None:
            if alpha != 1:
                out.mul_(alpha)
            if beta != 0:
                out.add_(bias, alpha=beta)
            return out, False
    return _addmm_out(bias, a, b, beta=beta, alpha=alpha, out=a.new_empty((a.shape[0], b.shape[1]))), True


def addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta: float = 1, alpha: float = 1) -> torch.Tensor:
    return routed_addmm(bias, a, b, beta, alpha)[0]


def _learned_action(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, attrs: tuple) -> int | None:
    """What the native route may run for this signature from now on: the C++ fused_cast node, PyTorch's
    autocast linear, or (any other kernel) the Python route."""
    name = torch_kernel_ran("autocast_linear", (x, weight, bias), dtype=attrs[0])
    return None if name is None else {"fused_cast": FUSED_CAST, "torch": PYTORCH}.get(name, PYTHON)


@python_route("linear", key="CompositeImplicitAutograd")
def routed_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype
) -> tuple[torch.Tensor, Decision]:
    """aten::linear under autocast (computing in `dtype`): through `autocast_linear` when the policy names a
    kernel for it, else autocast's own casts and F.linear. Runs with autocast off (the casts are ours)."""
    if nested() or not plain(x, weight, bias):  # nothing is learned from these calls
        return _autocast_default(x, weight, bias, dtype), None
    if "autocast_linear" not in routed_ops(current_policy()):
        return _autocast_default(x, weight, bias, dtype), PYTORCH
    attrs = (str(dtype).removeprefix("torch."),)
    out = dispatch("autocast_linear", (x, weight, bias), attrs)
    if out is None:
        return _autocast_default(x, weight, bias, dtype), PYTORCH
    return out, lambda: _learned_action(x, weight, bias, attrs)


_AUTOCAST_KEYS = {"cuda": torch._C.DispatchKey.AutocastCUDA, "cpu": torch._C.DispatchKey.AutocastCPU}


def autocast_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The Python form of the native override (used where the C++ extension cannot be built)."""
    device = x.device.type
    keys = torch._C.DispatchKeySet(_AUTOCAST_KEYS.get(device, torch._C.DispatchKey.AutocastCUDA))
    with torch._C._ExcludeDispatchKeyGuard(keys):
        return routed_linear(x, weight, bias, torch.get_autocast_dtype(device))[0]


ROUTES = {
    "matmul": (("mm", "backend", mm), ("bmm", "backend", bmm), ("addmm", "backend", addmm)),
    "linear": (("addmm", "backend", addmm),),
    "autocast_linear": (("linear", "autocast", autocast_linear),),
}
