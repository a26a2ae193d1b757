"""swiglu / geglu and their backward ops as PyTorch computes the unfused module: `act(gate) * up`, and
autograd's own kernels (aten silu_backward / gelu_backward) for the gradients."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ...abi import ArgPack
from ...registry import kernel
from .common import GPU_FLOAT_DTYPES, returned
from .norm import write_packed


def _halves(gate: torch.Tensor, up: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    if up is None:
        return gate.chunk(2, dim=-1)
    return gate, up


def _act(g: torch.Tensor, kind: str) -> torch.Tensor:
    return F.silu(g) if kind == "silu" else F.gelu(g, approximate=kind)


def _act_backward(grad: torch.Tensor, g: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "silu":
        return torch.ops.aten.silu_backward(grad, g)
    return torch.ops.aten.gelu_backward(grad, g, approximate=kind)


def _forward(args: ArgPack, kind: str) -> Any:
    gate, up = _halves(*args.inputs)
    return returned(args, _act(gate, kind) * up)


def gradients(dy: torch.Tensor, gate_in: torch.Tensor, up_in: torch.Tensor | None, kind: str) -> tuple:
    """(dgate, dup) of act(gate) * up by the kernels autograd runs (gate_in packs [gate | up] when up_in is None):
    PyTorch operations only, so the fused op's fallback can trace them into a graph as well."""
    gate, up = _halves(gate_in, up_in)
    return _act_backward(dy * up, gate, kind), dy * _act(gate, kind)


def _backward(args: ArgPack, kind: str) -> None:
    dy, gate_in, up_in = args.inputs
    dgate, dup = gradients(dy, gate_in, up_in, kind)
    if up_in is None:
        args.out.copy_(torch.cat([dgate, dup], dim=-1))
    else:
        write_packed(args.out, [dgate[None], dup[None]])


_HINTS = dict(backend="torch", dtypes=GPU_FLOAT_DTYPES, priority=20, traceable=True)


@kernel("swiglu", "torch", returns_output=True, **_HINTS)
def swiglu_torch(args: ArgPack) -> Any:
    """F.silu(gate) * up."""
    return _forward(args, "silu")


@kernel("geglu", "torch", returns_output=True, **_HINTS)
def geglu_torch(args: ArgPack) -> Any:
    """F.gelu(gate, approximate) * up."""
    return _forward(args, args.attrs["approximate"])


@kernel("swiglu_backward", "torch", **_HINTS)
def swiglu_backward_torch(args: ArgPack) -> None:
    """dup = dy * silu(gate), dgate = silu_backward(dy * up, gate)."""
    _backward(args, "silu")


@kernel("geglu_backward", "torch", **_HINTS)
def geglu_backward_torch(args: ArgPack) -> None:
    """dup = dy * gelu(gate), dgate = gelu_backward(dy * up, gate)."""
    _backward(args, args.attrs["approximate"])
