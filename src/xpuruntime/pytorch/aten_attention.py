"""aten::scaled_dot_product_attention routed to the attention ops, forward and backward.

SDPA is a composite op: its backward belongs to whichever backend op PyTorch picks underneath. To make
both directions follow the policy it is overridden at the Autograd key with an autograd Function whose
forward dispatches `attention_forward` (which also fills the logsumexp) and whose backward dispatches
`attention_backward`, both under the policy the forward saw (`attention=K` names K for both, see
`families`). Below autograd (inference_mode) the backend-key override dispatches `attention` only.
"""

from __future__ import annotations

from typing import Any

import torch

from ..policy import current_policy
from .autograd_common import any_requires_grad, grad_leaves, lse_buffer, plain
from .families import family_policy, fell_back, using, without
from .routing import attrs_for, dispatch, has_op, memoized, wants

_SDPA = torch.ops.aten.scaled_dot_product_attention.default
_BACKWARD_OPS = ("attention_backward",)


def _routable(q: Any, k: Any, v: Any, mask: Any, dropout_p: float) -> bool:
    return dropout_p == 0.0 and plain(q, k, v, mask) and (mask is None or not mask.requires_grad)


def _torch_sdpa(q, k, v, mask, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    return _SDPA.decompose(q, k, v, mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)


def _attrs(op: str, is_causal: bool, scale: float | None, enable_gqa: bool) -> tuple:
    """The op's attribute tuple (made once per op and values: `attrs_for` walks the schema)."""
    key = (op, is_causal, scale, type(scale), enable_gqa)
    values = {"is_causal": is_causal, "scale": scale, "enable_gqa": enable_gqa}
    return memoized(key, lambda: attrs_for(op, values))


def _training_forward(q: Any, k: Any, v: Any, mask: Any, attrs: tuple, policy: Any = None) -> tuple[Any, Any]:
    """(out, logsumexp) from `attention_forward`, or (None, None) when it cannot take the call."""
    if not has_op("attention_forward"):
        return None, None
    lse = lse_buffer(q)
    out = dispatch("attention_forward", (q, k, v, mask, lse), attrs, warn=False, policy=policy)  # `attention` next
    return (out, lse) if out is not None else (None, None)


def _inference_forward(q: Any, k: Any, v: Any, mask: Any, is_causal: bool, scale: Any, enable_gqa: bool) -> Any:
    if enable_gqa and q.shape[-3] != k.shape[-3]:
        out, _ = _training_forward(q, k, v, mask, _attrs("attention_forward", is_causal, scale, enable_gqa))
        return out
    return dispatch("attention", (q, k, v, mask), _attrs("attention", is_causal, scale, enable_gqa))


def _unpack(packed: torch.Tensor, q: Any, k: Any, v: Any) -> tuple:
    """dq, dk, dv from attention_backward's result: views of the flat [dq | dk | dv] array, or the tuple a
    returns_output kernel gives (its own fresh tensors, passed on as they are)."""
    if isinstance(packed, list | tuple):
        return tuple(packed[:3])
    parts = packed.split((q.numel(), k.numel(), v.numel()))
    return parts[0].view(q.shape), parts[1].view(k.shape), parts[2].view(v.shape)


def _torch_grads(saved: tuple, dout: torch.Tensor, ctx: Any) -> tuple:
    q, k, v, mask = saved[:4]
    create = torch.is_grad_enabled()  # create_graph: gradients differentiable in turn
    with torch.enable_grad():
        leaves = grad_leaves(q, k, v)
        out = _torch_sdpa(*leaves, mask, 0.0, ctx.is_causal, ctx.scale, ctx.enable_gqa)
        return torch.autograd.grad(out, leaves, dout, create_graph=create)


class AttentionFunction(torch.autograd.Function):
    """Forward through `attention_forward`, backward through `attention_backward`, one policy."""

    @staticmethod
    def forward(ctx: Any, q: Any, k: Any, v: Any, mask: Any, is_causal: bool, scale: Any, enable_gqa: bool) -> Any:
        ctx.user_policy = current_policy()
        ctx.policy = family_policy(ctx.user_policy)
        ctx.is_causal, ctx.scale, ctx.enable_gqa = is_causal, scale, enable_gqa
        ctx.attrs = _attrs("attention_forward", is_causal, scale, enable_gqa) if has_op("attention_forward") else ()
        out, lse = _training_forward(q, k, v, mask, ctx.attrs, ctx.policy)
        if out is None:  # no training forward for this call: the plain op, and PyTorch's backward
            out = _inference_forward(q, k, v, mask, is_causal, scale, enable_gqa)
        if out is None:
            out = _torch_sdpa(q, k, v, mask, 0.0, is_causal, scale, enable_gqa)
        ctx.save_for_backward(q, k, v, mask, out, lse)  # not ctx attributes: `out` there would be a cycle
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple:
        q, k, v, mask, out, lse = saved = ctx.saved_tensors
        grads = None
        # under create_graph (grad mode on here) only PyTorch's backward gives differentiable gradients
        if lse is not None and has_op("attention_backward") and not torch.is_grad_enabled():
            policy = ctx.policy
            if fell_back("attention_forward", (q, k, v, mask, lse), ctx.attrs, policy):
                policy = without(policy, _BACKWARD_OPS, ctx.user_policy)  # its warning was given once already
            attrs = _attrs("attention_backward", ctx.is_causal, ctx.scale, ctx.enable_gqa)
            packed = dispatch("attention_backward", (dout, q, k, v, out, lse, mask), attrs, policy=policy)
            if packed is not None:
                grads = _unpack(packed, q, k, v)
        if grads is None:
            with using(ctx.user_policy):
                grads = _torch_grads(saved, dout, ctx)
        return (*grads, None, None, None, None)


def sdpa_autograd(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
    """Autograd-key override of aten::scaled_dot_product_attention."""
    if wants("attention") and _routable(q, k, v, attn_mask, dropout_p):
        if any_requires_grad(q, k, v):
            return AttentionFunction.apply(q, k, v, attn_mask, is_causal, scale, enable_gqa)
        out = _inference_forward(q, k, v, attn_mask, is_causal, scale, enable_gqa)
        if out is not None:
            return out
    return _torch_sdpa(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def sdpa_backend(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
    """Backend-key override (reached below autograd, e.g. under inference_mode): forward only."""
    if wants("attention") and _routable(q, k, v, attn_mask, dropout_p):
        out = _inference_forward(q, k, v, attn_mask, is_causal, scale, enable_gqa)
        if out is not None:
            return out
    return _torch_sdpa(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


ROUTES = {
    "attention": (
        ("scaled_dot_product_attention", "autograd", sdpa_autograd),
        ("scaled_dot_product_attention", "backend", sdpa_backend),
    ),
}
