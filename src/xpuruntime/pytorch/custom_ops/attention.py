"""`xpuruntime::attention` and `xpuruntime::attention_backward`: scaled dot-product attention through the
selector, as torch.library custom ops.

The forward op returns (out, logsumexp): `attention_forward` through the selector, else the plain
`attention` op, else PyTorch's SDPA (the logsumexp then computed in fp32). The backward op returns
(dq, dk, dv): `attention_backward` through the selector, else PyTorch's math in fp32 (fp64 for fp64
inputs). Both follow the policy in force when they run, extended to the op's family (`attention=K` names
K for `attention_forward` and `attention_backward`); the policy name `torch` means PyTorch's own kernels.

The SDPA route emits the forward op into graphs that torch.compile traces while a policy steers
attention; its registered autograd puts the backward op into the backward graph. Eager calls of the route
run `forward` / `backward` below directly, without the custom-op machinery, and so compute the same.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ...policy import KernelPolicy, current_policy
from ..router import attrs_for, dispatch, family_policy, has_op, memoized
from .common import accumulation_dtype, graph_origin, lse_buffer, unaliased

TORCH_KERNEL = "torch"  # the policy name that means "PyTorch's own kernel" for these ops
_SDPA = torch.ops.aten.scaled_dot_product_attention.default


def attrs(op: str, is_causal: bool, scale: float | None, enable_gqa: bool) -> tuple:
    """The op's attribute tuple (made once per op and values: `attrs_for` walks the schema)."""
    key = (op, is_causal, scale, type(scale), enable_gqa)
    values = {"is_causal": is_causal, "scale": scale, "enable_gqa": enable_gqa}
    return memoized(key, lambda: attrs_for(op, values))


def torch_sdpa(q, k, v, mask, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False) -> Tensor:
    """PyTorch's own SDPA (its composite: never the route again)."""
    return _SDPA.decompose(q, k, v, mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)


def forward(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, scale: float | None, enable_gqa: bool,
    policy: KernelPolicy, routed: bool = True,
) -> tuple[Tensor | None, Tensor | None]:  # fmt: skip
    """(out, logsumexp) from `attention_forward`; (out, None) from the plain `attention` op where the
    training forward cannot run; (None, None) where no kernel of ours can (PyTorch's SDPA then runs)."""
    if has_op("attention_forward"):
        lse = lse_buffer(q)
        training = attrs("attention_forward", is_causal, scale, enable_gqa)
        out = dispatch("attention_forward", (q, k, v, mask, lse), training, False, policy, routed)
        if out is not None:  # warn=False: the plain op below warns when it cannot run the call either
            return out, lse
    if enable_gqa and q.shape[-3] != k.shape[-3]:
        return None, None  # the plain attention op has no grouped-query form
    plain_attrs = attrs("attention", is_causal, scale, enable_gqa)
    return dispatch("attention", (q, k, v, mask), plain_attrs, policy=policy, routed=routed), None


def backward(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, mask: Tensor | None, is_causal: bool,
    scale: float | None, enable_gqa: bool, policy: KernelPolicy, routed: bool = True,
) -> tuple | None:  # fmt: skip
    """(dq, dk, dv) from `attention_backward`, or None where no kernel of ours can take the call."""
    if not has_op("attention_backward"):
        return None
    args = (dout, q, k, v, out, lse, mask)
    backward_attrs = attrs("attention_backward", is_causal, scale, enable_gqa)
    packed = dispatch("attention_backward", args, backward_attrs, policy=policy, routed=routed)
    if packed is None:
        return None
    if isinstance(packed, list | tuple):  # a returns_output kernel's own fresh tensors, passed on as they are
        return tuple(packed[:3])
    parts = packed.split((q.numel(), k.numel(), v.numel()))  # views of the flat [dq | dk | dv] array
    return parts[0].view(q.shape), parts[1].view(k.shape), parts[2].view(v.shape)


# -- PyTorch's math, for the custom ops where no kernel of ours runs --------------------------------------


def _grouped(q: Tensor, t: Tensor, enable_gqa: bool) -> Tensor:
    """k or v with each head repeated for its query group (grouped-query attention), else as it is."""
    if enable_gqa and t.dim() >= 3 and t.shape[-3] != q.shape[-3]:
        return t.repeat_interleave(q.shape[-3] // t.shape[-3], dim=-3)
    return t


def _scores(q: Tensor, k: Tensor, mask: Tensor | None, is_causal: bool, scale: float | None) -> Tensor:
    """Scaled, masked attention scores in fp32 (fp64 for fp64 inputs)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    dtype = accumulation_dtype(q)
    scores = torch.matmul(q.to(dtype), k.to(dtype).transpose(-1, -2)) * scale
    if is_causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        return scores.masked_fill(~keep, float("-inf"))
    if mask is not None:
        return scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.to(dtype)
    return scores


def logsumexp(q: Tensor, k: Tensor, mask: Tensor | None, is_causal: bool, scale: float | None,
              enable_gqa: bool = False) -> Tensor:  # fmt: skip
    return torch.logsumexp(_scores(q, _grouped(q, k, enable_gqa), mask, is_causal, scale), dim=-1)


def math_grads(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, mask: Tensor | None, is_causal: bool,
    scale: float | None, enable_gqa: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """Gradients of softmax(q kᵀ·scale + mask) v in fp32 (fp64 for fp64 inputs) from the saved output."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    dtype = accumulation_dtype(q)
    kg, vg = _grouped(q, k, enable_gqa), _grouped(q, v, enable_gqa)
    qf, kf, vf, dof = q.to(dtype), kg.to(dtype), vg.to(dtype), dout.to(dtype)
    p = torch.softmax(_scores(q, kg, mask, is_causal, scale), dim=-1)
    dv = torch.matmul(p.transpose(-1, -2), dof)
    dp = torch.matmul(dof, vf.transpose(-1, -2))
    ds = p * (dp - (dof * out.to(dtype)).sum(-1, keepdim=True))
    dq = torch.matmul(ds, kf) * scale
    dk = torch.matmul(ds.transpose(-1, -2), qf) * scale
    return dq.sum_to_size(q.shape).to(q.dtype), _ungrouped(dk, k).to(k.dtype), _ungrouped(dv, v).to(v.dtype)


def _ungrouped(grad: Tensor, like: Tensor) -> Tensor:
    """A gradient over repeated heads summed back onto the heads it repeated (and broadcast dims)."""
    if grad.dim() >= 3 and like.dim() >= 3 and grad.shape[-3] != like.shape[-3] and like.shape[-3]:
        group = grad.shape[-3] // like.shape[-3]
        grad = grad.unflatten(-3, (like.shape[-3], group)).sum(-3)
    return grad.sum_to_size(like.shape)


# -- the custom ops ----------------------------------------------------------------------------------


def _wants_torch() -> bool:
    return current_policy().preferences.get("attention") == TORCH_KERNEL


@torch.library.custom_op("xpuruntime::attention", mutates_args=())
def attention_op(
    query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None, is_causal: bool, scale: float | None,
    enable_gqa: bool,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """(out, logsumexp) of F.scaled_dot_product_attention(query, key, value, attn_mask, 0.0, is_causal, scale,
    enable_gqa) through the selector."""
    with graph_origin():
        out = lse = None
        if not _wants_torch():
            policy = family_policy(current_policy())
            out, lse = forward(query, key, value, attn_mask, is_causal, scale, enable_gqa, policy, routed=False)
        if out is None:
            out = torch_sdpa(query, key, value, attn_mask, 0.0, is_causal, scale, enable_gqa)
        if lse is None:
            lse = logsumexp(query, key, attn_mask, is_causal, scale, enable_gqa)
        return unaliased((out, lse))  # contiguous, as the fake says (inductor checks strides)


@attention_op.register_fake
def _(query, key, value, attn_mask, is_causal, scale, enable_gqa):
    batch = query.shape[:-2] if enable_gqa else torch.broadcast_shapes(query.shape[:-2], key.shape[:-2])
    out = query.new_empty((*batch, query.shape[-2], value.shape[-1]))
    return out, query.new_empty((*batch, query.shape[-2]), dtype=accumulation_dtype(query))


@torch.library.custom_op("xpuruntime::attention_backward", mutates_args=())
def attention_backward_op(
    dout: Tensor, query: Tensor, key: Tensor, value: Tensor, out: Tensor, lse: Tensor, attn_mask: Tensor | None,
    is_causal: bool, scale: float | None, enable_gqa: bool,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """(dq, dk, dv): `attention_backward` through the selector, else PyTorch's math in fp32."""
    with graph_origin():
        if not _wants_torch():
            policy = family_policy(current_policy())
            grads = backward(dout, query, key, value, out, lse, attn_mask, is_causal, scale, enable_gqa, policy, False)
            if grads is not None:  # views of one packed array alias each other, which a custom op may not return
                return unaliased(grads)
        return unaliased(math_grads(dout, query, key, value, out, attn_mask, is_causal, scale, enable_gqa))


@attention_backward_op.register_fake
def _(dout, query, key, value, out, lse, attn_mask, is_causal, scale, enable_gqa):
    return query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape)


def _setup(ctx, inputs, output) -> None:
    query, key, value, attn_mask, is_causal, scale, enable_gqa = inputs
    out, lse = output
    ctx.save_for_backward(query, key, value, out, lse, *(() if attn_mask is None else (attn_mask,)))
    ctx.is_causal, ctx.scale, ctx.enable_gqa = is_causal, scale, enable_gqa


def _backward(ctx, dout, dlse):
    """Gradients for (query, key, value); the logsumexp output carries none."""
    query, key, value, out, lse, *mask = ctx.saved_tensors
    mask = mask[0] if mask else None
    grads = attention_backward_op(
        dout.contiguous(), query, key, value, out, lse, mask, ctx.is_causal, ctx.scale, ctx.enable_gqa
    )
    return (*grads, None, None, None, None)


attention_op.register_autograd(_backward, setup_context=_setup)


def call(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, scale: float | None,
         enable_gqa: bool) -> Tensor:  # fmt: skip
    """The forward op's output (what a route emits into a traced graph)."""
    return torch.ops.xpuruntime.attention(q, k, v, mask, bool(is_causal), scale, bool(enable_gqa))[0]
