"""attention_forward: attention that also returns the logsumexp backward needs (the training forward).

`attention_forward(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False)` returns
`(out, lse)`: `out` as `attention` computes it, `lse` (shape (*batch, L)) the natural-log logsumexp of
each row of scaled, masked scores. A row that sees no key gets out = NaN (as the `attention` op) and
lse = +inf, so `attention_backward` gives it no gradient.

The lse dtype (`lse_dtype`): float32, except float64 for float64 inputs, so that float64 gradients keep
float64 precision (a float32 lse rounds every P = exp(S - lse) of the backward by ~1e-7). A float32 lse is
still accepted with float64 inputs (callers that allocate float32 whatever the inputs).

The kernel ABI has one output per op, so the op's output is `out` and `lse` is an input buffer that the
kernel fills (contiguous, shape (*batch, L)); the front end allocates it. Unlike `attention`,
k and v must have q's batch dims (no broadcasting), except that with enable_gqa=True their heads axis
(-3) may divide q's (grouped-query attention: query head h reads key/value head h // (Hq // Hk)).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import numpy as np

from ..abi import itemsize
from ..arrays import as_array, is_torch_tensor
from ..context import DispatchContext
from ..dispatch import run
from ..errors import DTypeError, ShapeError, argument_error
from ..runtime.capacity import check_fits
from ..schema import OpSchema
from .attention import (
    causal_mask,
    check_bool,
    check_dtypes,
    check_kv_batch,
    check_mask_and_scale,
    check_qkv,
    expand_heads,
)


def normalize_training_attrs(ctx: DispatchContext) -> dict[str, Any]:
    """Shapes, mask, causal flag, scale and GQA grouping shared by attention_forward and attention_backward."""
    q, k, v = check_qkv(ctx)
    gqa = check_bool(ctx, "enable_gqa")
    batch = q[:-2]
    check_kv_batch(ctx, q, k, v, gqa)
    is_causal = check_bool(ctx, "is_causal")
    scale = check_mask_and_scale(ctx, batch, is_causal)
    group = batch[-1] // k[-3] if len(batch) and k[-3] else 1
    return {"is_causal": is_causal, "scale": scale, "enable_gqa": gqa, "batch": batch, "L": q[-2], "S": k[-2],
            "group": group}  # fmt: skip


def _normalize(ctx: DispatchContext) -> dict[str, Any]:
    at = normalize_training_attrs(ctx)
    lse = ctx.tensor("lse")
    want = (*at["batch"], at["L"])
    if lse.shape != want:
        raise argument_error(ShapeError, ctx.op, "lse", f"a buffer of shape {want}", f"shape {lse.shape}")
    if lse.layout != "contiguous":
        raise argument_error(ShapeError, ctx.op, "lse", "a contiguous buffer", f"strides {lse.strides}")
    return at


def lse_dtype(dtype: str) -> str:
    """The logsumexp's dtype for inputs of `dtype`: float64 for float64 (gradients then keep float64 precision),
    else float32."""
    return "float64" if dtype == "float64" else "float32"


def check_lse_dtype(ctx: DispatchContext, dtype: str) -> None:
    """'lse' must have lse_dtype(dtype); float64 inputs also take a float32 lse (gradients float32-accurate)."""
    got, want = ctx.tensor("lse").dtype, lse_dtype(dtype)
    if got == want or (want == "float64" and got == "float32"):
        return
    accepted = want if want == "float32" else f"{want} or float32"
    raise argument_error(DTypeError, ctx.op, "lse", f"{accepted} (for 'q' of dtype {dtype})", got)


def _infer_dtype(ctx: DispatchContext) -> str:
    dtype = check_dtypes(ctx)
    check_lse_dtype(ctx, dtype)
    return dtype


def flops(ctx: DispatchContext) -> int:
    at = ctx.attrs
    e, ev = ctx.tensor("q").shape[-1], ctx.tensor("v").shape[-1]
    full = 2 * math.prod(at["batch"]) * at["L"] * at["S"] * (e + ev)
    return full // 2 if at["is_causal"] else full


def scores_reference(
    q: Any, k: Any, attn_mask: Any, is_causal: bool, scale: float | None, enable_gqa: bool
) -> tuple[np.ndarray, float]:
    """float64 scaled, masked scores (-inf where hidden) and the scale used."""
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    if enable_gqa and q.ndim >= 3:
        k = expand_heads(k, q.shape[-3] // k.shape[-3])
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
    if is_causal:
        attn_mask = causal_mask(q.shape[-2], k.shape[-2])
    if attn_mask is not None:
        attn_mask = np.asarray(attn_mask)
        scores = np.where(attn_mask, scores, -np.inf) if attn_mask.dtype == bool else scores + attn_mask
    return scores, scale


def lse_reference(
    q: Any, k: Any, attn_mask: Any = None, is_causal: bool = False, scale: float | None = None,
    enable_gqa: bool = False,
) -> np.ndarray:  # fmt: skip
    """float64 logsumexp of each row of scores; +inf for a row that sees no key."""
    scores, _ = scores_reference(q, k, attn_mask, is_causal, scale, enable_gqa)
    m = scores.max(axis=-1, keepdims=True, initial=-np.inf)
    shift = np.where(np.isneginf(m), 0.0, m)
    with np.errstate(divide="ignore"):
        lse = (shift + np.log(np.exp(scores - shift).sum(axis=-1, keepdims=True)))[..., 0]
    return np.where(np.isneginf(lse), np.inf, lse)


def reference(
    q: Any, k: Any, v: Any, attn_mask: Any = None, lse: Any = None, is_causal: bool = False,
    scale: float | None = None, enable_gqa: bool = False,
) -> np.ndarray:  # fmt: skip
    """float64 reference of the op's output `out` (the `lse` buffer is ignored; see lse_reference)."""
    scores, _ = scores_reference(q, k, attn_mask, is_causal, scale, enable_gqa)
    v = np.asarray(v, np.float64)
    if enable_gqa and v.ndim >= 3:
        v = expand_heads(v, scores.shape[-3] // v.shape[-3])
    with np.errstate(invalid="ignore"):
        p = np.exp(scores - scores.max(axis=-1, keepdims=True, initial=-np.inf))
        p /= p.sum(axis=-1, keepdims=True)
    return np.matmul(p, v)


ATTENTION_FORWARD = OpSchema(
    name="attention_forward",
    inputs=("q", "k", "v", "attn_mask", "lse"),
    optional=frozenset({"attn_mask"}),
    buffers=frozenset({"lse"}),
    attrs=("is_causal", "scale", "enable_gqa"),
    defaults={"is_causal": False, "scale": None, "enable_gqa": False},
    normalize_attrs=_normalize,
    infer_dtype=_infer_dtype,
    infer_shape=lambda ctx: (*ctx.attrs["batch"], ctx.attrs["L"], ctx.tensor("v").shape[-1]),
    reference=reference,
    flops=flops,
    doc="Attention for training: out, and the row logsumexp written into the 'lse' buffer.",
)


def empty_like_backend(x: Any, shape: tuple[int, ...], dtype: str, what: str) -> Any:
    """An uninitialized array on x's device and library (NumPy or torch); `what` names it ("attention_forward:
    lse") in the OutOfMemoryError raised, before anything is allocated, when it cannot fit on the device."""
    device = str(x.device) if is_torch_tensor(x) else "cpu"
    check_fits(what, shape, dtype, itemsize(dtype), device)
    if is_torch_tensor(x):
        import torch

        return torch.empty(shape, dtype=getattr(torch, dtype), device=x.device)
    return np.empty(shape, np.dtype(dtype))


def attention_forward(
    q: Any, k: Any, v: Any, attn_mask: Any = None, is_causal: bool = False, scale: float | None = None,
    enable_gqa: bool = False, *, out: Any = None,
) -> tuple[Any, Any]:  # fmt: skip
    """(out, lse): attention and the natural-log logsumexp of each query row, for attention_backward."""
    with contextlib.suppress(TypeError, ValueError):  # the dispatcher names the bad argument
        q = as_array(q)
    shape = getattr(q, "shape", ())
    dtype = lse_dtype(str(getattr(q, "dtype", "")).removeprefix("torch."))
    lse = empty_like_backend(q, (*shape[:-2], shape[-2]) if len(shape) >= 2 else (0,), dtype, "attention_forward: lse")
    result = run("attention_forward", (q, k, v, attn_mask, lse), (is_causal, scale, enable_gqa), out)
    return result, lse
