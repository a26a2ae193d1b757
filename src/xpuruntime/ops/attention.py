"""attention(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False, *, bounded_mask=False) with
F.scaled_dot_product_attention's semantics: q (..., L, E), k (..., S, E), v (..., S, Ev) -> (..., L, Ev); batch
dims broadcast; a bool mask keeps True positions, a float mask is added to the scores; causal masking is aligned
top-left. With enable_gqa=True, k and v may have fewer heads (axis -3, dividing q's; their other batch dims are
q's): query head h reads key/value head h // (Hq // Hk) (grouped-query attention, as SDPA's enable_gqa).
A query row that can see no key gives NaN (PyTorch's math backend gave NaN before 2.5, 0 since).

bounded_mask=True is the caller's promise that a float mask holds no value below `mask_floor(dtype)` (half the
dtype's lowest; so no -inf, no row that sees no key): kernels then skip scanning the mask for such rows and for
values their exp2 would overflow (two passes over the mask a call). A mask that breaks the promise may give wrong
rows. The ONNX attention fusion gives it for Hugging Face's Where(keep, 0, finfo.min) masks, raising the fill to
the floor (which changes no result: exp of so low a value is 0 beside a kept key, and equal fills average)."""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from ..context import DispatchContext
from ..dispatch import run
from ..errors import ArgumentError, DTypeError, ShapeError, argument_error, clip
from ..schema import OpSchema
from .checks import broadcast, finite_float, require_dtype_like, require_float, require_ndim


def check_qkv(ctx: DispatchContext) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """q (..., L, E), k (..., S, E), v (..., S, Ev) with E >= 1: their shapes, or an error naming the argument."""
    for name in ("q", "k", "v"):
        require_ndim(ctx, name, 2)
    q, k, v = (ctx.tensor(n).shape for n in ("q", "k", "v"))
    if k[-1] != q[-1]:
        raise argument_error(ShapeError, ctx.op, "k", f"last dim {q[-1]} (the head dim E of 'q')", f"shape {k}")
    if v[-2] != k[-2]:
        raise argument_error(ShapeError, ctx.op, "v", f"{k[-2]} rows (the sequence length S of 'k')", f"shape {v}")
    if q[-1] == 0:
        raise argument_error(ShapeError, ctx.op, "q", "a head dim E >= 1", f"shape {q}")
    if k[-2] == 0 and q[-2] > 0:
        raise argument_error(
            ShapeError, ctx.op, "k", "at least one key (softmax over no keys is undefined)", f"shape {k}"
        )
    return q, k, v


def check_bool(ctx: DispatchContext, name: str) -> bool:
    value = ctx.attrs[name]
    if not isinstance(value, bool | np.bool_):
        raise argument_error(ArgumentError, ctx.op, name, "a bool", repr(value))
    return bool(value)


def check_mask_and_scale(ctx: DispatchContext, batch: tuple[int, ...], is_causal: bool) -> float:
    """The mask must broadcast to the scores (*batch, L, S) and not come with is_causal; returns the scale
    (1/sqrt(E) when None)."""
    q, k = ctx.tensor("q").shape, ctx.tensor("k").shape
    L, S = q[-2], k[-2]
    if is_causal and ctx.has_tensor("attn_mask"):
        raise ArgumentError(f"{ctx.op}: pass either 'attn_mask' or is_causal=True, not both")
    if ctx.has_tensor("attn_mask"):
        mask = ctx.tensor("attn_mask").shape
        if broadcast(ctx.op, [("scores", (*batch, L, S)), ("attn_mask", mask)]) != (*batch, L, S):
            raise argument_error(ShapeError, ctx.op, "attn_mask", f"a shape broadcastable to {(*batch, L, S)}", mask)
    scale = ctx.attrs["scale"]
    if scale is None:
        return 1.0 / math.sqrt(q[-1])
    return finite_float(ctx.op, "scale", scale, "a finite number or None")


def check_dtypes(ctx: DispatchContext) -> str:
    """q, k, v of one float dtype; the mask bool or that dtype. Returns the dtype."""
    dtype = require_float(ctx, "q")
    require_dtype_like(ctx, "k", "q")
    require_dtype_like(ctx, "v", "q")
    if ctx.has_tensor("attn_mask"):
        mask = ctx.tensor("attn_mask").dtype
        if mask not in ("bool", dtype):
            raise argument_error(DTypeError, ctx.op, "attn_mask", f"bool or {dtype} (same as 'q')", mask)
    return dtype


def _kv_batch_ok(q_batch: tuple[int, ...], kv_batch: tuple[int, ...], gqa: bool) -> bool:
    """k's or v's batch dims are q's, or with `gqa` differ only in a heads axis (-3 of the array) dividing q's."""
    if kv_batch == q_batch:
        return True
    if not gqa or len(q_batch) == 0 or len(kv_batch) != len(q_batch) or kv_batch[:-1] != q_batch[:-1]:
        return False
    return kv_batch[-1] > 0 and q_batch[-1] % kv_batch[-1] == 0


def check_kv_batch(ctx: DispatchContext, q: tuple, k: tuple, v: tuple, gqa: bool) -> None:
    """k's and v's batch dims are q's (with `gqa`, but for fewer heads dividing q's), v's those of k, or an error
    naming the argument."""
    batch = q[:-2]
    for name, shape in (("k", k), ("v", v)):
        if not _kv_batch_ok(batch, shape[:-2], gqa):
            extra = " (or, with enable_gqa=True, a heads axis -3 dividing q's)" if len(batch) else ""
            raise argument_error(ShapeError, ctx.op, name, f"batch dims {batch} like 'q'{extra}", f"shape {shape}")
    if v[:-2] != k[:-2]:
        raise argument_error(ShapeError, ctx.op, "v", f"batch dims {k[:-2]} (those of 'k')", f"shape {v}")


def expand_heads(x: np.ndarray, group: int) -> np.ndarray:
    """k or v with each head repeated `group` times along axis -3 (GQA), as enable_gqa does."""
    return x if group == 1 else np.repeat(x, group, axis=-3)


def mask_floor(dtype: str) -> float:
    """The lowest value a bounded_mask may hold: half the float dtype's lowest finite value."""
    lowest = -3.3895313892515355e38 if dtype == "bfloat16" else float(np.finfo(dtype).min)
    return lowest / 2


def _normalize_attrs(ctx: DispatchContext) -> dict[str, Any]:
    q, k, v = check_qkv(ctx)
    gqa = check_bool(ctx, "enable_gqa")
    bounded = check_bool(ctx, "bounded_mask")
    grouped = gqa and len(q) >= 3 and len(k) == len(q) and k[-3] != q[-3]
    if grouped:
        check_kv_batch(ctx, q, k, v, True)
        batch = q[:-2]
    else:
        batch = broadcast(ctx.op, [("q", q[:-2]), ("k", k[:-2]), ("v", v[:-2])])
    is_causal = check_bool(ctx, "is_causal")
    scale = check_mask_and_scale(ctx, batch, is_causal)
    return {"is_causal": is_causal, "scale": scale, "enable_gqa": gqa, "bounded_mask": bounded, "batch": batch,
            "L": q[-2], "S": k[-2], "group": q[-3] // k[-3] if grouped else 1}  # fmt: skip


def _infer_shape(ctx: DispatchContext) -> tuple[int, ...]:
    return (*ctx.attrs["batch"], ctx.attrs["L"], ctx.tensor("v").shape[-1])


def flops(ctx: DispatchContext) -> int:
    at = ctx.attrs
    e, ev = ctx.tensor("q").shape[-1], ctx.tensor("v").shape[-1]
    return 2 * math.prod(at["batch"]) * at["L"] * at["S"] * (e + ev)


def causal_mask(L: int, S: int) -> np.ndarray:
    """True where query i may see key j (j <= i), aligned top-left as in PyTorch."""
    return np.tril(np.ones((L, S), dtype=bool))


def reference(
    q: Any, k: Any, v: Any, attn_mask: Any = None, is_causal: bool = False, scale: float | None = None,
    enable_gqa: bool = False, bounded_mask: bool = False,
) -> np.ndarray:  # fmt: skip
    """float64 reference (bounded_mask is a promise about the mask that changes no result)."""
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    if enable_gqa and q.ndim >= 3 and k.ndim == q.ndim and k.shape[-3] != q.shape[-3]:
        k, v = (expand_heads(t, q.shape[-3] // k.shape[-3]) for t in (k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
    if is_causal:
        attn_mask = causal_mask(q.shape[-2], k.shape[-2])
    if attn_mask is not None:
        attn_mask = np.asarray(attn_mask)
        scores = np.where(attn_mask, scores, -np.inf) if attn_mask.dtype == bool else scores + attn_mask
    with np.errstate(invalid="ignore"):
        p = np.exp(scores - scores.max(axis=-1, keepdims=True, initial=-np.inf))  # initial: S == 0
        p /= p.sum(axis=-1, keepdims=True)
    return np.matmul(p, v)


ATTENTION = OpSchema(
    name="attention",
    inputs=("q", "k", "v", "attn_mask"),
    optional=frozenset({"attn_mask"}),
    attrs=("is_causal", "scale", "enable_gqa", "bounded_mask"),
    defaults={"is_causal": False, "scale": None, "enable_gqa": False, "bounded_mask": False},
    normalize_attrs=_normalize_attrs,
    infer_dtype=check_dtypes,
    infer_shape=_infer_shape,
    reference=reference,
    flops=flops,
    doc="Scaled dot-product attention (softmax(q k^T * scale + mask) v).",
)


def attention(
    q: Any, k: Any, v: Any, attn_mask: Any = None, dropout_p: float = 0.0, is_causal: bool = False,
    scale: float | None = None, enable_gqa: bool = False, *, bounded_mask: bool = False, out: Any = None,
) -> Any:  # fmt: skip
    """Scaled dot-product attention with F.scaled_dot_product_attention's arguments; dropout_p must be 0
    (inference semantics: apply dropout outside the op). bounded_mask: see the module's docstring."""
    if not isinstance(dropout_p, numbers.Real) or isinstance(dropout_p, bool) or dropout_p != 0.0:
        raise argument_error(ArgumentError, "attention", "dropout_p", "0.0 (dropout is not supported)", clip(dropout_p))
    return run("attention", (q, k, v, attn_mask), (is_causal, scale, enable_gqa, bounded_mask), out)
