"""CPU kernels for linear_cross_entropy and its backward: NumPy over chunks of rows (float32 math, float64 for
float64 inputs); a chunk's logits, CHUNK_ELEMENTS at most, are the only (rows x vocab) array alive."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...abi import ArgPack
from ...registry import kernel
from .common import CPU_FLOAT_DTYPES

CHUNK_ELEMENTS = 1 << 20  # logits per chunk


@dataclass
class _Problem:
    """One call's arrays in compute form: rows of hidden, weight, bias, targets and their masks."""

    hidden: np.ndarray  # (n, H)
    weight: np.ndarray  # (V, H)
    bias: np.ndarray | None
    target: np.ndarray  # (n,) int64
    valid: np.ndarray  # target != ignore_index
    in_range: np.ndarray  # 0 <= target < V

    @classmethod
    def of(cls, hidden: np.ndarray, weight: np.ndarray, target: np.ndarray, bias: np.ndarray | None,
           at: Any) -> _Problem:  # fmt: skip
        cdt = np.dtype(np.float64 if hidden.dtype == np.float64 else np.float32)
        t = target.reshape(-1).astype(np.int64)
        return cls(hidden.reshape(at["rows"], at["hidden"]).astype(cdt), weight.astype(cdt),
                   None if bias is None else bias.astype(cdt), t, t != at["ignore_index"],
                   (t >= 0) & (t < at["vocab"]))  # fmt: skip

    def row_scale(self, grad_loss: np.ndarray | None, reduction: str) -> np.ndarray:
        """Each row's factor on its logit gradient: the upstream gradient, over the valid count for "mean";
        NaN where the target is out of range, 0 where it is ignored."""
        n = self.target.shape[0]
        g = np.ones(n) if grad_loss is None else np.broadcast_to(grad_loss.astype(np.float64).reshape(-1), (n,))
        if reduction == "mean":
            g = g / max(np.count_nonzero(self.valid), 1)
        g = np.where(self.in_range, g, np.nan)
        return np.where(self.valid, g, 0.0).astype(self.hidden.dtype)


def _chunk_terms(p: _Problem, s: int, e: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(logits, exp(logits - max), logsumexp) of rows [s, e)."""
    z = p.hidden[s:e] @ p.weight.T
    if p.bias is not None:
        z += p.bias
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        m = z.max(axis=1)
        ez = np.exp(z - m[:, None])
        lse = m + np.log(ez.sum(axis=1))
    return z, ez, lse


def _chunk_losses(p: _Problem, s: int, e: int, z: np.ndarray, lse: np.ndarray, at: Any) -> np.ndarray:
    rows = np.arange(e - s)
    z_t = z[rows, np.where(p.in_range[s:e], p.target[s:e], 0)]
    eps = at["label_smoothing"]
    with np.errstate(invalid="ignore", over="ignore"):
        loss = (1 - eps) * (lse - z_t) + eps * (lse - z.mean(axis=1)) + at["z_loss_scale"] * lse * lse
    return np.where(p.valid[s:e], np.where(p.in_range[s:e], loss, np.nan), 0.0)


def _chunk_logit_grads(p: _Problem, s: int, e: int, ez: np.ndarray, lse: np.ndarray, scale: np.ndarray,
                       at: Any) -> np.ndarray:  # fmt: skip
    """d loss / d logits of rows [s, e), scaled per row."""
    eps, vocab = at["label_smoothing"], at["vocab"]
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        dz = ez / ez.sum(axis=1, keepdims=True) * (1 + 2 * at["z_loss_scale"] * lse)[:, None] - eps / vocab
        hit = np.flatnonzero(p.valid[s:e] & p.in_range[s:e])
        dz[hit, p.target[s:e][hit]] -= 1 - eps
        return np.where(p.valid[s:e, None], dz * scale[s:e, None], 0.0).astype(dz.dtype)


def _run(args: ArgPack, p: _Problem, scale: np.ndarray | None, grad_hidden: np.ndarray | None,
         grad_weight: np.ndarray | None, grad_bias: np.ndarray | None) -> np.ndarray:  # fmt: skip
    """Row losses; the gradients (when their arrays are given and scale is) accumulated chunk by chunk."""
    at = args.attrs
    n = p.target.shape[0]
    losses = np.zeros(n, p.hidden.dtype)
    gw = None if grad_weight is None else np.zeros(grad_weight.shape, p.hidden.dtype)
    gb = None if grad_bias is None else np.zeros(grad_bias.shape, p.hidden.dtype)
    dh = None if grad_hidden is None else np.empty(p.hidden.shape, p.hidden.dtype)
    step = max(1, CHUNK_ELEMENTS // at["vocab"])
    for s in range(0, n, step):
        e = min(n, s + step)
        z, ez, lse = _chunk_terms(p, s, e)
        losses[s:e] = _chunk_losses(p, s, e, z, lse, at)
        if scale is None:
            continue
        dz = _chunk_logit_grads(p, s, e, ez, lse, scale, at)
        if dh is not None:
            dh[s:e] = dz @ p.weight
        if gw is not None:
            gw += dz.T @ p.hidden[s:e]
        if gb is not None:
            gb += dz.sum(axis=0)
    for buffer, value in ((grad_hidden, dh), (grad_weight, gw), (grad_bias, gb)):
        if buffer is not None:
            np.copyto(buffer, value.reshape(buffer.shape), casting="same_kind")
    return losses


@kernel("linear_cross_entropy", "numpy", backend="cpu", dtypes=CPU_FLOAT_DTYPES, priority=10)
def linear_cross_entropy_numpy(args: ArgPack) -> None:
    """Chunks of logits, each reduced to row losses (and gradients into the given buffers) and dropped."""
    hidden, weight, target, bias, grad_hidden, grad_weight, grad_bias = args.inputs
    at = args.attrs
    p = _Problem.of(hidden, weight, target, bias, at)
    scale = p.row_scale(None, at["reduction"]) if any(at["grads"]) else None
    losses = _run(args, p, scale, grad_hidden, grad_weight, grad_bias)
    out = args.out
    if at["reduction"] == "none":
        np.copyto(out, losses.reshape(out.shape), casting="same_kind")
        return
    total = losses.sum(dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        out[...] = total / np.count_nonzero(p.valid) if at["reduction"] == "mean" else total


@kernel("linear_cross_entropy_backward", "numpy", backend="cpu", dtypes=CPU_FLOAT_DTYPES, priority=10)
def linear_cross_entropy_backward_numpy(args: ArgPack) -> None:
    """The logits again, chunk by chunk, and their gradients through the two GEMMs."""
    grad_loss, hidden, weight, target, bias, grad_weight, grad_bias = args.inputs
    at = args.attrs
    p = _Problem.of(hidden, weight, target, bias, at)
    _run(args, p, p.row_scale(grad_loss, at["reduction"]), args.out, grad_weight, grad_bias)
