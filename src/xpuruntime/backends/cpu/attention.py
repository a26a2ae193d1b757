"""CPU attention kernels.

- `math`: materializes the whole score matrix; fastest for short sequences, refused when that matrix
  would be too large.
- `chunked`: flash-attention's algorithm on the CPU: query blocks against key blocks with an online
  softmax (running max and sum), so memory is one block of scores (the workspace), and causal calls
  skip key blocks above the diagonal.
"""

from __future__ import annotations

import math

import numpy as np

from ...abi import ArgPack, LaunchConfig
from ...context import DispatchContext
from ...registry import kernel
from .common import CPU_FLOAT_DTYPES, as_compute, compute_dtype, score_dtype

MATH_MAX_SCORES = 1 << 26  # elements of the full score matrix (256 MiB in fp32)


def _score_elements(ctx: DispatchContext) -> int:
    at = ctx.attrs
    return math.prod(at["batch"]) * at["L"] * at["S"]


def _fits_in_memory(ctx: DispatchContext) -> str | None:
    n = _score_elements(ctx)
    if n > MATH_MAX_SCORES:
        return f"score matrix has {n} elements (> {MATH_MAX_SCORES}); use a chunked kernel"
    return None


def _masked_scores(
    args: ArgPack, q: np.ndarray, k: np.ndarray, rows: slice, cols: slice, out: np.ndarray, scaled: bool = False
) -> None:
    """out = q[rows] k[cols]^T * scale (q comes scaled already with `scaled`), with the mask or causal
    structure applied (-inf = hidden)."""
    np.matmul(q[..., rows, :], np.ascontiguousarray(np.swapaxes(k[..., cols, :], -1, -2)), out=out)
    if not scaled:
        out *= out.dtype.type(args.attrs["scale"])
    mask, at = args.inputs[3], args.attrs
    if at["is_causal"]:  # query i sees key j <= i (top-left aligned)
        visible = np.arange(rows.start, rows.stop)[:, None] >= np.arange(cols.start, cols.stop)[None, :]
        np.copyto(out, -np.inf, where=~visible)
    elif mask is not None:
        block = np.broadcast_to(mask, (*at["batch"], at["L"], at["S"]))[..., rows, cols]
        if mask.dtype == bool:
            np.copyto(out, -np.inf, where=~block)
        else:
            out += block


UNSHIFTED_MAX = 60.0  # scores up to this need no max subtraction: exp() stays far from overflow
UNSHIFTED_MIN_SUM = 1e-30  # a row whose exp() sum is below this lost precision to underflow


def _exp_scores(args: ArgPack, q: np.ndarray, k: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, float]:
    """scores <- exp(scores - shift) in place, returning the row sums and a bound on the largest exp().
    softmax is shift-invariant, so when every score is small (the usual case) the per-row max pass is
    skipped, unless the mask hides whole rows (`_mask_hides_rows`); a row that underflows anyway (large
    scores pushed down by the mask) or any NaN/inf computes the scores again for the row-max path."""
    at = args.attrs
    rows, cols = slice(0, at["L"]), slice(0, at["S"])
    scale = scores.dtype.type(at["scale"])
    scaled = q.size < scores.size
    if scaled:  # scale the smaller operand
        q = q * scale
    _masked_scores(args, q, k, rows, cols, scores, scaled)
    top = scores.max()
    if top <= UNSHIFTED_MAX and not _mask_hides_rows(args.inputs[3], at["is_causal"]):
        np.exp(scores, out=scores)
        sums = _row_sums(scores)
        if sums.min() >= UNSHIFTED_MIN_SUM:
            return sums, math.exp(top)
        _masked_scores(args, q, k, rows, cols, scores, scaled)
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    return _row_sums(scores), 1.0


def _mask_hides_rows(mask: np.ndarray | None, is_causal: bool) -> bool:
    """Whether the mask leaves some query row no key within exp()'s range (a padded query row of a decoder's
    causal + padding mask, all float32.min: at GPT-2's batch 8, one core, a call took 20.7 ms computing its
    scores twice, 15.8 ms once): such calls take the row-max path at once. Reads the mask, not the scores
    (a row-max over the mask's own shape, ~1/H of the scores' size)."""
    if mask is None or is_causal or mask.size == 0:
        return False
    if mask.dtype == bool:
        return not mask.any(axis=-1).all()
    return bool(mask.max(axis=-1).min() < -UNSHIFTED_MAX)


def repeat_heads(x: np.ndarray, attrs: dict) -> np.ndarray:
    """k or v with each head repeated for its group of query heads (grouped-query attention: `group` > 1)."""
    group = attrs.get("group", 1)
    return np.repeat(x, group, axis=-3) if group > 1 else x


def _row_sums(scores: np.ndarray) -> np.ndarray:
    """Sums over the last axis (kept) as a BLAS matrix-vector product with ones: several times faster
    than a NumPy reduction over rows of a few hundred keys."""
    return np.matmul(scores, np.ones(scores.shape[-1], scores.dtype))[..., None]


@kernel("attention", "math", backend="cpu", dtypes=CPU_FLOAT_DTYPES, priority=10, conditions=(_fits_in_memory,))
def attention_math(args: ArgPack) -> None:
    """softmax(q k^T * scale + mask) v with the full score matrix; the softmax's division is done on the
    (smaller) result, written straight into `out` when it has the compute dtype."""
    if args.out.size == 0:  # e.g. L == S == 0: max() over no keys would raise
        return
    at = args.attrs
    dtype = score_dtype(args.inputs[0], args.inputs[1], at["scale"])
    q, k, v = (as_compute(t, dtype) for t in args.inputs[:3])
    k, v = repeat_heads(k, at), repeat_heads(v, at)
    scores = np.empty((*at["batch"], at["L"], at["S"]), q.dtype)
    out = args.out
    with np.errstate(invalid="ignore", divide="ignore"):  # rows that see no key become NaN, as in PyTorch
        sums, top = _exp_scores(args, q, k, scores)
        late = _can_normalize_late(top, at["S"], v)
        if not late:
            scores /= sums
        if out.dtype == scores.dtype:
            np.matmul(scores, v, out=out)
            if late:
                out /= sums
        else:
            result = np.matmul(scores, v)
            if late:
                result /= sums
            np.copyto(out, result, casting="same_kind")


def _can_normalize_late(top: float, keys: int, v: np.ndarray) -> bool:
    """Whether exp(scores) @ v stays far from overflow (|result| <= keys * top * max|v|), so the softmax's
    division can wait for the smaller result; false for huge or non-finite v."""
    vmax = float(np.abs(v).max()) if v.size else 0.0
    return keys * top * vmax < float(np.finfo(v.dtype).max) / 16


def chunked_launch_config(ctx: DispatchContext) -> LaunchConfig:
    at = ctx.attrs
    block_q, block_k = min(128, max(at["L"], 1)), min(256, max(at["S"], 1))
    grid = (math.prod(at["batch"]), math.ceil(at["L"] / block_q))
    return LaunchConfig(grid=grid, block=(block_q,), params={"BLOCK_Q": block_q, "BLOCK_K": block_k})


def chunked_workspace_bytes(ctx: DispatchContext) -> int:
    """One block of scores per batch entry."""
    p = chunked_launch_config(ctx).params
    itemsize = compute_dtype(np.dtype(ctx.dtype)).itemsize
    return math.prod(ctx.attrs["batch"]) * p["BLOCK_Q"] * p["BLOCK_K"] * itemsize


@kernel(
    "attention", "chunked", backend="cpu", dtypes=CPU_FLOAT_DTYPES, priority=5,
    launch_config=chunked_launch_config, workspace_bytes=chunked_workspace_bytes,
)  # fmt: skip
def attention_chunked(args: ArgPack) -> None:
    """Online softmax over key blocks; memory O(BLOCK_Q x BLOCK_K) per batch entry."""
    if args.out.size == 0:  # nothing to write; a 0-size batch also gets no workspace
        return
    at, params = args.attrs, args.config.params
    batch, L, S = at["batch"], at["L"], at["S"]
    dtype = score_dtype(args.inputs[0], args.inputs[1], at["scale"])
    q, k, v = (as_compute(t, dtype) for t in args.inputs[:3])
    q, k, v = (np.broadcast_to(t, (*batch, *t.shape[-2:])) for t in (q, repeat_heads(k, at), repeat_heads(v, at)))
    block_q, block_k = params["BLOCK_Q"], params["BLOCK_K"]
    if dtype == compute_dtype(args.inputs[0].dtype):
        scratch = args.workspace.view(dtype).reshape(*batch, block_q, block_k)
    else:  # float64 scores for an overflow-prone scale: the workspace was sized for the compute dtype
        scratch = np.empty((*batch, block_q, block_k), dtype)
    for i in range(0, L, block_q):
        rows = slice(i, min(i + block_q, L))
        nq = rows.stop - rows.start
        running_max = np.full((*batch, nq, 1), -np.inf, q.dtype)
        running_sum = np.zeros((*batch, nq, 1), q.dtype)
        acc = np.zeros((*batch, nq, v.shape[-1]), q.dtype)
        last_key = min(S, rows.stop) if at["is_causal"] else S  # causal: keys past the block's last row are hidden
        for j in range(0, last_key, block_k):
            cols = slice(j, min(j + block_k, S))
            scores = scratch[..., :nq, : cols.stop - cols.start]
            _masked_scores(args, q, k, rows, cols, scores)
            new_max = np.maximum(running_max, scores.max(axis=-1, keepdims=True))
            shift = np.where(np.isneginf(new_max), 0.0, new_max)  # keep exp() finite while a row sees nothing yet
            np.exp(scores - shift, out=scores)
            correction = np.exp(running_max - shift)
            running_sum = running_sum * correction + scores.sum(axis=-1, keepdims=True)
            acc = acc * correction + np.matmul(scores, v[..., cols, :])
            running_max = new_max
        with np.errstate(invalid="ignore", divide="ignore"):  # 0/0 for rows that saw no key: NaN, as math
            np.copyto(args.out[..., rows, :], acc / running_sum, casting="same_kind")
