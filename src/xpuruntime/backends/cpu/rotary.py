"""CPU kernels for rotary_embedding and its backward: NumPy in the compute dtype (float16 in float32), each
step rounded to q's dtype where PyTorch's eager formula rounds it (ops/rotary.py)."""

from __future__ import annotations

import numpy as np

from ...abi import ArgPack
from ...registry import kernel
from .common import CPU_FLOAT_DTYPES, compute_dtype


def _table(t: np.ndarray, position_ids: np.ndarray | None, axis: int, cdt: np.dtype) -> np.ndarray:
    """cos or sin as applied: rows gathered by position_ids (NaN out of range), unsqueezed at `axis`."""
    t = t.astype(cdt, copy=False)
    if position_ids is not None:
        pos = position_ids.astype(np.int64)
        valid = (pos >= 0) & (pos < t.shape[0])
        t = np.where(valid[..., None], t[np.where(valid, pos, 0)], cdt.type(np.nan))
    return np.expand_dims(t, axis)


def _rotated(x: np.ndarray, interleaved: bool) -> np.ndarray:
    """rotate_every_two (interleaved) or rotate_half of the last dim."""
    if interleaved:
        return np.stack([-x[..., 1::2], x[..., 0::2]], axis=-1).reshape(x.shape)
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def _stored(a: np.ndarray, dtype: np.dtype | None) -> np.ndarray:
    if dtype is None:
        return a
    with np.errstate(over="ignore"):
        return a.astype(dtype).astype(a.dtype)


def _rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool, backward: bool,
            rounds: np.dtype | None) -> np.ndarray:  # fmt: skip
    """x * cos + rotate(x) * sin (backward: x * cos - rotate(x * sin)) over the rotary dims; the rest as is."""
    r = cos.shape[-1]
    part = x[..., :r].astype(cos.dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        a = _stored(part * cos, rounds)
        b = -_rotated(_stored(part * sin, rounds), interleaved) if backward else _stored(
            _rotated(part, interleaved) * sin, rounds)  # fmt: skip
        y = a + b
    return np.concatenate([y, x[..., r:].astype(y.dtype)], axis=-1)


def _run(args: ArgPack, backward: bool) -> None:
    q, k, cos, sin, position_ids = args.inputs
    at = args.attrs
    cdt = compute_dtype(q.dtype)
    if cdt == np.float32 and cos.dtype == np.float64:
        cdt = np.dtype(np.float64)
    c, s = (_table(t, position_ids, at["unsqueeze_dim"], cdt) for t in (cos, sin))
    rounds = q.dtype if q.dtype == cos.dtype and q.dtype == np.float16 else None
    out, nq = args.out, q.size
    for x, part in ((q, out[:nq]), (k, out[nq:])):
        np.copyto(part, _rotate(x, c, s, at["interleaved"], backward, rounds).reshape(-1), casting="same_kind")


@kernel("rotary_embedding", "numpy", backend="cpu", dtypes=CPU_FLOAT_DTYPES, priority=10)
def rotary_embedding_numpy(args: ArgPack) -> None:
    """q * cos + rotate(q) * sin and the same for k, into [q_embed | k_embed]."""
    _run(args, backward=False)


@kernel("rotary_embedding_backward", "numpy", backend="cpu", dtypes=CPU_FLOAT_DTYPES, priority=10)
def rotary_embedding_backward_numpy(args: ArgPack) -> None:
    """dq * cos - rotate(dq * sin) and the same for dk, into [grad_q | grad_k]."""
    _run(args, backward=True)
