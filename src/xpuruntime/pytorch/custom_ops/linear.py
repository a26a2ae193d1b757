"""`xpuruntime::linear` and its backward op: act(x @ weight.T + bias) through the selector, with the bias and
the activation fused into the GEMM where a kernel can (cuBLASLt's BIAS / GELU_BIAS / RELU_BIAS epilogues), as
torch.library custom ops. For an MLP's first projection: GPT-2's c_fc + gelu_new, a BERT intermediate with the
tanh GELU.

`activation` is None, "relu" or "gelu" (the tanh approximation, the `linear` op's). Forward: the `linear` op,
else F.linear and the activation. Backward: the pre-activation is recomputed (one GEMM, the same op without its
activation) instead of being kept from the forward, which saves an activation of rows x N per layer; the
activation's derivative is PyTorch's (gelu_backward / threshold_backward); then `linear_grad_input` and
`linear_grad_weight` (bias gradient in the GEMM's BGRADB epilogue on cuBLASLt), else PyTorch's matmuls.
Under autocast x, weight and bias are cast to the autocast dtype first, as F.linear and addmm get them.
See `eager` for the eager and compiled paths. In a compiled graph (`inline`) a library kernel the policy pins
(cuBLASLt) keeps the op opaque; where the policy names none, the body traces F.linear and the activation for
inductor: run opaque, the op's Python dispatch cost ~0.3 ms per forward and ~0.65 ms per backward of host time
in a compiled GPT-2 step (H200), which made the step host-bound (patched + compile 0.93x compile).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ...policy import KernelPolicy
from ..router import IN_FORCE, Pinned, dispatch, pinned_policy
from .common import autocast_cast, or_empty, pytorch_ran, unaliased
from .eager import OpGlue, backward_call, custom_op_body, run
from .inline import fused_custom_op

ACTIVATIONS = (None, "relu", "gelu")


def _activate(z: Tensor, activation: str | None) -> Tensor:
    if activation == "relu":
        return F.relu(z)
    return F.gelu(z, approximate="tanh") if activation == "gelu" else z


def forward(x: Tensor, weight: Tensor, bias: Tensor | None, activation: str | None, policy: KernelPolicy) -> Tensor:
    out = dispatch("linear", (x, weight, bias), (activation,), policy=policy, routed=False)
    if out is None:
        pytorch_ran("linear", x, weight)
        return _activate(F.linear(x, weight, bias), activation)
    return out


def _activation_backward(dy: Tensor, z: Tensor, activation: str | None) -> Tensor:
    if activation == "relu":
        return torch.ops.aten.threshold_backward(dy, z, 0)
    return torch.ops.aten.gelu_backward(dy, z, approximate="tanh") if activation == "gelu" else dy


def backward(
    dy: Tensor, x: Tensor, weight: Tensor, bias: Tensor | None, activation: str | None, input_grad: bool,
    weight_grad: bool, policy: KernelPolicy,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:  # fmt: skip
    """(dx, dweight, dbias), each only where asked for."""
    dz = dy if activation is None else _activation_backward(dy, forward(x, weight, bias, None, policy), activation)
    dx = dweight = dbias = None
    if input_grad:
        dx = dispatch("linear_grad_input", (dz, weight, None), (None,), policy=policy, routed=False)
        if dx is None:
            pytorch_ran("linear_grad_input", dz, weight)
            dx = dz.matmul(weight)
    if weight_grad:
        with_bias = bias is not None
        packed = dispatch("linear_grad_weight", (dz, x), (with_bias,), policy=policy, routed=False)
        n, k = weight.shape
        if packed is None:
            pytorch_ran("linear_grad_weight", dz, x)
            rows = dz.reshape(-1, n)
            dweight, dbias = rows.t().matmul(x.reshape(-1, k)), rows.sum(0) if with_bias else None
        else:
            dweight, dbias = (packed[: n * k].view(n, k), packed[n * k :]) if with_bias else (packed, None)
    return dx, dweight, dbias


# -- the custom ops ----------------------------------------------------------------------------------


@fused_custom_op("xpuruntime::linear")
def linear_op(x: Tensor, weight: Tensor, bias: Tensor | None, activation: str | None, policy: str) -> Tensor:
    """act(x @ weight.T + bias) through the selector."""
    with custom_op_body():
        return unaliased((forward(x, weight, bias, activation, pinned_policy(policy)),))[0]


@linear_op.register_fake
def _(x, weight, bias, activation, policy):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@fused_custom_op("xpuruntime::linear_backward")
def linear_backward_op(
    dy: Tensor, x: Tensor, weight: Tensor, bias: Tensor | None, activation: str | None, input_grad: bool,
    weight_grad: bool, policy: str,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """(dx, dweight, dbias) of linear; those not asked for (or without a bias) are empty tensors."""
    with custom_op_body():
        grads = backward(dy, x, weight, bias, activation, input_grad, weight_grad, pinned_policy(policy))
        return unaliased(tuple(or_empty(g, x) for g in grads))


@linear_backward_op.register_fake
def _(dy, x, weight, bias, activation, input_grad, weight_grad, policy):
    empty = x.new_empty((0,))
    dx = x.new_empty(x.shape) if input_grad else empty
    dweight = weight.new_empty(weight.shape) if weight_grad else empty
    return dx, dweight, bias.new_empty(bias.shape) if weight_grad and bias is not None else empty


def _setup(ctx: Any, inputs: tuple, output: Any) -> None:
    x, weight, bias, activation, policy = inputs
    ctx.save_for_backward(x, weight, bias)
    ctx.activation, ctx.policy = activation, policy
    ctx.wanted = (x.requires_grad, weight.requires_grad or (bias is not None and bias.requires_grad))


def _backward(ctx: Any, dy: Tensor) -> tuple:
    x, weight, bias = ctx.saved_tensors
    grads = backward_call(ctx, backward, linear_backward_op, dy.contiguous(), x, weight, bias, ctx.activation,
                          *ctx.wanted)  # fmt: skip
    dx, dweight, dbias = (g if g is not None and g.numel() else None for g in grads)
    return dx, dweight, dbias if bias is not None else None, None, None


linear_op.register_autograd(_backward, setup_context=_setup)
LINEAR = OpGlue(linear_op, forward, _setup, _backward)


def linear(
    x: Tensor, weight: Tensor, bias: Tensor | None = None, activation: str | None = None, pinned: Pinned = IN_FORCE
) -> Tensor:
    """act(x @ weight.T + bias) through the selector, forward and backward (`activation`: None, "relu" or
    "gelu", the tanh approximation); `weight` (N, K) in any layout (a Conv1D's weight.T is a view)."""
    x, weight, bias = autocast_cast(x, weight, bias, device_type=x.device.type)
    return run(LINEAR, (x, weight, bias, activation), pinned)
