"""aten::layer_norm and aten::rms_norm routed to the `layer_norm` / `rms_norm` ops, forward and backward.

Both are composite ops, overridden at the Autograd key with autograd Functions: forward dispatches the
norm op, backward dispatches `layer_norm_backward` / `rms_norm_backward` (when registered) under the
policy the forward saw, else runs PyTorch's backward. Below autograd the backend-key override
dispatches the forward only. Both run the bodies of the custom ops (`custom_ops.norm`), replayed from their
recorded launches where they only launch Triton kernels (`custom_ops.replay`).

While torch.compile traces the call, the route emits `xpuruntime::layer_norm` / `xpuruntime::rms_norm`
where the policy steers the norm (see `tracing`); their registered autograd puts the backward ops into the
backward graph.
"""

from __future__ import annotations

from typing import Any

import torch

from ...policy import current_policy
from ..custom_ops import norm as ops
from ..custom_ops.common import any_requires_grad, compact, plain, traced
from ..custom_ops.replay import call as run_body
from ..router import family_policy, fell_back, wants, without
from ..tracing import declined, in_graph

_NATIVE_LAYER_NORM = torch.ops.aten.native_layer_norm.default


def _why_not(x: Any, weight: Any, bias: Any) -> str | None:
    """The argument no kernel of ours can take, if any (the call then runs PyTorch's norm)."""
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.dtype != x.dtype:
            return f"{name} is {t.dtype} and the input {x.dtype}: xpuruntime's norms take one dtype"
    return None


class NormFunction(torch.autograd.Function):
    """Forward through `layer_norm` / `rms_norm`, backward through their backward ops, one policy."""

    @staticmethod
    def forward(ctx: Any, op: str, x: Any, weight: Any, bias: Any, normalized_shape: tuple, eps: Any) -> Any:
        ctx.user_policy = current_policy()
        ctx.policy = family_policy(ctx.user_policy)
        ctx.op, ctx.normalized_shape, ctx.raw_eps = op, normalized_shape, eps
        ctx.eps = ops.default_eps(x, eps)
        ctx.save_for_backward(x, weight, bias)
        ctx.stats = None
        out = run_body(ops.forward, (op, x, weight, bias, normalized_shape, eps), ctx.policy)
        if out is None and op == "layer_norm":  # PyTorch's forward, keeping its stats for the backward
            out, mean, rstd = _NATIVE_LAYER_NORM(x, list(normalized_shape), weight, bias, eps)
            ctx.stats = (mean, rstd)
        elif out is None:
            out = ops.torch_forward(op, x, weight, bias, normalized_shape, eps)
        return out

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple:
        x, weight, bias = ctx.saved_tensors
        grads = None
        # under create_graph (grad mode on here) only PyTorch's backward gives differentiable gradients
        if not torch.is_grad_enabled():
            policy = ctx.policy
            forward_inputs = ops.inputs(ctx.op, x, weight, bias)
            if fell_back(ctx.op, forward_inputs, (ctx.normalized_shape, ctx.raw_eps), policy):
                policy = without(policy, (f"{ctx.op}_backward",), ctx.user_policy)  # warned once already
            args = (ctx.op, dy, x, weight, bias, ctx.normalized_shape, ctx.eps)
            if ctx.stats is None:
                grads = run_body(ops.backward, args, policy)
            else:  # PyTorch's forward ran: its statistics go to the backward op
                grads = ops.backward(*args, policy, ctx.stats)
        if grads is None:
            grads = ops.torch_grads(ctx.op, dy, x, weight, bias, ctx.normalized_shape, ctx.eps, ctx.stats)
        ctx.stats = None
        return None, grads[0], compact(grads[1]), compact(grads[2]), None, None


def _norm(op: str, autograd: bool, x: Any, normalized_shape: Any, weight: Any, bias: Any, eps: Any) -> Any:
    if wants(op):
        if plain(x, weight, bias):
            why_not = _why_not(x, weight, bias)
            if why_not is None:
                shape = tuple(map(int, normalized_shape))
                if autograd and any_requires_grad(x, weight, bias):
                    return NormFunction.apply(op, x, weight, bias, shape, eps)
                out = ops.forward(op, x, weight, bias, shape, eps, current_policy())
                if out is not None:
                    return out
            else:
                declined(op, why_not, current_policy(), (x,))
        elif traced(x, weight, bias):
            args = ops.inputs(op, x, weight, bias)
            attrs = {"normalized_shape": tuple(normalized_shape), "eps": eps}
            if in_graph(op, op, args, attrs, _why_not(x, weight, bias)):
                return ops.call(op, x, tuple(normalized_shape), weight, bias, eps)
    return ops.torch_forward(op, x, weight, bias, normalized_shape, eps)


def layer_norm_autograd(input, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    """Autograd-key override of aten::layer_norm."""
    return _norm("layer_norm", True, input, normalized_shape, weight, bias, eps)


def layer_norm_backend(input, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    """Backend-key override of aten::layer_norm (below autograd): forward only."""
    return _norm("layer_norm", False, input, normalized_shape, weight, bias, eps)


def rms_norm_autograd(input, normalized_shape, weight=None, eps=None):
    """Autograd-key override of aten::rms_norm."""
    return _norm("rms_norm", True, input, normalized_shape, weight, None, eps)


def rms_norm_backend(input, normalized_shape, weight=None, eps=None):
    """Backend-key override of aten::rms_norm (below autograd): forward only."""
    return _norm("rms_norm", False, input, normalized_shape, weight, None, eps)


ROUTES = {
    "layer_norm": (("layer_norm", "autograd", layer_norm_autograd), ("layer_norm", "backend", layer_norm_backend)),
    "rms_norm": (("rms_norm", "autograd", rms_norm_autograd), ("rms_norm", "backend", rms_norm_backend)),
}
