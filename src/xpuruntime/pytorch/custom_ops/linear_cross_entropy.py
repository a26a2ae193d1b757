"""`xpuruntime::linear_cross_entropy` and its backward op: a language model's head and loss,
cross_entropy(hidden @ weight.T + bias, target), without the (rows x vocab) logits in memory, as torch.library
custom ops.

Forward: the `linear_cross_entropy` op through the selector. For a scalar loss ("mean" or "sum") that needs
gradients it also fills grad_hidden / grad_weight / grad_bias (for an upstream gradient of 1) while each chunk's
logits are live, and the backward only scales them by the loss's gradient: three GEMMs of rows x V x H in all,
as unfused PyTorch (the op's docstring says why). The forward op returns them as outputs without gradients
(empty where not asked for), which the autograd formula saves. For reduction="none" the backward op
`linear_cross_entropy_backward` recomputes the logits. Where no kernel of ours runs, the unfused PyTorch form
(F.linear, fp32 logits, the loss formula, autograd) does the same job.

Under autocast, hidden and bias are cast to the autocast dtype first, as nn.Linear's head gets them; an fp32
weight (a model's master weight) enters the op as it is and is cast inside it, so that the op's weight gradient
is fp32 from the start: accumulated over the chunks straight into the buffer that becomes the weight's `.grad`,
where a cast outside the op would hold a half-precision gradient from forward to backward beside the fp32 sum
and then an fp32 copy of it made by the cast's backward (Liger-Kernel's op also takes the fp32 weight). The
logits are taken in fp32 from there and the loss is fp32 (float64 for float64 inputs), as Hugging Face's
ForCausalLMLoss upcasts them. See `eager` for the eager and compiled paths.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ...backends.torch.cross_entropy import loss_and_gradients
from ...errors import DTypeError, argument_error
from ...policy import KernelPolicy
from ..router import IN_FORCE, Pinned, dispatch, pinned_policy
from .common import autocast_cast, or_empty, pytorch_ran, unaliased
from .eager import OpGlue, backward_call, custom_op_body, run


def _buffers(hidden: Tensor, weight: Tensor, bias: Tensor | None, input_grad: bool, weight_grad: bool) -> tuple:
    """Fresh contiguous gradient buffers (None where not wanted), in their tensors' dtypes."""

    def like(t: Tensor | None, wanted: bool) -> Tensor | None:
        return torch.empty(t.shape, dtype=t.dtype, device=t.device) if wanted and t is not None else None

    return like(hidden, input_grad), like(weight, weight_grad), like(bias, weight_grad)


def _compute_weight(hidden: Tensor, weight: Tensor) -> Tensor:
    """The weight in hidden's dtype: an fp32 master weight that the front end left uncast under autocast is
    cast here (transient: the GEMMs read this copy, the gradient buffers keep the weight's own dtype)."""
    return weight if weight.dtype == hidden.dtype else weight.to(hidden.dtype)


def _attrs(weight: Tensor, options: tuple) -> dict[str, Any]:
    ignore_index, label_smoothing, reduction, z_loss_scale = options
    return {"vocab": weight.shape[0], "ignore_index": ignore_index, "label_smoothing": label_smoothing,
            "reduction": reduction, "z_loss_scale": z_loss_scale}  # fmt: skip


def forward(
    hidden: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None, ignore_index: int, label_smoothing: float,
    reduction: str, z_loss_scale: float, input_grad: bool, weight_grad: bool, policy: KernelPolicy,
) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor | None]:  # fmt: skip
    """(loss, grad_hidden, grad_weight, grad_bias); the gradients only where asked for (and never for "none")."""
    options = (ignore_index, label_smoothing, reduction, z_loss_scale)
    wanted = reduction != "none" and (input_grad or weight_grad)
    buffers = _buffers(hidden, weight, bias, input_grad and wanted, weight_grad and wanted)
    weight = _compute_weight(hidden, weight)
    loss = dispatch("linear_cross_entropy", (hidden, weight, target, bias, *buffers), options, policy=policy,
                    routed=False)  # fmt: skip
    if loss is None:
        pytorch_ran("linear_cross_entropy", hidden, weight, target)
        loss = loss_and_gradients(_attrs(weight, options), hidden, weight, target, bias, None, buffers)
    return (loss, *buffers)


def backward(
    grad_loss: Tensor, hidden: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None, ignore_index: int,
    label_smoothing: float, reduction: str, z_loss_scale: float, weight_grad: bool, policy: KernelPolicy,
) -> tuple[Tensor, Tensor | None, Tensor | None]:  # fmt: skip
    """(grad_hidden, grad_weight, grad_bias) for grad_loss, recomputing the logits (reduction "none")."""
    options = (ignore_index, label_smoothing, reduction, z_loss_scale)
    grad_hidden, grad_weight, grad_bias = _buffers(hidden, weight, bias, False, weight_grad)
    weight = _compute_weight(hidden, weight)
    inputs = (grad_loss, hidden, weight, target, bias, grad_weight, grad_bias)
    grad_hidden = dispatch("linear_cross_entropy_backward", inputs, options, policy=policy, routed=False)
    if grad_hidden is None:
        pytorch_ran("linear_cross_entropy_backward", grad_loss, hidden, weight, target)
        grad_hidden = torch.empty(hidden.shape, dtype=hidden.dtype, device=hidden.device)
        buffers = (grad_hidden, grad_weight, grad_bias)
        loss_and_gradients(_attrs(weight, options), hidden, weight, target, bias, grad_loss, buffers)
    return grad_hidden, grad_weight, grad_bias


# -- the custom ops ----------------------------------------------------------------------------------


@torch.library.custom_op("xpuruntime::linear_cross_entropy", mutates_args=())
def linear_cross_entropy_op(
    hidden: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None, ignore_index: int, label_smoothing: float,
    reduction: str, z_loss_scale: float, input_grad: bool, weight_grad: bool, policy: str,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """(loss, grad_hidden, grad_weight, grad_bias): the loss, and its gradients for an upstream gradient of 1
    where asked for (empty tensors otherwise)."""
    with custom_op_body():
        loss, *grads = forward(hidden, weight, target, bias, ignore_index, label_smoothing, reduction, z_loss_scale,
                               input_grad, weight_grad, pinned_policy(policy))  # fmt: skip
        return unaliased((loss, *(or_empty(g, hidden) for g in grads)))


@linear_cross_entropy_op.register_fake
def _(hidden, weight, target, bias, ignore_index, label_smoothing, reduction, z_loss_scale, input_grad, weight_grad,
      policy):  # fmt: skip
    loss = hidden.new_empty(target.shape if reduction == "none" else (), dtype=_loss_dtype(hidden))
    wanted = reduction != "none" and (input_grad or weight_grad)

    def grad(t: Tensor | None, asked: bool) -> Tensor:
        return t.new_empty(t.shape) if t is not None and asked and wanted else hidden.new_empty((0,))

    return loss, grad(hidden, input_grad), grad(weight, weight_grad), grad(bias, weight_grad)


def _loss_dtype(hidden: Tensor) -> torch.dtype:
    return torch.float64 if hidden.dtype == torch.float64 else torch.float32


@torch.library.custom_op("xpuruntime::linear_cross_entropy_backward", mutates_args=())
def linear_cross_entropy_backward_op(
    grad_loss: Tensor, hidden: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None, ignore_index: int,
    label_smoothing: float, reduction: str, z_loss_scale: float, weight_grad: bool, policy: str,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """(grad_hidden, grad_weight, grad_bias) for grad_loss, recomputing the logits; absent ones empty."""
    with custom_op_body():
        grads = backward(grad_loss, hidden, weight, target, bias, ignore_index, label_smoothing, reduction,
                         z_loss_scale, weight_grad, pinned_policy(policy))  # fmt: skip
        return unaliased(tuple(or_empty(g, hidden) for g in grads))


@linear_cross_entropy_backward_op.register_fake
def _(grad_loss, hidden, weight, target, bias, ignore_index, label_smoothing, reduction, z_loss_scale, weight_grad,
      policy):  # fmt: skip
    empty = hidden.new_empty((0,))
    grad_bias = bias.new_empty(bias.shape) if bias is not None and weight_grad else empty
    return hidden.new_empty(hidden.shape), weight.new_empty(weight.shape) if weight_grad else empty, grad_bias


def _setup(ctx: Any, inputs: tuple, output: Any) -> None:
    hidden, weight, target, bias, *options, _input_grad, weight_grad, policy = inputs
    ctx.options, ctx.weight_grad, ctx.policy, ctx.has_bias = tuple(options), weight_grad, policy, bias is not None
    if options[2] == "none":
        ctx.save_for_backward(hidden, weight, target, bias)
    else:
        ctx.save_for_backward(*output[1:])


def _given(g: Tensor | None) -> Tensor | None:
    """A gradient output, or None where the op returned none (an empty 1-d placeholder)."""
    return None if g is None or (g.dim() == 1 and g.numel() == 0) else g


def _scaled(g: Tensor, grad_loss: Tensor) -> Tensor:
    return g * grad_loss


def _scaled_in_place(g: Tensor, grad_loss: Tensor) -> Tensor:
    return g.mul_(grad_loss)  # as g * grad_loss: a 0-d fp32 factor, computed in fp32, rounded once


def _backward(ctx: Any, grad_loss: Tensor, *unused: Any) -> tuple:
    if ctx.options[2] == "none":
        hidden, weight, target, bias = ctx.saved_tensors
        grads = backward_call(ctx, backward, linear_cross_entropy_backward_op, grad_loss, hidden, weight, target,
                              bias, *ctx.options, ctx.weight_grad)  # fmt: skip
        grads = tuple(map(_given, grads))
    else:  # the forward's gradients for an upstream gradient of 1, scaled by the loss's gradient: in place when
        # eager (nothing else holds them; a second copy of the head's weight gradient at the start of the backward
        # would add to the step's peak memory), out of place in a graph (functional code for inductor)
        scale = _scaled_in_place if getattr(ctx, "eager", False) else _scaled
        grads = tuple(None if _given(g) is None else scale(g, grad_loss) for g in ctx.saved_tensors)
    grad_hidden, grad_weight, grad_bias = grads
    return grad_hidden, grad_weight, None, grad_bias if ctx.has_bias else None, *([None] * 7)


linear_cross_entropy_op.register_autograd(_backward, setup_context=_setup)
LINEAR_CROSS_ENTROPY = OpGlue(linear_cross_entropy_op, forward, _setup, _backward, no_grad_outputs=(1, 2, 3))


def linear_cross_entropy(
    hidden: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None = None, ignore_index: int = -100,
    label_smoothing: float = 0.0, reduction: str = "mean", z_loss_scale: float = 0.0, pinned: Pinned = IN_FORCE,
) -> Tensor:  # fmt: skip
    """F.cross_entropy(F.linear(hidden, weight, bias).float(), target, ...) (+ z-loss) through the selector,
    forward and backward, the logits never whole; hidden (..., H), weight (V, H), target hidden's leading dims.
    Under autocast an fp32 weight is cast inside the op and its gradient is fp32 (module docstring); outside
    autocast the dtypes must agree."""
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type) and weight.dtype == torch.float32 and hidden.dtype != torch.float64:
        hidden, bias = autocast_cast(hidden, bias, device_type=device_type)
    else:
        hidden, weight, bias = autocast_cast(hidden, weight, bias, device_type=device_type)
        if weight.dtype != hidden.dtype:
            expected = f"dtype {str(hidden.dtype).removeprefix('torch.')} (same as 'hidden')"
            raise argument_error(DTypeError, "linear_cross_entropy", "weight", expected,
                                 str(weight.dtype).removeprefix("torch."))  # fmt: skip
    grad = torch.is_grad_enabled()
    input_grad, weight_grad = grad and hidden.requires_grad, grad and (
        weight.requires_grad or (bias is not None and bias.requires_grad))  # fmt: skip
    options = (int(ignore_index), float(label_smoothing), reduction, float(z_loss_scale), input_grad, weight_grad)
    return run(LINEAR_CROSS_ENTROPY, (hidden, weight, target, bias, *options), pinned)[0]
