"""Text ONNX ops over integer token ids: TfIdfVectorizer. (Tensors of strings are not a dtype the session
runs, so pool_strings and the string ops are not supported.)"""

from __future__ import annotations

import numpy as np

from ...errors import ShapeError
from ...graph.ir import Node
from ..errors import UnsupportedModelError
from .record import Fn, LoadContext, op

MODES = ("TF", "IDF", "TFIDF")


def check_tfidf(node: Node, ctx: LoadContext) -> None:
    if node.attrs.get("pool_strings") or not node.attrs.get("pool_int64s"):
        raise UnsupportedModelError(f"{node.describe()}: only pool_int64s (integer token ids) is supported")
    if node.attrs.get("mode") not in MODES:
        raise UnsupportedModelError(f"{node.describe()}: mode {node.attrs.get('mode')!r} is not one of {MODES}")


def pool_grams(node: Node) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """The pool's n-grams by length: n -> (grams (k, n), their indices among all the pool's n-grams); lengths
    outside [min_gram_length, max_gram_length] are left out (they are never counted)."""
    pool, starts = np.asarray(node.attrs["pool_int64s"], np.int64), list(node.attrs["ngram_counts"])
    low, high = node.attrs["min_gram_length"], node.attrs["max_gram_length"]
    grams, first = {}, 0
    for n, (start, end) in enumerate(zip(starts, [*starts[1:], pool.size]), start=1):
        count = (end - start) // n
        if low <= n <= high and count:
            grams[n] = (pool[start : start + count * n].reshape(count, n), first + np.arange(count))
        first += count
    return grams


def tfidf(node: Node, opset: int) -> Fn:
    """Counts of the pool's n-grams in each row: for every skip s in [0, max_skip_count], the n-grams
    (x[i], x[i + s + 1], ..., x[i + (n - 1)(s + 1)]), unigrams counted once; then weighted by mode (IDF: 1 or
    the weight where the count is above 0, TFIDF: count times weight)."""
    attrs = node.attrs
    grams = pool_grams(node)
    slots = np.asarray(attrs["ngram_indexes"], np.int64)
    width = int(slots.max()) + 1 if slots.size else 0
    weights = np.asarray(attrs.get("weights") or np.ones(slots.size), np.float64)

    def run(x: np.ndarray) -> np.ndarray:
        if x.ndim not in (1, 2):
            raise ShapeError(f"TfIdfVectorizer: input {x.shape} must be (C,) or (N, C)")
        rows = x.reshape(-1, x.shape[-1]).astype(np.int64)
        counts = np.zeros((rows.shape[0], slots.size))
        for skip in range(attrs.get("max_skip_count", 0) + 1):
            for n, (pool, ids) in grams.items():
                span = (n - 1) * (skip + 1)
                if (n == 1 and skip) or span >= rows.shape[1]:
                    continue
                starts = np.arange(rows.shape[1] - span)
                found = rows[:, starts[:, None] + np.arange(n) * (skip + 1)]  # (N, positions, n)
                hits = (found[:, :, None, :] == pool[None, None]).all(axis=-1)  # (N, positions, k)
                counts[:, ids] += hits.sum(axis=1)
        if attrs["mode"] == "IDF":
            counts = (counts > 0) * weights
        elif attrs["mode"] == "TFIDF":
            counts = counts * weights
        out = np.zeros((rows.shape[0], width), np.float32)
        np.add.at(out, (slice(None), slots), counts.astype(np.float32))
        return out if x.ndim == 2 else out[0]

    return run


op("TfIdfVectorizer", tfidf, check=check_tfidf)
