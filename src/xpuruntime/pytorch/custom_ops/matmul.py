"""`xpuruntime::mm`, `xpuruntime::bmm` and `xpuruntime::addmm`: aten's matrix products through the selector,
as torch.library custom ops, and the routed bodies that the aten overrides run in eager mode.

mm and bmm go to the `matmul` op; addmm (nn.Linear with a bias) to the `linear` op (fused bias epilogue) for
a plain x Wᵀ + b when the policy names linear, or names for matmul a kernel that linear also has; else to
`matmul` followed by the scaled bias add; else PyTorch's kernel runs. PyTorch's own kernels stay reachable
through the out= variants, separate aten operators that are never overridden.

Each routed body returns (out, decision): whether PyTorch's own kernel ran, which the native (C++) routes
learn (see `native`). An inductor graph pass (`compiled`) puts the custom ops in place of aten.mm / bmm /
addmm in compiled forward and backward graphs while a policy steers matmul.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ...policy import KernelPolicy, current_policy
from ..native import Decision
from ..router import attrs_for, dispatch, family_policy, memoized, nested, routed_ops, runs_pytorch_kernel
from .common import graph_origin, unaliased

# the out= overloads are separate aten operators (never overridden); the torch.* bindings reach them
# with less Python overhead than torch.ops.aten.*.out
_mm_out, _bmm_out, _addmm_out = torch.mm, torch.bmm, torch.addmm


def _product(aten_out: Callable, shape: tuple[int, ...], a: Tensor, b: Tensor, routed: bool) -> tuple[Any, Decision]:
    """mm / bmm: the product through `matmul` when the policy steers it, else `aten_out` (PyTorch's kernel,
    into a new `shape` output); and whether PyTorch's own kernel ran (see `native.python_route`)."""
    if nested():
        return aten_out(a, b, out=a.new_empty(shape)), None
    if "matmul" in routed_ops(current_policy()):
        out = dispatch("matmul", (a, b), routed=routed)
        if out is not None:
            return out, lambda: runs_pytorch_kernel("matmul", (a, b))
    return aten_out(a, b, out=a.new_empty(shape)), True


def routed_mm(a: Tensor, b: Tensor, routed: bool = True) -> tuple[Tensor, Decision]:
    """aten::mm: 2-D product (routed=False: a compiled graph's call, see `router.dispatch`)."""
    return _product(_mm_out, (a.shape[0], b.shape[1]), a, b, routed)


def routed_bmm(a: Tensor, b: Tensor, routed: bool = True) -> tuple[Tensor, Decision]:
    """aten::bmm: batched product."""
    return _product(_bmm_out, (a.shape[0], a.shape[1], b.shape[2]), a, b, routed)


def _as_linear(bias: Tensor, a: Tensor, b: Tensor, policy: KernelPolicy, routed: bool) -> Tensor | None:
    """x Wᵀ + b through `linear` when the (family-extended) policy names a kernel for it."""
    derived = family_policy(policy)
    if "linear" not in routed_ops(derived):
        return None
    attrs = memoized("linear attrs", lambda: attrs_for("linear", {}))
    return dispatch("linear", (a, b.t(), bias), attrs, policy=derived, routed=routed)


def routed_addmm(
    bias: Tensor, a: Tensor, b: Tensor, beta: float = 1, alpha: float = 1, routed: bool = True
) -> tuple[Tensor, Decision]:
    """aten::addmm: bias·beta + alpha·(a b), through `linear` or `matmul` (see the module docstring)."""
    if nested():
        return _addmm_out(bias, a, b, beta=beta, alpha=alpha, out=a.new_empty((a.shape[0], b.shape[1]))), None
    policy = current_policy()
    steered = routed_ops(policy)
    if beta == 1 and alpha == 1 and bias.dim() == 1 and ("linear" in steered or "matmul" in steered):
        out = _as_linear(bias, a, b, policy, routed)
        if out is not None:  # linear's `torch` kernel is aten's addmm for this call
            return out, lambda: runs_pytorch_kernel("linear", (a, b.t(), bias), family_policy(policy))
    if "matmul" in steered:
        out = dispatch("matmul", (a, b), routed=routed)
        if out is not None:
            if alpha != 1:
                out.mul_(alpha)
            if beta != 0:
                out.add_(bias, alpha=beta)
            return out, False
    return _addmm_out(bias, a, b, beta=beta, alpha=alpha, out=a.new_empty((a.shape[0], b.shape[1]))), True


# -- the custom ops ----------------------------------------------------------------------------------


@torch.library.custom_op("xpuruntime::mm", mutates_args=())
def mm_op(a: Tensor, b: Tensor) -> Tensor:
    """torch.mm(a, b) through the selector."""
    with graph_origin():
        return unaliased(routed_mm(a, b, routed=False)[:1])[0]


@mm_op.register_fake
def _(a, b):
    return a.new_empty((a.shape[0], b.shape[1]))


@torch.library.custom_op("xpuruntime::bmm", mutates_args=())
def bmm_op(a: Tensor, b: Tensor) -> Tensor:
    """torch.bmm(a, b) through the selector."""
    with graph_origin():
        return unaliased(routed_bmm(a, b, routed=False)[:1])[0]


@bmm_op.register_fake
def _(a, b):
    return a.new_empty((a.shape[0], a.shape[1], b.shape[2]))


@torch.library.custom_op("xpuruntime::addmm", mutates_args=())
def addmm_op(bias: Tensor, a: Tensor, b: Tensor, beta: float, alpha: float) -> Tensor:
    """torch.addmm(bias, a, b, beta=beta, alpha=alpha) through the selector."""
    with graph_origin():
        return unaliased(routed_addmm(bias, a, b, beta, alpha, routed=False)[:1])[0]


@addmm_op.register_fake
def _(bias, a, b, beta, alpha):
    return a.new_empty((a.shape[0], b.shape[1]))


def _save_operands(ctx, inputs, output) -> None:
    a, b = inputs[-4:-2] if len(inputs) == 5 else inputs
    ctx.save_for_backward(a, b)
    ctx.scalars = inputs[3:] if len(inputs) == 5 else (1.0, 1.0)
    ctx.bias_shape = inputs[0].shape if len(inputs) == 5 else None


def _product_grads(ctx, grad: Tensor, product: Callable) -> tuple:
    a, b = ctx.saved_tensors
    alpha = ctx.scalars[1]
    da = product(grad, b.mT) if ctx.needs_input_grad[-4 if ctx.bias_shape is not None else 0] else None
    db = product(a.mT, grad) if ctx.needs_input_grad[-3 if ctx.bias_shape is not None else 1] else None
    if alpha != 1:
        da = None if da is None else da * alpha
        db = None if db is None else db * alpha
    return da, db


def _mm_backward(ctx, grad):
    return _product_grads(ctx, grad, mm_op)


def _bmm_backward(ctx, grad):
    return _product_grads(ctx, grad, bmm_op)


def _addmm_backward(ctx, grad):
    beta = ctx.scalars[0]
    dbias = (grad * beta).sum_to_size(ctx.bias_shape) if ctx.needs_input_grad[0] else None
    return (dbias, *_product_grads(ctx, grad, mm_op), None, None)


mm_op.register_autograd(_mm_backward, setup_context=_save_operands)
bmm_op.register_autograd(_bmm_backward, setup_context=_save_operands)
addmm_op.register_autograd(_addmm_backward, setup_context=_save_operands)
