"""attention_backward: dq, dk, dv of attention from the forward's output and logsumexp.

`attention_backward(grad_out, q, k, v, out, lse, attn_mask=None, is_causal=False, scale=None,
enable_gqa=False)` returns `(dq, dk, dv)` with the shapes of q, k, v, where `out, lse` come from
`attention_forward` with the same arguments (lse float32, or float64 for float64 inputs: see
`attention_forward`). With grouped-query attention, dk and dv sum over the query heads that share a
key/value head. A query row that saw no key (lse = +inf) contributes no gradient.

The kernel ABI has one output per op: the op's output is one flat array in q's dtype packing
[dq | dk | dv] (each C-contiguous), and `out=` (`grads_out`) must be such an array. Without `out=`, a
kernel declared `returns_output=True` (PyTorch's fused backwards, whose aten ops return three fresh
tensors) may return the tuple (dq, dk, dv) instead, so nothing is copied into a packed buffer.
`unpack` takes either form; the wrapper below and the PyTorch front ends always return (dq, dk, dv).

A PyTorch autograd Function calls `attention_forward` in forward (saving q, k, v, out, lse) and this
op in backward; both go through the dispatcher, so the policy picks their kernels.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..context import DispatchContext
from ..dispatch import run
from ..errors import ShapeError, argument_error
from ..schema import OpSchema
from .attention import check_dtypes, expand_heads
from .attention_forward import check_lse_dtype, normalize_training_attrs, scores_reference
from .checks import require_dtype_like


def _normalize(ctx: DispatchContext) -> dict[str, Any]:
    at = normalize_training_attrs(ctx)
    q, v = ctx.tensor("q").shape, ctx.tensor("v").shape
    want_out = (*at["batch"], at["L"], v[-1])
    for name in ("grad_out", "out"):
        if ctx.tensor(name).shape != want_out:
            raise argument_error(ShapeError, ctx.op, name, f"shape {want_out} (attention's output)",
                                 ctx.tensor(name).shape)  # fmt: skip
    want_lse = (*at["batch"], at["L"])
    if ctx.tensor("lse").shape != want_lse:
        raise argument_error(ShapeError, ctx.op, "lse", f"shape {want_lse} (attention_forward's lse)",
                             ctx.tensor("lse").shape)  # fmt: skip
    sizes = (math.prod(q), math.prod(ctx.tensor("k").shape), math.prod(v))
    return {**at, "sizes": sizes}


def _infer_dtype(ctx: DispatchContext) -> str:
    dtype = check_dtypes(ctx)
    for name in ("grad_out", "out"):
        require_dtype_like(ctx, name, "q")
    check_lse_dtype(ctx, dtype)
    return dtype


def flops(ctx: DispatchContext) -> int:
    """2.5x the forward's: five matrix products instead of two."""
    at = ctx.attrs
    e, ev = ctx.tensor("q").shape[-1], ctx.tensor("v").shape[-1]
    full = math.prod(at["batch"]) * at["L"] * at["S"] * (6 * e + 4 * ev)
    return full // 2 if at["is_causal"] else full


def unpack(packed: Any, q_shape: tuple, k_shape: tuple, v_shape: tuple) -> tuple[Any, Any, Any]:
    """(dq, dk, dv) from the op's result: views of the packed array, or a kernel's own tuple as it is."""
    if isinstance(packed, tuple | list):
        dq, dk, dv = packed
        return dq, dk, dv
    a = math.prod(q_shape)
    b = a + math.prod(k_shape)
    c = b + math.prod(v_shape)
    return packed[:a].reshape(q_shape), packed[a:b].reshape(k_shape), packed[b:c].reshape(v_shape)


def gradients_reference(
    grad_out: Any, q: Any, k: Any, v: Any, attn_mask: Any = None, is_causal: bool = False,
    scale: float | None = None, enable_gqa: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """float64 (dq, dk, dv), recomputing the forward; rows that see no key give no gradient."""
    scores, scale = scores_reference(q, k, attn_mask, is_causal, scale, enable_gqa)
    q64, k64, v64 = (np.asarray(t, np.float64) for t in (q, k, v))
    do = np.asarray(grad_out, np.float64)
    group = q64.shape[-3] // k64.shape[-3] if enable_gqa and q64.ndim >= 3 else 1
    ke, ve = expand_heads(k64, group), expand_heads(v64, group)
    m = scores.max(axis=-1, keepdims=True, initial=-np.inf)
    seen = ~np.isneginf(m)
    p = np.exp(scores - np.where(seen, m, 0.0))
    with np.errstate(invalid="ignore", divide="ignore"):
        p = np.where(seen, p / p.sum(axis=-1, keepdims=True), 0.0)
    dv = np.swapaxes(p, -1, -2) @ do
    dp = do @ np.swapaxes(ve, -1, -2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    dq = scale * (ds @ ke)
    dk = scale * (np.swapaxes(ds, -1, -2) @ q64)
    if group > 1:
        dk = dk.reshape(*k64.shape[:-2], group, *k64.shape[-2:]).sum(axis=-3)
        dv = dv.reshape(*v64.shape[:-2], group, *v64.shape[-2:]).sum(axis=-3)
    return dq, dk, dv


def reference(
    grad_out: Any, q: Any, k: Any, v: Any, out: Any = None, lse: Any = None, attn_mask: Any = None,
    is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False,
) -> np.ndarray:  # fmt: skip
    """float64 reference of the packed output [dq | dk | dv] (out and lse are recomputed, not read)."""
    grads = gradients_reference(grad_out, q, k, v, attn_mask, is_causal, scale, enable_gqa)
    return np.concatenate([g.reshape(-1) for g in grads])


ATTENTION_BACKWARD = OpSchema(
    name="attention_backward",
    inputs=("grad_out", "q", "k", "v", "out", "lse", "attn_mask"),
    optional=frozenset({"attn_mask"}),
    attrs=("is_causal", "scale", "enable_gqa"),
    defaults={"is_causal": False, "scale": None, "enable_gqa": False},
    normalize_attrs=_normalize,
    infer_dtype=_infer_dtype,
    infer_shape=lambda ctx: (sum(ctx.attrs["sizes"]),),
    reference=reference,
    flops=flops,
    returned_parts=lambda ctx: tuple((ctx.tensor(n).shape, ctx.out_dtype) for n in ("q", "k", "v")),
    doc="Gradients of attention (dq, dk, dv packed in one array, or a returns_output kernel's tuple) from the "
    "saved output and logsumexp.",
)


def attention_backward(
    grad_out: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, attn_mask: Any = None, is_causal: bool = False,
    scale: float | None = None, enable_gqa: bool = False, *, grads_out: Any = None,
) -> tuple[Any, Any, Any]:  # fmt: skip
    """(dq, dk, dv) for upstream gradient grad_out; `grads_out` is an optional packed output buffer (the
    gradients are then views of it)."""
    packed = run("attention_backward", (grad_out, q, k, v, out, lse, attn_mask), (is_causal, scale, enable_gqa),
                 grads_out)  # fmt: skip
    return unpack(packed, *(tuple(np.shape(t)) for t in (q, k, v)))  # np.shape: array-likes too
