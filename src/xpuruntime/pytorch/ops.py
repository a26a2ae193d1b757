"""`xtorch.ops`: xpuruntime's ops on PyTorch tensors, differentiable and usable under torch.compile.

`fused_attention` and `fused_layernorm` are the custom ops `xpuruntime::attention` and `xpuruntime::layer_norm`
(see `custom_ops`) with the arguments of F.scaled_dot_product_attention and F.layer_norm; under autocast their
floating inputs other than float64 are cast to the autocast dtype first.

The fused training ops, which `patch(model)` puts into Hugging Face models: `rms_norm` (with Hugging Face's
casting), `add_rms_norm` / `add_layer_norm` (residual add + norm), `swiglu` / `geglu`, `rotary_embedding`,
`linear` (bias and activation in the GEMM's epilogue) and `linear_cross_entropy` (a head and its loss without the
logits in memory). Each follows autocast as the PyTorch code it replaces does (the op's docstring says how).

Every function checks its arguments first, so that a wrong call gets a clear `XpuRuntimeError` naming the
argument, and runs forward and backward through the selector under the policy in force (the policy name `torch`
means PyTorch's own kernel), with fake implementations for tracing and an autograd formula, so
`torch.compile(fullgraph=True)` traces it without graph breaks.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Sequence

import torch
from torch import Tensor

from ..errors import ArgumentError, ShapeError, argument_error
from .custom_ops import add_norm, glu, norm, rotary
from .custom_ops import linear as linear_ops
from .custom_ops import linear_cross_entropy as lce
from .custom_ops.common import autocast_cast, check_call, eager_origin


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


def _dims(normalized_shape: object, op: str = "fused_layernorm") -> list[int]:
    """normalized_shape as F.layer_norm takes it: an int or a sequence of ints (not a string, float or bool)."""
    expected = "an int or a sequence of ints"
    items = [normalized_shape] if not isinstance(normalized_shape, Sequence | torch.Size) else normalized_shape
    if isinstance(normalized_shape, str | bytes) or any(isinstance(n, bool) for n in items):
        raise argument_error(ArgumentError, op, "normalized_shape", expected, repr(normalized_shape))
    try:
        return [operator.index(n) for n in items]
    except TypeError:
        raise argument_error(ArgumentError, op, "normalized_shape", expected, repr(normalized_shape)) from None


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


# -- the fused training ops --------------------------------------------------------------------------


def _checked(op: str, inputs: tuple, attrs: tuple) -> None:
    if not torch.compiler.is_compiling():  # the custom ops' fakes check shapes while a graph is traced
        check_call(op, inputs, attrs)


def rms_norm(
    input: Tensor, normalized_shape: int | Sequence[int], weight: Tensor | None = None, eps: float | None = None,
    offset: float = 0.0, casting: str = "torch",
) -> Tensor:  # fmt: skip
    """F.rms_norm's arguments; `casting="llama"` rounds x_hat to the input dtype before the weight, as Hugging
    Face's LlamaRMSNorm, `offset=1.0` scales by (1 + weight), as Gemma's. No autocast casting (PyTorch's autocast
    leaves the operations of those modules alone)."""
    dims = _dims(normalized_shape, "rms_norm")
    _checked("rms_norm", (input, weight), (tuple(dims), eps, offset, casting))
    return norm.rms_norm(input, dims, weight, eps, offset, casting)


def add_rms_norm(
    x: Tensor, residual: Tensor, weight: Tensor | None = None, eps: float | None = None, offset: float = 0.0,
    casting: str = "torch",
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """(rms_norm(h), h) with h = x + residual over the last dimension (h in the dtype x and residual promote to)."""
    h = x.new_empty(x.shape, dtype=torch.promote_types(x.dtype, residual.dtype)) if isinstance(x, Tensor) else None
    _checked("add_rms_norm", (x, residual, weight, h), (eps, offset, casting))
    return add_norm.add_rms_norm(x, residual, weight, eps, offset, casting)


def add_layer_norm(
    x: Tensor, residual: Tensor, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5
) -> tuple[Tensor, Tensor]:
    """(layer_norm(h), h) with h = x + residual over the last dimension; under CUDA autocast the inputs are cast
    to float32 first, as PyTorch's autocast runs layer_norm."""
    h = x.new_empty(x.shape, dtype=torch.promote_types(x.dtype, residual.dtype)) if isinstance(x, Tensor) else None
    _checked("add_layer_norm", (x, residual, weight, bias, h), (eps,))
    return add_norm.add_layer_norm(x, residual, weight, bias, eps)


def swiglu(gate: Tensor, up: Tensor | None = None) -> Tensor:
    """silu(gate) * up, as PyTorch computes it in the inputs' dtype; up=None: gate's last dim packs [gate | up]."""
    _checked("swiglu", (gate, up), ())
    return glu.swiglu(gate, up)


def geglu(gate: Tensor, up: Tensor | None = None, approximate: str = "none") -> Tensor:
    """gelu(gate, approximate) * up (F.gelu's `approximate`); up=None: gate's last dim packs [gate | up]."""
    _checked("geglu", (gate, up), (approximate,))
    return glu.geglu(gate, up, approximate)


def rotary_embedding(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, position_ids: Tensor | None = None, unsqueeze_dim: int = 1,
    interleaved: bool = False,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """(q_embed, k_embed): Hugging Face's apply_rotary_pos_emb (rotate-half, or GPT-J's interleaved pairs), over
    the first cos.shape[-1] dims of each head; with position_ids, cos and sin are (positions, dims) tables. cos
    and sin get no gradient. Results have q's dtype."""
    _checked("rotary_embedding", (q, k, cos, sin, position_ids), (unsqueeze_dim, interleaved))
    for name, t in (("cos", cos), ("sin", sin)):
        if t.requires_grad and torch.is_grad_enabled():
            raise argument_error(ArgumentError, "rotary_embedding", name, "a tensor that does not require grad "
                                 "(the op gives cos and sin no gradient)", "one that requires grad")  # fmt: skip
    return rotary.rotary_embedding(q, k, cos, sin, position_ids, unsqueeze_dim, interleaved)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, activation: str | None = None) -> Tensor:
    """act(x @ weight.T + bias), the bias and activation ("relu", or "gelu": the tanh approximation) fused into
    the GEMM where a kernel can; under autocast the inputs are cast to its dtype first, as F.linear's are."""
    cast = autocast_cast(x, weight, bias, device_type=x.device.type) if isinstance(x, Tensor) else (x, weight, bias)
    _checked("linear", cast, (activation,))
    return linear_ops.linear(x, weight, bias, activation)


def linear_cross_entropy(
    hidden: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None = None, ignore_index: int = -100,
    label_smoothing: float = 0.0, reduction: str = "mean", z_loss_scale: float = 0.0,
) -> Tensor:  # fmt: skip
    """F.cross_entropy(F.linear(hidden, weight, bias).float(), target, ...) (+ PaLM's z-loss), computed over row
    chunks without the (rows x vocab) logits in memory; hidden (..., H), weight (V, H), target (...). Under
    autocast hidden, weight and bias are cast to its dtype first, as an nn.Linear head's are."""
    options = (ignore_index, label_smoothing, reduction, z_loss_scale)
    cast = autocast_cast(hidden, weight, bias, device_type=hidden.device.type) if isinstance(hidden, Tensor) else (
        hidden, weight, bias)  # fmt: skip
    _checked("linear_cross_entropy", (*cast[:2], target, cast[2], None, None, None), options)
    return lce.linear_cross_entropy(hidden, weight, target, bias, *options)
