"""aten::mm, aten::bmm and aten::addmm routed to the `matmul` (and `linear`) ops, at the backend key; and
aten::linear under autocast routed to `autocast_linear`, at the Autocast key.

Backward of a matrix product is made of matrix products (autograd calls mm/bmm for the gradients), so
overriding at the backend key makes forward and backward follow the policy, under autocast, no_grad and
inference_mode alike. The bodies are the custom ops' (`custom_ops.matmul`); the native (C++) routes run
them through Python for each new signature and learn which run PyTorch's own kernel (`native`).

Tracing never reaches the backend key: in graphs that torch.compile builds, the inductor pass
(`compiled`) puts the custom ops in place of aten's products.

`autocast_linear` sits above autograd: its kernels return outputs that carry their own graph (the
`fused_cast` kernel is one C++ autograd node whose backward writes fp32 gradients straight from its
GEMMs). Outside autocast, aten::linear never reaches that key and runs as before.
"""

from __future__ import annotations

import torch

from ...backends.torch.common import autocast_linear as _autocast_default
from ...policy import current_policy
from ..custom_ops.common import plain
from ..custom_ops.matmul import routed_addmm, routed_bmm, routed_mm
from ..native import FUSED_CAST, PYTHON, PYTORCH, Decision, python_route
from ..router import dispatch, nested, routed_ops, torch_kernel_ran

python_route("mm")(routed_mm)
python_route("bmm")(routed_bmm)
python_route("addmm")(routed_addmm)


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return routed_mm(a, b)[0]


def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return routed_bmm(a, b)[0]


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
