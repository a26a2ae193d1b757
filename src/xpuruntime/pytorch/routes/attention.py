"""aten::scaled_dot_product_attention routed to the attention ops, forward and backward.

SDPA is a composite op: its backward belongs to whichever backend op PyTorch picks underneath. To make
both directions follow the policy it is overridden at the Autograd key with an autograd Function whose
forward dispatches `attention_forward` (which also fills the logsumexp) and whose backward dispatches
`attention_backward`, both under the policy the forward saw (`attention=K` names K for both, see
`families`). Below autograd (inference_mode) the backend-key override dispatches the forward only. Both
run the bodies of the custom ops (`custom_ops.attention`).

While torch.compile traces the call, the route emits `xpuruntime::attention` into the graph where the policy
steers attention (see `tracing`); its registered autograd puts `xpuruntime::attention_backward` into the
backward graph. An argument no kernel of ours takes (dropout, a mask that requires grad) runs PyTorch's
SDPA with one KernelFallbackWarning and a dispatch-log entry, or raises under a strict policy.
"""

from __future__ import annotations

from typing import Any

import torch

from ...policy import current_policy
from ..custom_ops import attention as ops
from ..custom_ops.common import any_requires_grad, grad_leaves, lse_buffer, plain, traced
from ..router import dispatch, family_policy, fell_back, has_op, using, wants, without
from ..tracing import declined, in_graph

_BACKWARD_OPS = ("attention_backward",)


def _why_not(mask: Any, dropout_p: float) -> str | None:
    """The argument no kernel of ours can take, if any (the call then runs PyTorch's SDPA)."""
    if dropout_p != 0.0:
        return f"dropout_p={dropout_p}: xpuruntime's attention kernels take no dropout (apply it outside the op)"
    if mask is not None and mask.requires_grad and torch.is_grad_enabled():
        return "attn_mask requires grad: only PyTorch's backward gives the mask its gradient"
    return None


def _inference_forward(q: Any, k: Any, v: Any, mask: Any, is_causal: bool, scale: Any, enable_gqa: bool) -> Any:
    """The plain `attention` op (no logsumexp to keep), or the training forward for grouped-query calls."""
    if enable_gqa and q.shape[-3] != k.shape[-3]:
        return ops.forward(q, k, v, mask, is_causal, scale, enable_gqa, family_policy(current_policy()))[0]
    return dispatch("attention", (q, k, v, mask), ops.attrs("attention", is_causal, scale, enable_gqa))


def _torch_grads(saved: tuple, dout: torch.Tensor, ctx: Any) -> tuple:
    q, k, v, mask = saved[:4]
    create = torch.is_grad_enabled()  # create_graph: gradients differentiable in turn
    with torch.enable_grad():
        leaves = grad_leaves(q, k, v)
        out = ops.torch_sdpa(*leaves, mask, 0.0, ctx.is_causal, ctx.scale, ctx.enable_gqa)
        return torch.autograd.grad(out, leaves, dout, create_graph=create)


class AttentionFunction(torch.autograd.Function):
    """Forward through `attention_forward`, backward through `attention_backward`, one policy."""

    @staticmethod
    def forward(ctx: Any, q: Any, k: Any, v: Any, mask: Any, is_causal: bool, scale: Any, enable_gqa: bool) -> Any:
        ctx.user_policy = current_policy()
        ctx.policy = family_policy(ctx.user_policy)
        ctx.is_causal, ctx.scale, ctx.enable_gqa = is_causal, scale, enable_gqa
        out, lse = ops.forward(q, k, v, mask, is_causal, scale, enable_gqa, ctx.policy)
        if out is None:  # no kernel of ours for this call: PyTorch's forward, and PyTorch's backward
            out = ops.torch_sdpa(q, k, v, mask, 0.0, is_causal, scale, enable_gqa)
        ctx.save_for_backward(q, k, v, mask, out, lse)  # not ctx attributes: `out` there would be a cycle
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple:
        q, k, v, mask, out, lse = saved = ctx.saved_tensors
        grads = None
        # under create_graph (grad mode on here) only PyTorch's backward gives differentiable gradients
        if lse is not None and not torch.is_grad_enabled():
            policy = ctx.policy
            training = ops.attrs("attention_forward", ctx.is_causal, ctx.scale, ctx.enable_gqa)
            if fell_back("attention_forward", (q, k, v, mask, lse), training, policy):
                policy = without(policy, _BACKWARD_OPS, ctx.user_policy)  # its warning was given once already
            grads = ops.backward(dout, q, k, v, out, lse, mask, ctx.is_causal, ctx.scale, ctx.enable_gqa, policy)
        if grads is None:
            with using(ctx.user_policy):
                grads = _torch_grads(saved, dout, ctx)
        return (*grads, None, None, None, None)


def _traced_call(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa) -> Any:
    """Inside a graph being traced: our custom op where the compile-time decision says so, else None."""
    attrs = {"is_causal": is_causal, "scale": scale, "enable_gqa": enable_gqa}
    op, args = "attention", (q, k, v, mask)
    if has_op("attention_forward"):  # what the custom op runs first
        op, args = "attention_forward", (q, k, v, mask, lse_buffer(q))
    if in_graph(op, "attention", args, attrs, _why_not(mask, dropout_p)):
        return ops.call(q, k, v, mask, is_causal, scale, enable_gqa)
    return None


def sdpa_autograd(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
    """Autograd-key override of aten::scaled_dot_product_attention."""
    if wants("attention"):
        if plain(q, k, v, attn_mask):
            why_not = _why_not(attn_mask, dropout_p)
            if why_not is None:
                if any_requires_grad(q, k, v):
                    return AttentionFunction.apply(q, k, v, attn_mask, is_causal, scale, enable_gqa)
                out = _inference_forward(q, k, v, attn_mask, is_causal, scale, enable_gqa)
                if out is not None:
                    return out
            else:
                declined("attention", why_not, current_policy(), (q, k, v))
        elif traced(q, k, v, attn_mask):
            out = _traced_call(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
            if out is not None:
                return out
    return ops.torch_sdpa(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def sdpa_backend(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
    """Backend-key override (reached below autograd, e.g. under inference_mode): forward only."""
    if wants("attention") and plain(q, k, v, attn_mask):
        why_not = _why_not(attn_mask, dropout_p)
        if why_not is None:
            out = _inference_forward(q, k, v, attn_mask, is_causal, scale, enable_gqa)
            if out is not None:
                return out
        else:
            declined("attention", why_not, current_policy(), (q, k, v))
    return ops.torch_sdpa(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


ROUTES = {
    "attention": (
        ("scaled_dot_product_attention", "autograd", sdpa_autograd),
        ("scaled_dot_product_attention", "backend", sdpa_backend),
    ),
}
