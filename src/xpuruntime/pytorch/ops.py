"""`xtorch.ops.fused_attention` and `xtorch.ops.fused_layernorm`: the custom ops `xpuruntime::attention` and
`xpuruntime::layer_norm` (see `custom_ops`) with the arguments of F.scaled_dot_product_attention and
F.layer_norm, checked here so that a wrong call gets a clear `XpuRuntimeError` naming the argument.

Each runs forward and backward through the selector (the policy name `torch` means PyTorch's own kernel),
has fake implementations for tracing and an autograd formula, so `torch.compile(fullgraph=True)` traces
it without graph breaks. Under autocast, floating inputs other than float64 are cast to the autocast dtype
first (as PyTorch's autocast does for its lower-precision ops).
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Sequence

import torch
from torch import Tensor

from ..errors import ArgumentError, ShapeError, argument_error
from .custom_ops.common import autocast_cast, eager_origin


def _check_tensor(op: str, name: str, t: object, ndim: int, form: str) -> None:
    if not isinstance(t, Tensor):
        raise argument_error(ArgumentError, op, name, "a torch.Tensor", type(t).__name__)
    if t.dim() < ndim:
        raise argument_error(ShapeError, op, name, f"a tensor of shape {form} (at least {ndim} dims)",
                             f"shape {tuple(t.shape)}")  # fmt: skip


def _check_attention(query: Tensor, key: Tensor, value: Tensor, enable_gqa: bool) -> None:
    op = "fused_attention"
    forms = {"query": "(..., L, E)", "key": "(..., S, E)", "value": "(..., S, Ev)"}
    for (name, form), t in zip(forms.items(), (query, key, value)):
        _check_tensor(op, name, t, 2, form)
    q, k, v = query.shape, key.shape, value.shape
    if k[-1] != q[-1]:
        expected = f"last dim {q[-1]} (the head dim E of 'query')"
        raise argument_error(ShapeError, op, "key", expected, f"shape {tuple(k)}")
    if v[-2] != k[-2]:
        raise argument_error(ShapeError, op, "value", f"{k[-2]} rows (the length S of 'key')", f"shape {tuple(v)}")
    heads_q, heads_k = (q[-3] if len(q) >= 3 else 1), (k[-3] if len(k) >= 3 else 1)
    if enable_gqa:
        if len(q) < 3 or len(k) != len(q) or len(v) != len(q) or k[:-3] != q[:-3] or v[:-2] != k[:-2]:
            raise argument_error(ShapeError, op, "key", f"batch dims {tuple(q[:-3])} and a heads axis -3 like "
                                 "'query' (enable_gqa=True)", f"shape {tuple(k)}")  # fmt: skip
        if heads_k == 0 or heads_q % heads_k:
            raise argument_error(ShapeError, op, "key", f"a number of heads dividing the {heads_q} of 'query' "
                                 "(enable_gqa=True)", f"{heads_k} heads")  # fmt: skip
        return
    try:
        torch.broadcast_shapes(q[:-2], k[:-2], v[:-2])
    except RuntimeError:
        hint = " (fewer key/value heads than query heads: pass enable_gqa=True)" if heads_k < heads_q else ""
        raise argument_error(ShapeError, op, "key", f"batch dims broadcastable with {tuple(q[:-2])}{hint}",
                             f"shape {tuple(k)}") from None  # fmt: skip


def fused_attention(
    query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None, dropout_p: float = 0.0,
    is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False,
) -> Tensor:  # fmt: skip
    """Scaled dot-product attention through the selector (F.scaled_dot_product_attention's arguments, with
    grouped-query attention under enable_gqa=True); dropout_p must be 0.0 (apply dropout outside the op)."""
    if dropout_p != 0.0:
        raise argument_error(ArgumentError, "fused_attention", "dropout_p", "0.0 (no dropout inside the op)", dropout_p)
    _check_attention(query, key, value, bool(enable_gqa))
    if attn_mask is not None and attn_mask.requires_grad and torch.is_grad_enabled():  # its gradient would be lost
        expected = "a mask that does not require grad (detach it, or use F.scaled_dot_product_attention)"
        raise argument_error(ArgumentError, "fused_attention", "attn_mask", expected, "one that requires grad")
    if scale is not None and (not isinstance(scale, numbers.Real) or isinstance(scale, bool)):
        raise argument_error(ArgumentError, "fused_attention", "scale", "a number or None", repr(scale))
    query, key, value = autocast_cast(query, key, value, device_type=query.device.type)
    with eager_origin():
        out, _ = torch.ops.xpuruntime.attention(
            query, key, value, attn_mask, bool(is_causal), None if scale is None else float(scale), bool(enable_gqa)
        )
    return out


def _dims(normalized_shape: object) -> list[int]:
    """normalized_shape as F.layer_norm takes it: an int or a sequence of ints (not a string, float or bool)."""
    expected = "an int or a sequence of ints"
    items = [normalized_shape] if not isinstance(normalized_shape, Sequence | torch.Size) else normalized_shape
    if isinstance(normalized_shape, str | bytes) or any(isinstance(n, bool) for n in items):
        raise argument_error(ArgumentError, "fused_layernorm", "normalized_shape", expected, repr(normalized_shape))
    try:
        return [operator.index(n) for n in items]
    except TypeError:
        raise argument_error(
            ArgumentError, "fused_layernorm", "normalized_shape", expected, repr(normalized_shape)
        ) from None


def fused_layernorm(
    input: Tensor, normalized_shape: int | Sequence[int], weight: Tensor | None = None, bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:  # fmt: skip
    """Layer norm over the trailing dims through the selector (F.layer_norm's arguments)."""
    op = "fused_layernorm"
    dims = _dims(normalized_shape)
    _check_tensor(op, "input", input, max(1, len(dims)), f"(..., {', '.join(map(str, dims))})")
    if not dims or list(input.shape[input.dim() - len(dims) :]) != dims:
        raise argument_error(ShapeError, op, "input", f"trailing dimensions {tuple(dims)} (normalized_shape)",
                             f"shape {tuple(input.shape)}")  # fmt: skip
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and (not isinstance(t, Tensor) or list(t.shape) != dims):
            got = f"shape {tuple(t.shape)}" if isinstance(t, Tensor) else type(t).__name__
            raise argument_error(ShapeError, op, name, f"a tensor of shape {tuple(dims)} (normalized_shape)", got)
    if not isinstance(eps, numbers.Real) or isinstance(eps, bool) or not 0 <= eps < math.inf:
        raise argument_error(ArgumentError, op, "eps", "a finite number >= 0", repr(eps))
    try:
        eps = float(eps)
    except OverflowError:  # an int beyond any float
        raise argument_error(ArgumentError, op, "eps", "a finite number >= 0", repr(eps)) from None
    input, weight, bias = autocast_cast(input, weight, bias, device_type=input.device.type)
    with eager_origin():
        return torch.ops.xpuruntime.layer_norm(input, dims, weight, bias, eps)
