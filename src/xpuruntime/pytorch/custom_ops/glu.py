"""`xpuruntime::swiglu`, `xpuruntime::geglu` and their backward ops: the gated MLP activations
act(gate) * up (silu for SwiGLU, gelu for GeGLU) through the selector, as torch.library custom ops.

`up=None` takes one packed [gate | up] projection. Forward: the `swiglu` / `geglu` op, else PyTorch's
formula (F.silu / F.gelu times up). Backward: `swiglu_backward` / `geglu_backward` (dgate, dup), else
autograd through that formula, as eager PyTorch computes it. Only gate and up are saved (PyTorch's unfused
form also keeps act(gate)). No autocast casting: PyTorch's autocast leaves both operations alone, so the
inputs keep their dtypes (an MLP's bf16 projections under autocast). See `eager` for the two paths.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ...backends.torch.glu import gradients
from ...policy import KernelPolicy
from ..router import IN_FORCE, Pinned, dispatch, pinned_policy
from .common import or_empty, pytorch_ran, unaliased
from .eager import OpGlue, backward_call, custom_op_body, run
from .inline import fused_custom_op


def formula(gate: Tensor, up: Tensor | None, activation: str) -> Tensor:
    """PyTorch's act(gate) * up; activation "silu", or F.gelu's approximation "none" / "tanh"."""
    if up is None:
        gate, up = gate.chunk(2, dim=-1)
    return (F.silu(gate) if activation == "silu" else F.gelu(gate, approximate=activation)) * up


def formula_backward(dy: Tensor, gate: Tensor, up: Tensor | None, activation: str) -> tuple:
    """(dgate, dup) by the kernels autograd runs for `formula` (aten's silu_backward / gelu_backward); for a packed
    gate, (its gradient, None). PyTorch operations only, so a graph can hold them (`inline`)."""
    dgate, dup = gradients(dy, gate, up, activation)
    return (torch.cat([dgate, dup], dim=-1), None) if up is None else (dgate, dup)


def forward(gate: Tensor, up: Tensor | None, activation: str, policy: KernelPolicy) -> Tensor:
    """swiglu (activation "silu") or geglu (F.gelu's approximation) through the selector, else the formula."""
    op, attrs = ("swiglu", ()) if activation == "silu" else ("geglu", (activation,))
    out = dispatch(op, (gate, up), attrs, policy=policy, routed=False)
    if out is None:
        pytorch_ran(op, gate, up)
        return formula(gate, up, activation)
    return out


def backward(dy: Tensor, gate: Tensor, up: Tensor | None, activation: str, policy: KernelPolicy) -> tuple:
    """(dgate, dup); for a packed gate, (its gradient, None)."""
    op, attrs = ("swiglu_backward", ()) if activation == "silu" else ("geglu_backward", (activation,))
    packed = dispatch(op, (dy, gate, up), attrs, policy=policy, routed=False)
    if packed is None:
        pytorch_ran(op, dy, gate, up)
        return formula_backward(dy, gate, up, activation)
    return (packed, None) if up is None else (packed[0], packed[1])


# -- the custom ops ----------------------------------------------------------------------------------


@fused_custom_op("xpuruntime::swiglu")
def swiglu_op(gate: Tensor, up: Tensor | None, policy: str) -> Tensor:
    """silu(gate) * up through the selector (up=None: gate packs [gate | up])."""
    with custom_op_body():
        return unaliased((forward(gate, up, "silu", pinned_policy(policy)),))[0]


@fused_custom_op("xpuruntime::geglu")
def geglu_op(gate: Tensor, up: Tensor | None, approximate: str, policy: str) -> Tensor:
    """gelu(gate, approximate) * up through the selector (up=None: gate packs [gate | up])."""
    with custom_op_body():
        return unaliased((forward(gate, up, approximate, pinned_policy(policy)),))[0]


@fused_custom_op("xpuruntime::swiglu_backward")
def swiglu_backward_op(dy: Tensor, gate: Tensor, up: Tensor | None, policy: str) -> tuple[Tensor, Tensor]:
    """(dgate, dup) of swiglu; for a packed gate, its gradient and an empty tensor."""
    with custom_op_body():
        dgate, dup = backward(dy, gate, up, "silu", pinned_policy(policy))
        return unaliased((dgate, or_empty(dup, gate)))


@fused_custom_op("xpuruntime::geglu_backward")
def geglu_backward_op(
    dy: Tensor, gate: Tensor, up: Tensor | None, approximate: str, policy: str
) -> tuple[Tensor, Tensor]:
    """(dgate, dup) of geglu; for a packed gate, its gradient and an empty tensor."""
    with custom_op_body():
        dgate, dup = backward(dy, gate, up, approximate, pinned_policy(policy))
        return unaliased((dgate, or_empty(dup, gate)))


def _output_fake(gate: Tensor, up: Tensor | None, *attrs: Any) -> Tensor:
    return gate.new_empty(gate.shape if up is not None else (*gate.shape[:-1], gate.shape[-1] // 2))


def _grads_fake(dy: Tensor, gate: Tensor, up: Tensor | None, *attrs: Any) -> tuple[Tensor, Tensor]:
    return gate.new_empty(gate.shape), gate.new_empty((0,)) if up is None else up.new_empty(up.shape)


swiglu_op.register_fake(_output_fake)
geglu_op.register_fake(_output_fake)
swiglu_backward_op.register_fake(_grads_fake)
geglu_backward_op.register_fake(_grads_fake)


def _setup(ctx: Any, inputs: tuple, output: Any) -> None:
    gate, up, *approximate, policy = inputs
    ctx.save_for_backward(gate, up)
    ctx.attrs, ctx.policy = tuple(approximate), policy


def _swiglu_backward_body(dy: Tensor, gate: Tensor, up: Tensor | None, policy: KernelPolicy) -> tuple:
    return backward(dy, gate, up, "silu", policy)


def _swiglu_backward(ctx: Any, dy: Tensor) -> tuple:
    gate, up = ctx.saved_tensors
    dgate, dup = backward_call(ctx, _swiglu_backward_body, swiglu_backward_op, dy, gate, up)
    return dgate, None if up is None else dup, None


def _geglu_backward(ctx: Any, dy: Tensor) -> tuple:
    gate, up = ctx.saved_tensors
    dgate, dup = backward_call(ctx, backward, geglu_backward_op, dy, gate, up, *ctx.attrs)
    return dgate, None if up is None else dup, None, None


swiglu_op.register_autograd(_swiglu_backward, setup_context=_setup)
geglu_op.register_autograd(_geglu_backward, setup_context=_setup)
SWIGLU = OpGlue(swiglu_op, lambda gate, up, policy: forward(gate, up, "silu", policy), _setup, _swiglu_backward)
GEGLU = OpGlue(geglu_op, forward, _setup, _geglu_backward)


def swiglu(gate: Tensor, up: Tensor | None = None, pinned: Pinned = IN_FORCE) -> Tensor:
    """silu(gate) * up through the selector, forward and backward (up=None: gate packs [gate | up])."""
    return run(SWIGLU, (gate, up), pinned)


def geglu(gate: Tensor, up: Tensor | None = None, approximate: str = "none", pinned: Pinned = IN_FORCE) -> Tensor:
    """gelu(gate, approximate) * up through the selector, forward and backward."""
    return run(GEGLU, (gate, up, approximate), pinned)
