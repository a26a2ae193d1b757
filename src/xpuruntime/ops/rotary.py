"""rotary_embedding(q, k, cos, sin, position_ids=None, unsqueeze_dim=1, interleaved=False) -> (q_embed, k_embed).

Hugging Face's `apply_rotary_pos_emb`: x_embed = x * cos + rotate(x) * sin over the first R = cos.shape[-1]
dims of each head (R <= head_dim, even; the dims after R pass through unchanged: partial rotary, as GPT-NeoX,
Phi and StableLM use it), for q and k in one call.
- Layout: rotate-half (Llama, `interleaved=False`): rotate(x) = [-x2, x1] for the halves x1, x2 of the R dims;
  interleaved (GPT-J, `interleaved=True`): rotate(x) pairs dims (2i, 2i+1) as (-x[2i+1], x[2i]).
- cos and sin (same shape) carry R values per position, as HF's rotary modules return them: shape (B or 1,
  S, R). They are unsqueezed at `unsqueeze_dim` (HF: 1 for q of shape (B, H, S, D), 2 for (B, S, H, D)) and
  broadcast against q's and k's leading dims, which may differ only along that axis (GQA: k has fewer heads).
- With `position_ids` (integers, e.g. (B, S)), cos and sin are tables (P, R) and each position reads row
  cos[position_ids] first (the older HF signature). A position outside [0, P) gives NaN in its rows
  (a kernel cannot raise; NaN cannot pass unnoticed).
q and k are 3-d or 4-d with the same head_dim and dtype; cos and sin share a floating dtype, which may differ
from q's. Math is fp32 (float64 for float64), results in q's dtype. When q and cos are both float16 or both
bfloat16, each product and the sum are rounded to that dtype, as PyTorch's eager formula computes them, so
that results match the unfused module's. (HF's result has the dtype q and cos promote to: fp32 for bf16 q and
fp32 cos under autocast, which the attention after it casts back to bf16; here it is bf16 at once.)

The kernel ABI has one output per op: one flat array in q's dtype packing [q_embed | k_embed], each
C-contiguous in its input's shape; the front end returns views. Backward: ops/rotary_backward.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..abi import INT_DTYPES
from ..context import DispatchContext
from ..dispatch import run
from ..errors import ArgumentError, DTypeError, ShapeError, argument_error
from ..schema import OpSchema
from .checks import int_attribute, numel, require_dtype_like, require_float, stored_as

__all__ = ["rotary_embedding"]


def _unsqueeze_axis(ctx: DispatchContext, ndim: int) -> int:
    """unsqueeze_dim for cos of `ndim` dims (rotary dim last) as a non-negative axis, which must land before
    the rotary dim (torch.unsqueeze's range less its last position)."""
    axis = int_attribute(ctx, "unsqueeze_dim")
    if not (-(ndim + 1) <= axis <= -2 or 0 <= axis < ndim):
        raise argument_error(ShapeError, ctx.op, "unsqueeze_dim", f"a value in [{-(ndim + 1)}, -2] or [0, {ndim - 1}]"
                             f" for cos of {ndim} dims (the new axis before the rotary dim)", axis)  # fmt: skip
    return axis % (ndim + 1)


def _check_cos_sin(ctx: DispatchContext, head_dim: int) -> int:
    cos, sin = ctx.tensor("cos"), ctx.tensor("sin")
    if sin.shape != cos.shape:
        raise argument_error(ShapeError, ctx.op, "sin", f"shape {cos.shape} (that of cos)", sin.shape)
    if cos.ndim < 1:
        raise argument_error(ShapeError, ctx.op, "cos", "at least 1 dimension", "0-d")
    rotary = cos.shape[-1]
    if rotary % 2 or not 0 < rotary <= head_dim:
        raise argument_error(ShapeError, ctx.op, "cos", f"an even last dimension in [2, {head_dim}] (q's head_dim)",
                             f"shape {cos.shape}")  # fmt: skip
    return rotary


def _leading_shape(ctx: DispatchContext) -> tuple[tuple[int, ...], int]:
    """(the leading shape of cos once gathered and unsqueezed, the new axis' index in it)."""
    cos = ctx.tensor("cos").shape
    if ctx.has_tensor("position_ids"):
        if len(cos) != 2:
            raise argument_error(ShapeError, ctx.op, "cos", "a 2-d table (positions, rotary_dim) with position_ids",
                                 f"shape {cos}")  # fmt: skip
        gathered = ctx.tensor("position_ids").shape
    else:
        gathered = cos[:-1]
    axis = _unsqueeze_axis(ctx, len(gathered) + 1)
    return (*gathered[:axis], 1, *gathered[axis:]), axis


def _broadcast_leading(ctx: DispatchContext, lead: tuple[int, ...], name: str) -> None:
    x = ctx.tensor(name).shape[:-1]
    ok = len(lead) <= len(x) and all(c in (1, n) for c, n in zip(lead[::-1], x[::-1]))
    if not ok:
        raise argument_error(ShapeError, ctx.op, name, f"leading dims that cos {lead} (unsqueezed) broadcasts to",
                             f"shape {ctx.tensor(name).shape}")  # fmt: skip


def normalize_rotary(ctx: DispatchContext, x_name: str, y_name: str) -> dict[str, Any]:
    """Shapes of q and k (or of their gradients), cos, sin and position_ids; the kernels' axis plan."""
    q, k = ctx.tensor(x_name).shape, ctx.tensor(y_name).shape
    if len(q) not in (3, 4):
        raise argument_error(ShapeError, ctx.op, x_name, "3 or 4 dimensions (..., heads or seq, head_dim)", q)
    if len(k) != len(q) or k[-1] != q[-1]:
        raise argument_error(ShapeError, ctx.op, y_name, f"{len(q)} dims and head_dim {q[-1]} like {x_name}", k)
    rotary = _check_cos_sin(ctx, q[-1])
    lead, axis = _leading_shape(ctx)
    for name in (x_name, y_name):
        _broadcast_leading(ctx, lead, name)
    head_axis = 4 - 1 - len(lead) + axis  # in the 4-d view (leading 1s added) of q and k
    if head_axis < 0:
        raise argument_error(ShapeError, ctx.op, "unsqueeze_dim", f"an axis within {x_name}'s dims", axis)
    q4, k4 = (1,) * (4 - len(q)) + q, (1,) * (4 - len(k)) + k
    tokens = tuple(a for a in range(3) if a != head_axis)
    if any(q4[a] != k4[a] for a in tokens):
        raise argument_error(ShapeError, ctx.op, y_name, f"{x_name}'s shape {q} except along the heads axis "
                             f"(where cos is unsqueezed)", f"shape {k}")  # fmt: skip
    interleaved = ctx.attrs["interleaved"]
    if not isinstance(interleaved, bool | np.bool_):
        raise argument_error(ArgumentError, ctx.op, "interleaved", "True or False", repr(interleaved))
    return {"unsqueeze_dim": axis, "interleaved": bool(interleaved), "rotary_dim": rotary, "head_dim": q[-1],
            "head_axis": head_axis, "token_axes": tokens, "sizes": (numel(q), numel(k))}  # fmt: skip


def rotary_dtype(ctx: DispatchContext, x_name: str, y_name: str) -> str:
    dtype = require_float(ctx, x_name)
    require_dtype_like(ctx, y_name, x_name)
    require_float(ctx, "cos")
    require_dtype_like(ctx, "sin", "cos")
    if ctx.has_tensor("position_ids") and ctx.tensor("position_ids").dtype not in INT_DTYPES:
        raise argument_error(DTypeError, ctx.op, "position_ids", "an integer dtype",
                             ctx.tensor("position_ids").dtype)  # fmt: skip
    return dtype


def effective(table: Any, position_ids: Any, unsqueeze_dim: int) -> np.ndarray:
    """cos or sin as HF applies it: rows gathered by position_ids (NaN where a position is out of range),
    then unsqueezed at unsqueeze_dim, in float64."""
    t = np.asarray(table, np.float64)
    if position_ids is not None:
        pos = np.asarray(position_ids).astype(np.int64)
        valid = (pos >= 0) & (pos < t.shape[0])
        t = np.where(valid[..., None], t[np.where(valid, pos, 0)], np.nan)
    return np.expand_dims(t, unsqueeze_dim)


def rotated(x: np.ndarray, interleaved: bool) -> np.ndarray:
    """rotate_half(x) (interleaved=False) or rotate_every_two(x) of the last dim."""
    if interleaved:
        return np.stack([-x[..., 1::2], x[..., 0::2]], axis=-1).reshape(x.shape)
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def rotate_reference(x: Any, cos: np.ndarray, sin: np.ndarray, interleaved: bool, rounds: Any) -> np.ndarray:
    """x * cos + rotate(x) * sin over the rotary dims (float64; each step stored as `rounds`' dtype, which
    is float64 unless PyTorch's eager form rounds there), the rest of x as is."""
    x64 = np.asarray(x, np.float64)
    r = cos.shape[-1]
    part = x64[..., :r]
    with np.errstate(invalid="ignore"):
        y = stored_as(stored_as(part * cos, rounds) + stored_as(rotated(part, interleaved) * sin, rounds), rounds)
    return np.concatenate([y, x64[..., r:]], axis=-1)


def eager_rounding(q: Any, cos: Any) -> Any:
    """An array of the dtype PyTorch's eager formula rounds each step to: q's when q and cos are the same half
    dtype, else float64 (no rounding beyond fp32 math)."""
    q_dtype, cos_dtype = np.asarray(q).dtype, np.asarray(cos).dtype
    return np.empty(0, q_dtype if q_dtype == cos_dtype and q_dtype == np.float16 else np.float64)


def reference(
    q: Any, k: Any, cos: Any, sin: Any, position_ids: Any = None, unsqueeze_dim: int = 1, interleaved: bool = False
) -> np.ndarray:
    """float64 reference of the packed output [q_embed | k_embed]."""
    c, s = (effective(t, position_ids, unsqueeze_dim) for t in (cos, sin))
    rounds = eager_rounding(q, cos)
    return np.concatenate([rotate_reference(x, c, s, interleaved, rounds).reshape(-1) for x in (q, k)])


ROTARY_EMBEDDING = OpSchema(
    name="rotary_embedding",
    inputs=("q", "k", "cos", "sin", "position_ids"),
    optional=frozenset({"position_ids"}),
    attrs=("unsqueeze_dim", "interleaved"),
    defaults={"unsqueeze_dim": 1, "interleaved": False},
    normalize_attrs=lambda ctx: normalize_rotary(ctx, "q", "k"),
    infer_dtype=lambda ctx: rotary_dtype(ctx, "q", "k"),
    infer_shape=lambda ctx: (sum(ctx.attrs["sizes"]),),
    reference=reference,
    flops=lambda ctx: 3 * sum(ctx.attrs["sizes"]) * ctx.attrs["rotary_dim"] // ctx.attrs["head_dim"],
    doc="HF apply_rotary_pos_emb on q and k: [q_embed | k_embed] packed flat (rotate-half or interleaved).",
)


def split(packed: Any, q_shape: tuple[int, ...], k_shape: tuple[int, ...]) -> tuple[Any, Any]:
    """(q part, k part) views of a packed [q | k] result, shaped like q and k."""
    a = numel(q_shape)
    return packed[:a].reshape(q_shape), packed[a : a + numel(k_shape)].reshape(k_shape)


def rotary_embedding(
    q: Any, k: Any, cos: Any, sin: Any, position_ids: Any = None, unsqueeze_dim: int = 1, interleaved: bool = False,
    *, out: Any = None,
) -> tuple[Any, Any]:  # fmt: skip
    """(q_embed, k_embed): HF's apply_rotary_pos_emb(q, k, cos, sin, position_ids, unsqueeze_dim), in one
    launch; `out` is an optional packed buffer (the results are then views of it)."""
    packed = run("rotary_embedding", (q, k, cos, sin, position_ids), (unsqueeze_dim, interleaved), out)
    return split(packed, tuple(np.shape(q)), tuple(np.shape(k)))
