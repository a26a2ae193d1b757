"""aten::scaled_dot_product_attention routed to the `attention` op, forward and backward.

SDPA is a composite op: its backward belongs to whichever backend op PyTorch picks underneath. To make
both directions follow the policy it is overridden at the Autograd key with an autograd Function whose
forward dispatches `attention` and whose backward dispatches `attention_backward` under the policy
the forward saw. Below autograd (inference_mode) the backend-key override dispatches the forward only.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..policy import current_policy
from .autograd_common import GRAD_ALIASES, any_requires_grad, as_tuple, plain, policy_of_forward
from .routing import attrs_for, dispatch, has_op, inputs_for, wants

_SDPA = torch.ops.aten.scaled_dot_product_attention.default


def _routable(q: Any, k: Any, v: Any, mask: Any, dropout_p: float, enable_gqa: bool) -> bool:
    if dropout_p != 0.0 or not plain(q, k, v, mask) or (mask is not None and mask.requires_grad):
        return False
    return not enable_gqa or q.shape[-3] == k.shape[-3]


def _torch_sdpa(q, k, v, mask, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    return _SDPA.decompose(q, k, v, mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)


def _logsumexp(q: torch.Tensor, k: torch.Tensor, mask: Any, is_causal: bool, scale: float | None) -> torch.Tensor:
    """Row logsumexp of the scaled scores in fp32, for a backward op that needs it when the forward
    kernel did not return it."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if is_causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    elif mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    return torch.logsumexp(scores, dim=-1)


def _torch_grads(ctx: Any, dout: torch.Tensor) -> tuple:
    q, k, v, mask = ctx.inputs
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = _torch_sdpa(*leaves, mask, 0.0, ctx.is_causal, ctx.scale)
        return torch.autograd.grad(out, leaves, dout)


def _routed_grads(ctx: Any, dout: torch.Tensor) -> tuple | None:
    if not has_op("attention_backward"):
        return None
    q, k, v, mask = ctx.inputs
    values = {"dout": dout.contiguous(), "q": q, "k": k, "v": v, "attn_mask": mask, "out": ctx.out, "lse": ctx.lse}
    names = get_backward_inputs()
    if "lse" in names and ctx.lse is None:
        values["lse"] = _logsumexp(q, k, mask, ctx.is_causal, ctx.scale)
    inputs = inputs_for("attention_backward", values, GRAD_ALIASES)
    if inputs is None:
        return None
    result = dispatch("attention_backward", inputs, attrs_for("attention_backward", ctx.attrs))
    return None if result is None else as_tuple(result)[:3]


def get_backward_inputs() -> set[str]:
    from .routing import get_dispatcher

    schema = get_dispatcher().registry.op("attention_backward")
    return {GRAD_ALIASES.get(name, name) for name in schema.inputs}


def _forward(q: Any, k: Any, v: Any, mask: Any, is_causal: bool, scale: float | None) -> tuple[Any, Any]:
    """(out, logsumexp or None) from the dispatcher, or (None, None) to let PyTorch run it."""
    if has_op("attention_forward"):
        inputs = inputs_for("attention_forward", {"q": q, "k": k, "v": v, "attn_mask": mask}, GRAD_ALIASES)
        attrs = attrs_for("attention_forward", {"is_causal": is_causal, "scale": scale})
        result = dispatch("attention_forward", inputs, attrs) if inputs is not None else None
        if result is not None:
            out, *rest = as_tuple(result)
            return out, (rest[0] if rest else None)
    return dispatch(
        "attention", (q, k, v, mask), attrs_for("attention", {"is_causal": is_causal, "scale": scale})
    ), None


class AttentionFunction(torch.autograd.Function):
    """Forward through `attention`, backward through `attention_backward`, both under one policy."""

    @staticmethod
    def forward(ctx: Any, q: Any, k: Any, v: Any, mask: Any, is_causal: bool, scale: float | None) -> torch.Tensor:
        ctx.policy = current_policy()
        ctx.is_causal, ctx.scale = is_causal, scale
        ctx.attrs = {"is_causal": is_causal, "scale": scale}
        out, lse = _forward(q, k, v, mask, is_causal, scale)
        ctx.routed = out is not None
        if out is None:
            out = _torch_sdpa(q, k, v, mask, 0.0, is_causal, scale)
        ctx.save_for_backward(q, k, v, mask, out, lse)  # not ctx attributes: `out` there would be a cycle
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple:
        q, k, v, mask, out, lse = ctx.saved_tensors
        ctx.inputs, ctx.out, ctx.lse = (q, k, v, mask), out, lse
        with policy_of_forward(ctx.policy):
            grads = _routed_grads(ctx, dout) if ctx.routed else None
            if grads is None:
                grads = _torch_grads(ctx, dout)
        ctx.inputs = ctx.out = ctx.lse = None
        return (*grads, None, None, None)


def sdpa_autograd(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
    """Autograd-key override of aten::scaled_dot_product_attention."""
    if wants("attention") and _routable(q, k, v, attn_mask, dropout_p, enable_gqa):
        if any_requires_grad(q, k, v):
            return AttentionFunction.apply(q, k, v, attn_mask, is_causal, scale)
        out, _ = _forward(q, k, v, attn_mask, is_causal, scale)
        if out is not None:
            return out
    return _torch_sdpa(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def sdpa_backend(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
    """Backend-key override (reached below autograd, e.g. under inference_mode): forward only."""
    if wants("attention") and _routable(q, k, v, attn_mask, dropout_p, enable_gqa):
        out, _ = _forward(q, k, v, attn_mask, is_causal, scale)
        if out is not None:
            return out
    return _torch_sdpa(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


ROUTES = {
    "attention": (
        ("scaled_dot_product_attention", "autograd", sdpa_autograd),
        ("scaled_dot_product_attention", "backend", sdpa_backend),
    ),
}
