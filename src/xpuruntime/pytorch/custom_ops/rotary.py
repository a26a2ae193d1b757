"""`xpuruntime::rotary_embedding` and its backward op: Hugging Face's apply_rotary_pos_emb on q and k in one
launch through the selector, as torch.library custom ops.

Forward: the `rotary_embedding` op (rotate-half or interleaved layout, position_ids tables, partial rotary
dims), else HF's formula in PyTorch. Backward: `rotary_embedding_backward`, else the formula's transpose.
Only cos, sin and position_ids are saved: the rotation is linear. cos and sin carry no gradient (HF computes them
from buffers without one). Results have q's dtype; HF's have the dtype q and cos promote to (fp32 for bf16 q and
fp32 cos under autocast), which the attention after them casts back to q's: the values are the same.
No autocast casting (PyTorch's autocast leaves these products alone). See `eager` for the two paths.

The op's kernels write one packed [q_embed | k_embed] buffer; eager calls return views of it, while the custom op
returns copies of them (custom-op outputs must not share memory).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ...backends.torch.rotary import rotation, table
from ...policy import KernelPolicy
from ..router import IN_FORCE, Pinned, dispatch, pinned_policy
from .common import pytorch_ran, unaliased
from .eager import OpGlue, backward_call, custom_op_body, run
from .inline import fused_custom_op


def formula(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, position_ids: Tensor | None, unsqueeze_dim: int,
            interleaved: bool, backward: bool = False) -> tuple[Tensor, Tensor]:  # fmt: skip
    """HF's apply_rotary_pos_emb in PyTorch, results in q's and k's dtypes (backward: its transpose, for the
    gradients of q_embed and k_embed)."""
    c, s = (table(t, position_ids, unsqueeze_dim) for t in (cos, sin))
    return rotation(q, c, s, interleaved, backward), rotation(k, c, s, interleaved, backward)


def _split(packed: Tensor, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
    return packed[: q.numel()].view(q.shape), packed[q.numel() :].view(k.shape)


def forward(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, position_ids: Tensor | None, unsqueeze_dim: int,
            interleaved: bool, policy: KernelPolicy) -> tuple[Tensor, Tensor]:  # fmt: skip
    packed = dispatch("rotary_embedding", (q, k, cos, sin, position_ids), (unsqueeze_dim, interleaved),
                      policy=policy, routed=False)  # fmt: skip
    if packed is None:
        pytorch_ran("rotary_embedding", q, k, cos)
        return formula(q, k, cos, sin, position_ids, unsqueeze_dim, interleaved)
    return _split(packed, q, k)


def backward(dq: Tensor, dk: Tensor, cos: Tensor, sin: Tensor, position_ids: Tensor | None, unsqueeze_dim: int,
             interleaved: bool, policy: KernelPolicy) -> tuple[Tensor, Tensor]:  # fmt: skip
    """(grad_q, grad_k) for the gradients dq of q_embed and dk of k_embed."""
    inputs = (dq, dk, cos, sin, position_ids)
    packed = dispatch("rotary_embedding_backward", inputs, (unsqueeze_dim, interleaved), policy=policy, routed=False)
    if packed is None:
        pytorch_ran("rotary_embedding_backward", dq, dk, cos)
        return formula(dq, dk, cos, sin, position_ids, unsqueeze_dim, interleaved, backward=True)
    return _split(packed, dq, dk)


# -- the custom ops ----------------------------------------------------------------------------------


@fused_custom_op("xpuruntime::rotary_embedding")
def rotary_embedding_op(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, position_ids: Tensor | None, unsqueeze_dim: int,
    interleaved: bool, policy: str,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """(q_embed, k_embed): HF's apply_rotary_pos_emb(q, k, cos, sin, position_ids, unsqueeze_dim)."""
    with custom_op_body():
        return unaliased(forward(q, k, cos, sin, position_ids, unsqueeze_dim, interleaved, pinned_policy(policy)))


@fused_custom_op("xpuruntime::rotary_embedding_backward")
def rotary_embedding_backward_op(
    dq: Tensor, dk: Tensor, cos: Tensor, sin: Tensor, position_ids: Tensor | None, unsqueeze_dim: int,
    interleaved: bool, policy: str,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """(grad_q, grad_k) of rotary_embedding."""
    with custom_op_body():
        return unaliased(backward(dq, dk, cos, sin, position_ids, unsqueeze_dim, interleaved, pinned_policy(policy)))


@rotary_embedding_op.register_fake
def _(q, k, cos, sin, position_ids, unsqueeze_dim, interleaved, policy):
    return q.new_empty(q.shape), k.new_empty(k.shape)


@rotary_embedding_backward_op.register_fake
def _(dq, dk, cos, sin, position_ids, unsqueeze_dim, interleaved, policy):
    return dq.new_empty(dq.shape), dk.new_empty(dk.shape)


def _setup(ctx: Any, inputs: tuple, output: Any) -> None:
    q, k, cos, sin, position_ids, unsqueeze_dim, interleaved, policy = inputs
    ctx.save_for_backward(cos, sin, position_ids)
    ctx.unsqueeze_dim, ctx.interleaved, ctx.policy = unsqueeze_dim, interleaved, policy
    ctx.like = ((q.shape, q.dtype), (k.shape, k.dtype), q.device)  # for an unused output's zeros


def _backward(ctx: Any, dq: Tensor | None, dk: Tensor | None) -> tuple:
    cos, sin, position_ids = ctx.saved_tensors
    device = ctx.like[2]
    dq, dk = (torch.zeros(shape, dtype=dtype, device=device) if d is None else d.contiguous()
              for d, (shape, dtype) in zip((dq, dk), ctx.like))  # fmt: skip
    attrs = (cos, sin, position_ids, ctx.unsqueeze_dim, ctx.interleaved)
    grad_q, grad_k = backward_call(ctx, backward, rotary_embedding_backward_op, dq, dk, *attrs)
    return grad_q, grad_k, None, None, None, None, None, None


rotary_embedding_op.register_autograd(_backward, setup_context=_setup)
ROTARY_EMBEDDING = OpGlue(rotary_embedding_op, forward, _setup, _backward)


def rotary_embedding(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, position_ids: Tensor | None = None, unsqueeze_dim: int = 1,
    interleaved: bool = False, pinned: Pinned = IN_FORCE,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """(q_embed, k_embed) = HF's apply_rotary_pos_emb(q, k, cos, sin, position_ids, unsqueeze_dim) through the
    selector, forward and backward, q and k in one launch each way."""
    return run(ROTARY_EMBEDDING, (q, k, cos, sin, position_ids, int(unsqueeze_dim), bool(interleaved)), pinned)
