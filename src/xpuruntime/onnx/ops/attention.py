"""Attention (opset 23 and later): scaled dot-product attention with 3-D (B, S, hidden, heads from attributes)
or 4-D (B, H, S, D) inputs, grouped-query heads, a boolean or additive mask (shorter than the keys: padded as
masked), is_causal aligned to the end of a past key/value cache (or per batch with nonpad_kv_seqlen), sliding
windows, softcap, the qk_matmul_output modes and softmax_precision. Rows with every key masked give 0.

One algorithm serves both paths: `_Numpy` and `_Torch` give it the few array functions whose names differ."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx

from ...errors import ShapeError
from ...graph.ir import Node
from .record import itemsize, op, torch, torch_dtype

QK_MODES = (0, 1, 2, 3)  # the qk output: as multiplied (softcapped), the same, with the mask added, after softmax


class _Numpy:
    @staticmethod
    def cat(a: Any, b: Any) -> Any:
        return np.concatenate((a, b), axis=2)

    @staticmethod
    def repeat_heads(x: Any, n: int) -> Any:
        return np.repeat(x, n, axis=1)

    @staticmethod
    def permute(x: Any, axes: tuple) -> Any:
        return np.transpose(x, axes)

    @staticmethod
    def host(array: np.ndarray, like: Any) -> Any:
        return array.astype(like.dtype)

    @staticmethod
    def cast(x: Any, like: Any) -> Any:
        return np.asarray(x).astype(like.dtype, copy=False)

    @staticmethod
    def to_dtype(x: Any, name: str) -> Any:
        return x.astype(name)

    @staticmethod
    def pad_keys(mask: Any, n: int) -> Any:
        fill = False if mask.dtype == np.bool_ else -np.inf
        return np.pad(mask, [(0, 0)] * (mask.ndim - 1) + [(0, n)], constant_values=fill)

    @staticmethod
    def is_bool(x: Any) -> bool:
        return x.dtype == np.bool_

    where, tanh, exp, isneginf = np.where, np.tanh, np.exp, np.isneginf

    @staticmethod
    def amax(x: Any) -> Any:
        return np.max(x, axis=-1, keepdims=True)

    @staticmethod
    def sum(x: Any) -> Any:
        return np.sum(x, axis=-1, keepdims=True)


class _Torch:
    @staticmethod
    def cat(a: Any, b: Any) -> Any:
        return torch.cat((a, b), dim=2)

    @staticmethod
    def repeat_heads(x: Any, n: int) -> Any:
        return torch.repeat_interleave(x, n, dim=1)

    @staticmethod
    def permute(x: Any, axes: tuple) -> Any:
        return x.permute(*axes)

    @staticmethod
    def host(array: np.ndarray, like: Any) -> Any:
        return torch.from_numpy(np.ascontiguousarray(array)).to(like.device, like.dtype)

    @staticmethod
    def cast(x: Any, like: Any) -> Any:
        return x.to(like.dtype)

    @staticmethod
    def to_dtype(x: Any, name: str) -> Any:
        return x.to(torch_dtype(name))

    @staticmethod
    def pad_keys(mask: Any, n: int) -> Any:
        fill = False if mask.dtype == torch.bool else float("-inf")
        return torch.nn.functional.pad(mask, (0, n), value=fill)

    @staticmethod
    def is_bool(x: Any) -> bool:
        return x.dtype == torch.bool

    @staticmethod
    def where(c: Any, a: Any, b: Any) -> Any:
        return torch.where(c, a, b)

    @staticmethod
    def tanh(x: Any) -> Any:
        return torch.tanh(x)

    @staticmethod
    def exp(x: Any) -> Any:
        return torch.exp(x)

    @staticmethod
    def isneginf(x: Any) -> Any:
        return torch.isneginf(x)

    @staticmethod
    def amax(x: Any) -> Any:
        return torch.amax(x, dim=-1, keepdim=True)

    @staticmethod
    def sum(x: Any) -> Any:
        return torch.sum(x, dim=-1, keepdim=True)


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
    present_k = k if past_k is None else xp.cat(past_k, k)
    present_v = v if past_v is None else xp.cat(past_v, v)
    q_len, kv_len = q.shape[2], present_k.shape[2]
    if q.shape[1] != present_k.shape[1]:
        if q.shape[1] % present_k.shape[1]:
            raise ShapeError(f"Attention: {q.shape[1]} query heads do not group over {present_k.shape[1]} key heads")
        k_all = xp.repeat_heads(present_k, q.shape[1] // present_k.shape[1])
        v_all = xp.repeat_heads(present_v, q.shape[1] // present_k.shape[1])
    else:
        k_all, v_all = present_k, present_v
    zero, minus_inf = xp.host(np.zeros(()), q), xp.host(np.array(-np.inf), q)
    bias = xp.host(np.zeros((q_len, kv_len)), q)
    if mask is not None:
        if mask.shape[-1] < kv_len:
            mask = xp.pad_keys(mask, kv_len - mask.shape[-1])
        bias = bias + (xp.where(mask, zero, minus_inf) if xp.is_bool(mask) else xp.cast(mask, q))
    left, right = int(at.get("left_window_size", -1)), int(at.get("right_window_size", -1))
    causal = bool(at.get("is_causal", 0))
    if causal or left >= 0 or right >= 0:
        offset = (
            np.asarray(_host(nonpad)).reshape(-1) - q_len
            if nonpad is not None and past_k is None
            else (0 if past_k is None else past_k.shape[2])
        )
        bias = bias + xp.where(xp.host(_allowed(q_len, kv_len, offset, left, right, causal), q) > 0, zero, minus_inf)
    if nonpad is not None:
        keep = np.arange(kv_len) < np.asarray(_host(nonpad)).reshape(-1, 1)
        bias = bias + xp.where(xp.host(keep.reshape(-1, 1, 1, kv_len), q) > 0, zero, minus_inf)
    qk = (q * root) @ xp.permute(k_all * root, (0, 1, 3, 2))
    softcap = at.get("softcap")
    if softcap is not None and softcap > 0:
        qk = xp.tanh(qk / softcap) * softcap
    scores = qk + bias
    mode = int(at.get("qk_matmul_output_mode", 0))
    qk_out = scores if mode == 2 else qk
    precision = at.get("softmax_precision")
    if precision is not None:
        scores = xp.to_dtype(scores, np.dtype(onnx.helper.tensor_dtype_to_np_dtype(precision)).name)
    top = xp.amax(scores)
    masked_row = xp.isneginf(top)
    e = xp.exp(scores - xp.where(masked_row, xp.cast(zero, scores), top))
    total = xp.sum(e)
    probs = e / xp.where(total == 0, xp.cast(zero, total) + 1, total)
    probs = xp.where(xp.isneginf(xp.amax(bias)), xp.cast(zero, probs), probs)
    if mode == 3:
        qk_out = probs
    y = xp.cast(probs, q) @ v_all
    if three_d:
        y = xp.permute(y, (0, 2, 1, 3))
        y = y.reshape(y.shape[0], y.shape[1], -1)
    return y, present_k, present_v, xp.cast(qk_out, q)


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


op("Attention", lambda node, opset: lambda *args: attention(_Numpy, node, *args),
   lambda node, opset: lambda *args: attention(_Torch, node, *args), tuple_output=True, host_inputs=(6,),
   size=attention_size)  # fmt: skip
