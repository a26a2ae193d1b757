"""Attention (opset 23 and later): scaled dot-product attention with 3-D (B, S, hidden, heads from attributes)
or 4-D (B, H, S, D) inputs, grouped-query heads, a boolean or additive mask (shorter than the keys: padded as
masked), is_causal aligned to the end of a past key/value cache (or per batch with nonpad_kv_seqlen), sliding
windows, softcap, the qk_matmul_output modes and softmax_precision. Rows with every key masked give 0.

One algorithm serves both paths (arrays.py gives it the few array functions whose names differ)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx

from ...errors import ShapeError
from ...graph.ir import Node
from .arrays import NUMPY, TORCH
from .record import itemsize, op

QK_MODES = (0, 1, 2, 3)  # the qk output: as multiplied (softcapped), the same, with the mask added, after softmax


def _constant(xp: Any, array: np.ndarray, like: Any) -> Any:
    """A host array as an array of like's kind, device and dtype."""
    return xp.cast(xp.from_host(np.asarray(array), like), like.dtype)


def _heads(xp: Any, x: Any, heads: int | None, what: str) -> Any:
    """(B, S, hidden) -> (B, heads, S, hidden / heads)."""
    if heads is None or heads < 1 or x.shape[2] % heads:
        raise ShapeError(f"Attention: 3-D {what} {tuple(x.shape)} needs a q_num_heads / kv_num_heads dividing it")
    return xp.permute(x.reshape(x.shape[0], x.shape[1], heads, x.shape[2] // heads), (0, 2, 1, 3))


def _allowed(q_len: int, kv_len: int, offset: Any, left: int, right: int, causal: bool) -> np.ndarray:
    """Where query i may see key j (host bool array, (q, kv) or (B, 1, q, kv) for per-batch offsets): j at
    most i + offset when causal, within the sliding window around i + offset."""
    i = np.arange(q_len).reshape(q_len, 1)
    j = np.arange(kv_len).reshape(1, kv_len)
    per_batch = np.ndim(offset) > 0
    diff = (i + (np.reshape(offset, (-1, 1, 1)) if per_batch else int(offset))) - j
    allowed = np.ones(diff.shape, bool)
    if causal:
        allowed &= diff >= 0
    if left >= 0:
        allowed &= diff <= left
    if right >= 0:
        allowed &= -diff <= right
    return allowed[:, None] if per_batch else allowed


def attention(xp: Any, node: Node, q: Any, k: Any, v: Any, mask: Any = None, past_k: Any = None,
              past_v: Any = None, nonpad: Any = None) -> tuple:  # fmt: skip
    at = node.attrs
    if (past_k is None) != (past_v is None):
        raise ShapeError("Attention: past_key and past_value come together")
    if len(q.shape) not in (3, 4) or not len(q.shape) == len(k.shape) == len(v.shape):
        raise ShapeError(f"Attention: Q {tuple(q.shape)}, K {tuple(k.shape)}, V {tuple(v.shape)}: all 3-D or 4-D")
    three_d = len(q.shape) == 3
    if three_d:
        q = _heads(xp, q, at.get("q_num_heads"), "Q")
        k, v = _heads(xp, k, at.get("kv_num_heads"), "K"), _heads(xp, v, at.get("kv_num_heads"), "V")
    scale = at.get("scale")
    root = _dtype(q).type(math.sqrt(1 / math.sqrt(q.shape[3]) if scale is None else scale))  # rounded as Q's
    root = root if isinstance(q, np.ndarray) else float(root)
    present_k = k if past_k is None else xp.concat([past_k, k], 2)
    present_v = v if past_v is None else xp.concat([past_v, v], 2)
    q_len, kv_len = q.shape[2], present_k.shape[2]
    if q.shape[1] != present_k.shape[1]:
        if q.shape[1] % present_k.shape[1]:
            raise ShapeError(f"Attention: {q.shape[1]} query heads do not group over {present_k.shape[1]} key heads")
        k_all = xp.repeat(present_k, q.shape[1] // present_k.shape[1], 1)
        v_all = xp.repeat(present_v, q.shape[1] // present_k.shape[1], 1)
    else:
        k_all, v_all = present_k, present_v
    zero, minus_inf = _constant(xp, np.zeros(()), q), _constant(xp, np.array(-np.inf), q)
    bias = _constant(xp, np.zeros((q_len, kv_len)), q)
    if mask is not None:
        if mask.shape[-1] < kv_len:
            mask = xp.pad_last(mask, kv_len - mask.shape[-1], False if mask.dtype == xp.dtype("bool") else -np.inf)
        bias = bias + (xp.where(mask, zero, minus_inf) if mask.dtype == xp.dtype("bool") else xp.cast(mask, q.dtype))
    left, right = int(at.get("left_window_size", -1)), int(at.get("right_window_size", -1))
    causal = bool(at.get("is_causal", 0))
    if causal or left >= 0 or right >= 0:
        offset = (
            np.asarray(_host(nonpad)).reshape(-1) - q_len
            if nonpad is not None and past_k is None
            else (0 if past_k is None else past_k.shape[2])
        )
        allowed = _constant(xp, _allowed(q_len, kv_len, offset, left, right, causal), q)
        bias = bias + xp.where(allowed > 0, zero, minus_inf)
    if nonpad is not None:
        keep = np.arange(kv_len) < np.asarray(_host(nonpad)).reshape(-1, 1)
        bias = bias + xp.where(_constant(xp, keep.reshape(-1, 1, 1, kv_len), q) > 0, zero, minus_inf)
    qk = (q * root) @ xp.permute(k_all * root, (0, 1, 3, 2))
    softcap = at.get("softcap")
    if softcap is not None and softcap > 0:
        qk = xp.tanh(qk / softcap) * softcap
    scores = qk + bias
    mode = int(at.get("qk_matmul_output_mode", 0))
    qk_out = scores if mode == 2 else qk
    precision = at.get("softmax_precision")
    if precision is not None:
        scores = xp.cast(scores, xp.dtype(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(precision)).name))
    top = xp.amax(scores, (-1,))
    masked_row = xp.isneginf(top)
    e = xp.exp(scores - xp.where(masked_row, xp.cast(zero, scores.dtype), top))
    total = xp.sum(e, (-1,))
    probs = e / xp.where(total == 0, xp.cast(zero, total.dtype) + 1, total)
    probs = xp.where(xp.isneginf(xp.amax(bias, (-1,))), xp.cast(zero, probs.dtype), probs)
    if mode == 3:
        qk_out = probs
    y = xp.cast(probs, q.dtype) @ v_all
    if three_d:
        y = xp.permute(y, (0, 2, 1, 3))
        y = y.reshape(y.shape[0], y.shape[1], -1)
    return y, present_k, present_v, xp.cast(qk_out, q.dtype)


def _dtype(x: Any) -> Any:
    return x.dtype if isinstance(x.dtype, np.dtype) else np.dtype(str(x.dtype).removeprefix("torch."))


def _host(x: Any) -> Any:
    return x.detach().cpu().numpy() if hasattr(x, "detach") else x


def attention_size(node: Node, args: list, opset: int) -> tuple[tuple[int, ...], int]:
    """The (B, heads, queries, keys) scores, the largest thing attention makes."""
    q, k = args[0], args[1]
    heads = q.shape[1] if len(q.shape) == 4 else int(node.attrs.get("q_num_heads") or 1)
    past = args[4].shape[2] if len(args) > 4 and args[4] is not None and len(args[4].shape) == 4 else 0
    return (q.shape[0], heads, q.shape[-2], k.shape[-2] + past), itemsize(q)


op("Attention", lambda node, opset: lambda *args: attention(NUMPY, node, *args),
   lambda node, opset: lambda *args: attention(TORCH, node, *args), tuple_output=True, host_inputs=(6,),
   size=attention_size)  # fmt: skip
