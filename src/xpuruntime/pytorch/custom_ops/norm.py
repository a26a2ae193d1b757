"""`xpuruntime::layer_norm`, `xpuruntime::rms_norm` and their backward ops: the norms through the selector,
as torch.library custom ops.

Forward: the `layer_norm` / `rms_norm` op through the selector, else PyTorch's kernel. Backward: the
`layer_norm_backward` / `rms_norm_backward` op, else PyTorch's backward (recomputing the statistics, which
the forward op does not return). Both follow the policy in force when they run (or the one pinned to the call,
see `router.Pinned`), extended to the op's family (`layer_norm=K` names K for `layer_norm_backward`); the
policy name `torch` means PyTorch's own kernels. rms_norm takes the op's `offset` and `casting`
("llama": Hugging Face's LlamaRMSNorm, which rounds x_hat to the input dtype before the weight).

The norm routes emit the forward ops into graphs that torch.compile traces while a policy steers the norm;
their registered autograd puts the backward ops into the backward graph. Eager calls of the routes run
`forward` / `backward` below directly, and so compute the same. `layer_norm` and `rms_norm` at the end are
the front ends of patched modules (`eager` says how they run).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ...backends.torch.norm import rms_norm_formula
from ...policy import KernelPolicy
from ..router import (
    IN_FORCE,
    Pinned,
    attrs_for,
    dispatch,
    has_op,
    input_names,
    inputs_for,
    memoized,
    pinned_policy,
)
from .common import (
    GRAD_ALIASES,
    autocast_float32,
    compact,
    grad_leaves,
    native_layer_norm_stats,
    or_empty,
    unaliased,
    unpack_norm_grads,
)
from .eager import OpGlue, backward_call, custom_op_body, run
from .inline import fused_custom_op

TORCH_KERNEL = "torch"  # the policy name that means "PyTorch's own kernel" for these ops
_LAYER_NORM = torch.ops.aten.layer_norm.default
_RMS_NORM = torch.ops.aten.rms_norm.default
_LN_BACKWARD = torch.ops.aten.native_layer_norm_backward.default


def inputs(op: str, x: Any, weight: Any, bias: Any) -> tuple:
    return (x, weight, bias) if op == "layer_norm" else (x, weight)


PLAIN = (0.0, "torch")  # rms_norm's (offset, casting) as F.rms_norm computes it


def forward(
    op: str, x: Tensor, weight: Any, bias: Any, normalized_shape: tuple, eps: Any, policy: Any, routed: bool = True,
    options: tuple = PLAIN,
) -> Any:  # fmt: skip
    """The norm through the selector; None where no kernel of ours can take the call. `options`: rms_norm's
    (offset, casting)."""
    attrs = (normalized_shape, eps) if options == PLAIN else (normalized_shape, eps, *options)
    return dispatch(op, inputs(op, x, weight, bias), attrs, policy=policy, routed=routed)


def torch_forward(
    op: str, x: Tensor, weight: Any, bias: Any, normalized_shape: Any, eps: Any, options: tuple = PLAIN
) -> Tensor:
    """PyTorch's own norm (its composite: never the route again); Hugging Face's formula for other options."""
    if op == "layer_norm":
        return _LAYER_NORM.decompose(x, list(normalized_shape), weight, bias, eps)
    if options == PLAIN:
        return _RMS_NORM.decompose(x, list(normalized_shape), weight, eps)
    attrs = {"normalized_shape": tuple(normalized_shape), "eps": default_eps(x, eps), "offset": options[0],
             "casting": options[1]}  # fmt: skip
    return rms_norm_formula(x, weight, attrs)


class BackwardRoute(NamedTuple):
    """How a norm's backward op is called for one (op, normalized_shape, eps): fixed by its schema."""

    op: str
    attrs: tuple
    stats: bool  # whether it takes the forward's mean and rstd


def backward_route(op: str, normalized_shape: tuple, eps: float, options: tuple = PLAIN) -> BackwardRoute | None:
    """The backward op of `op` with its attributes, or None when the registry has none (made once)."""
    backward_op = f"{op}_backward"
    if not has_op(backward_op):
        return None

    def make() -> BackwardRoute:
        values = {"normalized_shape": normalized_shape, "eps": eps}
        if options != PLAIN:
            values.update(offset=options[0], casting=options[1])
        attrs = attrs_for(backward_op, values)
        names = {name for name, _ in input_names(backward_op, GRAD_ALIASES)}
        return BackwardRoute(backward_op, attrs, bool(names & {"mean", "rstd"}))

    return memoized((backward_op, normalized_shape, eps, type(eps), options), make)


def stats(x: Tensor, normalized_shape: tuple, eps: float, rms: bool) -> tuple[Tensor, Tensor]:
    """(mean, rstd) in fp32, shaped as native_layer_norm returns them (mean is zero for RMS norm)."""
    xf, axes = x.float(), tuple(range(x.dim() - len(normalized_shape), x.dim()))
    if rms:
        return torch.zeros((), device=x.device), torch.rsqrt(xf.square().mean(axes, keepdim=True) + eps)
    var, mean = torch.var_mean(xf, dim=axes, keepdim=True, correction=0)
    return mean, torch.rsqrt(var + eps)


def backward(
    op: str, dy: Tensor, x: Tensor, weight: Any, bias: Any, normalized_shape: tuple, eps: float, policy: Any,
    saved_stats: tuple | None = None, routed: bool = True, options: tuple = PLAIN,
) -> tuple | None:  # fmt: skip
    """(dx, dweight or None, dbias or None) from the norm's backward op; None where none can run.
    `saved_stats`: the forward's (mean, rstd) if PyTorch's forward made them (else recomputed if needed)."""
    route = backward_route(op, normalized_shape, eps, options)
    if route is None:
        return None
    values = {"dout": dy, "x": x, "weight": weight, "bias": bias}
    if route.stats:
        values["mean"], values["rstd"] = saved_stats or stats(x, normalized_shape, eps, op == "rms_norm")
    args = inputs_for(route.op, values, GRAD_ALIASES)
    if args is None:
        return None
    result = dispatch(route.op, args, route.attrs, policy=policy, routed=routed)
    if result is None:
        return None
    grads = [*unpack_norm_grads(result, x, normalized_shape, 2 if op == "layer_norm" else 1), None]
    return grads[0], (grads[1] if weight is not None else None), (grads[2] if bias is not None else None)


def torch_grads(
    op: str, dy: Tensor, x: Tensor, weight: Any, bias: Any, normalized_shape: tuple, eps: float,
    saved_stats: tuple | None = None, differentiable: bool | None = None, options: tuple = PLAIN,
) -> tuple:  # fmt: skip
    """PyTorch's backward (it reaches no routed aten op, so no policy scope is needed); differentiable itself
    under create_graph (grad mode on; `differentiable=False` inside a custom op's body, below autograd)."""
    if op == "layer_norm":
        mean, rstd = saved_stats or native_layer_norm_stats(x, normalized_shape, weight, bias, eps)
        mask = [True, weight is not None, bias is not None]
        return tuple(_LN_BACKWARD(dy, x, list(normalized_shape), mean, rstd, weight, bias, mask))
    if not (torch.is_grad_enabled() if differentiable is None else differentiable) or options != PLAIN:
        return (*_rms_norm_grads(dy, x, weight, normalized_shape, eps, options), None)
    with torch.enable_grad():  # create_graph: gradients differentiable in turn
        leaves = grad_leaves(x, weight)
        out = _RMS_NORM.decompose(leaves[0], list(normalized_shape), leaves[1], eps)
        present = [t for t in leaves if t is not None]
        grads = iter(torch.autograd.grad(out, present, dy, create_graph=True))
        return next(grads), (next(grads) if weight is not None else None), None


def _rms_norm_grads(
    dy: Tensor, x: Tensor, weight: Any, normalized_shape: tuple, eps: float, options: tuple = PLAIN
) -> tuple:
    """(dx, dweight or None) of rms_norm, computed in fp32 (fp64 for fp64 inputs); under casting "llama" through
    the forward's roundings as autograd takes them (ops/norm_backward.py's reference)."""
    offset, casting = options
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    axes = tuple(range(x.dim() - len(normalized_shape), x.dim()))
    xf, dyf = x.to(dtype), dy.to(dtype)
    rstd = torch.rsqrt(xf.square().mean(axes, keepdim=True) + eps)
    xhat = xf * rstd
    g = dyf if weight is None else dyf * (weight.to(dtype) + offset)
    rounded = xhat
    if casting == "llama":  # the weight multiplies x_hat rounded to x's dtype; its gradient comes back rounded
        g, rounded = g.to(x.dtype).to(dtype), xhat.to(x.dtype).to(dtype)
    dx = rstd * (g - xhat * (g * xhat).mean(axes, keepdim=True))
    dw = None if weight is None else (dyf * rounded).sum_to_size(weight.shape).to(weight.dtype)
    return dx.to(x.dtype), dw


def default_eps(x: Tensor, eps: float | None) -> float:
    """rms_norm's eps=None: the dtype's machine epsilon, as PyTorch."""
    return torch.finfo(x.dtype).eps if eps is None else eps


# -- the custom ops ----------------------------------------------------------------------------------


def forward_body(
    op: str, x: Tensor, shape: tuple, weight: Any, bias: Any, eps: Any, options: tuple, policy: KernelPolicy
) -> Tensor:
    """The forward ops' body: the norm through the selector under `policy` (family-extended), else PyTorch's."""
    out = None
    if policy.preferences.get(op) != TORCH_KERNEL:
        out = forward(op, x, weight, bias, shape, eps, policy, routed=False, options=options)
    return torch_forward(op, x, weight, bias, shape, eps, options) if out is None else out


def backward_body(
    op: str, dy: Tensor, x: Tensor, shape: tuple, weight: Any, bias: Any, eps: Any, options: tuple,
    policy: KernelPolicy,
) -> tuple:  # fmt: skip
    """The backward ops' body: (dx, dweight or None, dbias or None)."""
    eps, grads = default_eps(x, eps), None
    if policy.preferences.get(op) != TORCH_KERNEL:
        grads = backward(op, dy, x, weight, bias, shape, eps, policy, routed=False, options=options)
    if grads is None:
        grads = torch_grads(op, dy, x, weight, bias, shape, eps, differentiable=False, options=options)
    return grads


@fused_custom_op("xpuruntime::layer_norm")
def layer_norm_op(
    input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, bias: Tensor | None, eps: float,
    policy: str = "",
) -> Tensor:  # fmt: skip
    """F.layer_norm(input, normalized_shape, weight, bias, eps) through the selector."""
    with custom_op_body():
        out = forward_body("layer_norm", input, tuple(normalized_shape), weight, bias, eps, PLAIN,
                           pinned_policy(policy))  # fmt: skip
        return unaliased((out,))[0]  # contiguous, as the fake says (inductor checks strides)


@layer_norm_op.register_fake
def _(input, normalized_shape, weight, bias, eps, policy=""):
    return input.new_empty(input.shape)


@fused_custom_op("xpuruntime::layer_norm_backward")
def layer_norm_backward_op(
    dy: Tensor, input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, bias: Tensor | None,
    eps: float, policy: str = "",
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """(dx, dweight, dbias) of layer_norm; an absent weight's or bias's gradient is an empty tensor."""
    with custom_op_body():
        dx, dw, db = backward_body("layer_norm", dy, input, tuple(normalized_shape), weight, bias, eps, PLAIN,
                                   pinned_policy(policy))  # fmt: skip
        return unaliased((dx, or_empty(dw, input), or_empty(db, input)))


@layer_norm_backward_op.register_fake
def _(dy, input, normalized_shape, weight, bias, eps, policy=""):
    dw = input.new_empty((0,)) if weight is None else weight.new_empty(weight.shape)
    db = input.new_empty((0,)) if bias is None else bias.new_empty(bias.shape)
    return input.new_empty(input.shape), dw, db


@fused_custom_op("xpuruntime::rms_norm")
def rms_norm_op(
    input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, eps: float | None, offset: float = 0.0,
    casting: str = "torch", policy: str = "",
) -> Tensor:  # fmt: skip
    """F.rms_norm(input, normalized_shape, weight, eps) through the selector (`offset`, `casting`: the op's)."""
    with custom_op_body():
        out = forward_body("rms_norm", input, tuple(normalized_shape), weight, None, eps, (offset, casting),
                           pinned_policy(policy))  # fmt: skip
        return unaliased((out,))[0]


@rms_norm_op.register_fake
def _(input, normalized_shape, weight, eps, offset=0.0, casting="torch", policy=""):
    return input.new_empty(input.shape)


@fused_custom_op("xpuruntime::rms_norm_backward")
def rms_norm_backward_op(
    dy: Tensor, input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, eps: float | None,
    offset: float = 0.0, casting: str = "torch", policy: str = "",
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """(dx, dweight) of rms_norm; an absent weight's gradient is an empty tensor."""
    with custom_op_body():
        dx, dw, _ = backward_body("rms_norm", dy, input, tuple(normalized_shape), weight, None, eps, (offset, casting),
                                  pinned_policy(policy))  # fmt: skip
        return unaliased((dx, or_empty(dw, input)))


@rms_norm_backward_op.register_fake
def _(dy, input, normalized_shape, weight, eps, offset=0.0, casting="torch", policy=""):
    return input.new_empty(input.shape), input.new_empty((0,)) if weight is None else weight.new_empty(weight.shape)


def _save(ctx: Any, x: Tensor, weight: Any, bias: Any, shape: Any, eps: Any, policy: Any) -> None:
    ctx.save_for_backward(x, *(t for t in (weight, bias) if t is not None))
    ctx.normalized_shape, ctx.eps, ctx.policy = tuple(shape), eps, policy
    ctx.has_weight, ctx.has_bias = weight is not None, bias is not None


def _setup_layer_norm(ctx: Any, inputs: tuple, output: Any) -> None:
    x, shape, weight, bias, eps, *policy = inputs
    _save(ctx, x, weight, bias, shape, eps, policy[0] if policy else "")


def _setup_rms_norm(ctx: Any, inputs: tuple, output: Any) -> None:
    x, shape, weight, eps, *rest = inputs
    offset, casting, policy = (*rest, *(0.0, "torch", "")[len(rest) :])
    _save(ctx, x, weight, None, shape, eps, policy)
    ctx.options = (offset, casting)


def _saved(ctx) -> tuple:
    x, *params = ctx.saved_tensors
    weight = params.pop(0) if ctx.has_weight else None
    bias = params.pop(0) if ctx.has_bias else None
    return x, weight, bias


def _layer_norm_backward_body(dy, x, shape, weight, bias, eps, policy) -> tuple:
    return backward_body("layer_norm", dy, x, tuple(shape), weight, bias, eps, PLAIN, policy)


def _rms_norm_backward_body(dy, x, shape, weight, eps, offset, casting, policy) -> tuple:
    return backward_body("rms_norm", dy, x, tuple(shape), weight, None, eps, (offset, casting), policy)[:2]


def _layer_norm_backward(ctx, dy):
    x, weight, bias = _saved(ctx)
    dx, dw, db = backward_call(ctx, _layer_norm_backward_body, layer_norm_backward_op, dy, x,
                               list(ctx.normalized_shape), weight, bias, ctx.eps)  # fmt: skip
    return dx, None, compact(dw) if ctx.has_weight else None, compact(db) if ctx.has_bias else None, None, None


def _rms_norm_backward(ctx, dy):
    x, weight, _ = _saved(ctx)
    dx, dw = backward_call(ctx, _rms_norm_backward_body, rms_norm_backward_op, dy, x, list(ctx.normalized_shape),
                           weight, ctx.eps, *ctx.options)  # fmt: skip
    return dx, None, compact(dw) if ctx.has_weight else None, None, None, None, None


layer_norm_op.register_autograd(_layer_norm_backward, setup_context=_setup_layer_norm)
rms_norm_op.register_autograd(_rms_norm_backward, setup_context=_setup_rms_norm)


def call(op: str, x: Tensor, normalized_shape: tuple, weight: Any, bias: Any, eps: Any) -> Tensor:
    """The forward op's output (what a route emits into a traced graph)."""
    if op == "layer_norm":
        return torch.ops.xpuruntime.layer_norm(x, list(normalized_shape), weight, bias, float(eps))
    return torch.ops.xpuruntime.rms_norm(x, list(normalized_shape), weight, None if eps is None else float(eps))


# -- the front ends of patched modules -------------------------------------------------------------------

LAYER_NORM = OpGlue(
    layer_norm_op, lambda x, shape, w, b, eps, policy: forward_body("layer_norm", x, tuple(shape), w, b, eps, PLAIN,
                                                                    policy),
    _setup_layer_norm, _layer_norm_backward,
)  # fmt: skip
RMS_NORM = OpGlue(
    rms_norm_op, lambda x, shape, w, eps, offset, casting, policy: forward_body(
        "rms_norm", x, tuple(shape), w, None, eps, (offset, casting), policy),
    _setup_rms_norm, _rms_norm_backward,
)  # fmt: skip


def layer_norm(
    x: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, bias: Tensor | None, eps: float,
    pinned: Pinned = IN_FORCE,
) -> Tensor:  # fmt: skip
    """F.layer_norm through the selector, forward and backward. Under CUDA autocast its inputs are cast to
    float32 first, as PyTorch's autocast runs layer_norm (CPU autocast leaves it alone)."""
    x, weight, bias = autocast_float32(x, weight, bias)
    return run(LAYER_NORM, (x, list(normalized_shape), weight, bias, float(eps)), pinned)


def rms_norm(
    x: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, eps: float | None, offset: float = 0.0,
    casting: str = "torch", pinned: Pinned = IN_FORCE,
) -> Tensor:  # fmt: skip
    """rms_norm through the selector, forward and backward; casting="llama" is Hugging Face's LlamaRMSNorm (no
    autocast casting: its operations keep their dtypes under autocast)."""
    args = (x, list(normalized_shape), weight, None if eps is None else float(eps), float(offset), casting)
    return run(RMS_NORM, args, pinned)
