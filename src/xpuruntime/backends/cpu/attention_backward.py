"""CPU kernels for training attention: the forward that also writes the logsumexp, and the backward.

Both materialize one batch entry's score matrix at a time (query rows x keys), in fp32 for fp16 inputs
and in the input's precision otherwise. Grouped-query attention repeats each key/value head for its
query heads and sums dk, dv back over them.

The logsumexp is written in the lse buffer's dtype (float64 for float64 inputs, see the op) and read in
the scores' precision. A float32 lse of float64 scores (a caller that allocated float32) would round every
P = exp(S - lse) by ~1e-7; the backward then renormalizes P's rows, which restores float64 precision.
"""

from __future__ import annotations

import math

import numpy as np

from ...abi import ArgPack
from ...context import DispatchContext
from ...registry import kernel
from .attention import repeat_heads
from .common import CPU_FLOAT_DTYPES, as_compute, score_dtype

MAX_SCORES = 1 << 26  # elements of the full score matrix (256 MiB in fp32)


def _fits_in_memory(ctx: DispatchContext) -> str | None:
    at = ctx.attrs
    n = math.prod(at["batch"]) * at["L"] * at["S"]
    if n > MAX_SCORES:
        return f"score matrix has {n} elements (> {MAX_SCORES})"
    return None


def _scores(args: ArgPack, q: np.ndarray, k: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """Scaled scores with -inf where the mask or causal structure hides a key."""
    at = args.attrs
    s = np.matmul(q, np.swapaxes(k, -1, -2))
    s *= at["scale"]
    if at["is_causal"]:  # query i sees key j <= i (top-left aligned)
        s[..., ~np.tri(at["L"], at["S"], dtype=bool)] = -np.inf
    elif mask is not None:
        block = np.broadcast_to(mask, s.shape)
        if mask.dtype == bool:
            np.copyto(s, -np.inf, where=~block)
        else:
            s += block
    return s


def _row_lse(s: np.ndarray) -> np.ndarray:
    """Natural-log logsumexp per row; +inf for a row that sees no key."""
    m = s.max(axis=-1, keepdims=True)
    shift = np.where(np.isneginf(m), 0.0, m)
    with np.errstate(divide="ignore"):
        lse = (shift + np.log(np.exp(s - shift).sum(axis=-1, keepdims=True)))[..., 0]
    return np.where(np.isneginf(lse), np.inf, lse)


@kernel("attention_forward", "math", backend="cpu", dtypes=CPU_FLOAT_DTYPES, priority=10,
        conditions=(_fits_in_memory,))  # fmt: skip
def attention_forward_math(args: ArgPack) -> None:
    """softmax(q k^T * scale + mask) v, and the rows' logsumexp into the lse buffer."""
    if args.out.size == 0:
        return
    q, k, v, mask, lse_out = args.inputs
    at = args.attrs
    dtype = score_dtype(q, k, at["scale"])
    q, k, v = as_compute(q, dtype), as_compute(k, dtype), as_compute(v, dtype)
    k, v = repeat_heads(k, at), repeat_heads(v, at)
    s = _scores(args, q, k, None if mask is None else as_compute(mask) if mask.dtype != bool else mask)
    lse = _row_lse(s)
    with np.errstate(invalid="ignore"):  # rows that see no key: exp(-inf - inf) -> NaN output, as PyTorch
        p = np.exp(s - lse[..., None])
        p[np.isinf(lse)] = np.nan
    np.copyto(args.out, np.matmul(p, v), casting="same_kind")
    with np.errstate(over="ignore"):  # an lse beyond float32 (scale ~1e38) is +-inf there, as in float32 math
        np.copyto(lse_out, lse, casting="same_kind")


@kernel("attention_backward", "math", backend="cpu", dtypes=CPU_FLOAT_DTYPES, priority=10,
        conditions=(_fits_in_memory,))  # fmt: skip
def attention_backward_math(args: ArgPack) -> None:
    """dq, dk, dv from the saved lse: P = exp(S - lse), dS = P * (dO V^T - rowsum(dO * O))."""
    if args.out.size == 0:
        return
    do, q, k, v, out, lse, mask = args.inputs
    at = args.attrs
    group, gqa = at["group"], at["enable_gqa"]
    dtype = score_dtype(q, k, at["scale"])
    do, q, k, v, out = (as_compute(t, dtype) for t in (do, q, k, v, out))
    ke, ve = repeat_heads(k, at), repeat_heads(v, at)
    s = _scores(args, q, ke, None if mask is None else as_compute(mask) if mask.dtype != bool else mask)
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.exp(s - lse[..., None].astype(s.dtype))  # lse = +inf: the row contributes nothing
    p[np.isnan(p)] = 0.0
    if lse.dtype.itemsize < s.dtype.itemsize:  # a float32 lse of float64 scores: rows of P sum to 1 +- 1e-7
        sums = p.sum(axis=-1, keepdims=True)
        np.divide(p, sums, out=p, where=sums > 0)
    delta = (do * out).sum(axis=-1, keepdims=True)
    delta[np.isinf(lse)] = 0.0  # out is NaN on rows that saw no key
    ds = p * (np.matmul(do, np.swapaxes(ve, -1, -2)) - delta)
    ds *= at["scale"]
    dq = np.matmul(ds, ke)
    dk = np.matmul(np.swapaxes(ds, -1, -2), q)
    dv = np.matmul(np.swapaxes(p, -1, -2), do)
    if gqa and group > 1:
        dk = dk.reshape(*k.shape[:-2], group, *k.shape[-2:]).sum(axis=-3)
        dv = dv.reshape(*v.shape[:-2], group, *v.shape[-2:]).sum(axis=-3)
    a, b, c = at["sizes"]
    np.copyto(args.out[:a], dq.reshape(-1), casting="same_kind")
    np.copyto(args.out[a : a + b], dk.reshape(-1), casting="same_kind")
    np.copyto(args.out[a + b : a + b + c], dv.reshape(-1), casting="same_kind")
