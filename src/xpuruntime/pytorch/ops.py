"""Custom ops `xpuruntime::fused_attention` and `xpuruntime::fused_layernorm` (torch.library).

Each runs its forward and backward through the selector (the policy name `torch` means PyTorch's
own kernel), has fake implementations for tracing, an autograd formula, and autocast kernels that cast
to the autocast dtype in force, so `torch.compile(fullgraph=True)` traces them without graph breaks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import ArgumentError, argument_error
from ..policy import current_policy
from .autograd_common import GRAD_ALIASES, accumulation_dtype, lse_buffer, native_layer_norm_stats, unpack_norm_grads
from .families import family_policy, using
from .routing import attrs_for, dispatch, get_dispatcher, has_op, inputs_for

TORCH_KERNEL = "torch"  # the policy name that means "PyTorch's own kernel" for these ops


def _wants_torch(op: str) -> bool:
    return current_policy().preferences.get(op) == TORCH_KERNEL


# -- fused_attention ----------------------------------------------------------------------------


@torch.library.custom_op("xpuruntime::fused_attention", mutates_args=())
def _fused_attention(
    query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None, is_causal: bool, scale: float | None
) -> tuple[Tensor, Tensor]:
    """(out, logsumexp): `attention_forward` through the selector, else PyTorch's SDPA."""
    if not _wants_torch("attention") and has_op("attention_forward"):
        lse = lse_buffer(query)
        attrs = attrs_for("attention_forward", {"is_causal": is_causal, "scale": scale})
        with using(family_policy(current_policy())):
            out = dispatch("attention_forward", (query, key, value, attn_mask, lse), attrs)
        if out is not None:
            return out, lse
    out = None
    if not _wants_torch("attention"):
        out = dispatch(
            "attention",
            (query, key, value, attn_mask),
            attrs_for("attention", {"is_causal": is_causal, "scale": scale}),
        )
    if out is None:
        out = F.scaled_dot_product_attention(query, key, value, attn_mask, 0.0, is_causal, scale=scale)
    return out, _logsumexp(query, key, attn_mask, is_causal, scale)


@_fused_attention.register_fake
def _(query, key, value, attn_mask, is_causal, scale):
    batch = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    out = query.new_empty((*batch, query.shape[-2], value.shape[-1]))
    return out, query.new_empty((*batch, query.shape[-2]), dtype=accumulation_dtype(query))


@torch.library.custom_op("xpuruntime::fused_attention_backward", mutates_args=())
def _fused_attention_backward(
    dout: Tensor, query: Tensor, key: Tensor, value: Tensor, out: Tensor, lse: Tensor, attn_mask: Tensor | None,
    is_causal: bool, scale: float | None,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """(dq, dk, dv): `attention_backward` through the selector, else PyTorch ops in fp32."""
    if not _wants_torch("attention") and has_op("attention_backward"):
        attrs = attrs_for("attention_backward", {"is_causal": is_causal, "scale": scale})
        with using(family_policy(current_policy())):
            packed = dispatch("attention_backward", (dout, query, key, value, out, lse, attn_mask), attrs)
        if isinstance(packed, tuple | list):  # a returns_output kernel's own fresh (dq, dk, dv): no clone
            return tuple(packed)
        if packed is not None:  # views of one packed array alias each other, which a custom op may not return
            sizes = [t.numel() for t in (query, key, value)]
            return tuple(p.view(t.shape).clone() for p, t in zip(packed.split(sizes), (query, key, value)))
    return _attention_grads(dout, query, key, value, out, attn_mask, is_causal, scale)


@_fused_attention_backward.register_fake
def _(dout, query, key, value, out, lse, attn_mask, is_causal, scale):
    return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)


def _scores(q: Tensor, k: Tensor, mask: Tensor | None, is_causal: bool, scale: float | None) -> Tensor:
    """Scaled, masked attention scores in fp32 (fp64 for fp64 inputs)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    dtype = accumulation_dtype(q)
    scores = torch.matmul(q.to(dtype), k.to(dtype).transpose(-1, -2)) * scale
    if is_causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        return scores.masked_fill(~keep, float("-inf"))
    if mask is not None:
        return scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.to(dtype)
    return scores


def _logsumexp(q: Tensor, k: Tensor, mask: Tensor | None, is_causal: bool, scale: float | None) -> Tensor:
    return torch.logsumexp(_scores(q, k, mask, is_causal, scale), dim=-1)


def _attention_grads(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, mask: Tensor | None, is_causal: bool,
    scale: float | None,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """Gradients of softmax(q kᵀ·scale + mask) v in fp32 (fp64 for fp64 inputs) from the saved output."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    dtype = accumulation_dtype(q)
    qf, kf, vf, dof = q.to(dtype), k.to(dtype), v.to(dtype), dout.to(dtype)
    p = torch.softmax(_scores(q, k, mask, is_causal, scale), dim=-1)
    dv = torch.matmul(p.transpose(-1, -2), dof)
    dp = torch.matmul(dof, vf.transpose(-1, -2))
    ds = p * (dp - (dof * out.to(dtype)).sum(-1, keepdim=True))
    dq = torch.matmul(ds, kf) * scale
    dk = torch.matmul(ds.transpose(-1, -2), qf) * scale
    return (dq.sum_to_size(q.shape).to(q.dtype), dk.sum_to_size(k.shape).to(k.dtype),
            dv.sum_to_size(v.shape).to(v.dtype))  # fmt: skip


def _attention_setup(ctx, inputs, output) -> None:
    query, key, value, attn_mask, is_causal, scale = inputs
    out, lse = output
    ctx.save_for_backward(query, key, value, out, lse, *(() if attn_mask is None else (attn_mask,)))
    ctx.is_causal, ctx.scale = is_causal, scale


def _attention_backward(ctx, dout, dlse):
    """Gradients for (query, key, value); the logsumexp output carries none."""
    query, key, value, out, lse, *mask = ctx.saved_tensors
    mask = mask[0] if mask else None
    grads = _fused_attention_backward(dout.contiguous(), query, key, value, out, lse, mask, ctx.is_causal, ctx.scale)
    return (*grads, None, None, None)


_fused_attention.register_autograd(_attention_backward, setup_context=_attention_setup)


def fused_attention(
    query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None, dropout_p: float = 0.0,
    is_causal: bool = False, scale: float | None = None,
) -> Tensor:  # fmt: skip
    """Scaled dot-product attention through the selector (F.scaled_dot_product_attention's arguments);
    dropout_p must be 0.0 (apply dropout outside the op)."""
    if dropout_p != 0.0:
        raise argument_error(ArgumentError, "fused_attention", "dropout_p", "0.0 (no dropout inside the op)", dropout_p)
    if attn_mask is not None and attn_mask.requires_grad and torch.is_grad_enabled():  # its gradient would be lost
        expected = "a mask that does not require grad (detach it, or use F.scaled_dot_product_attention)"
        raise argument_error(ArgumentError, "fused_attention", "attn_mask", expected, "one that requires grad")
    out, _ = _fused_attention(query, key, value, attn_mask, bool(is_causal), None if scale is None else float(scale))
    return out


# -- fused_layernorm ----------------------------------------------------------------------------


@torch.library.custom_op("xpuruntime::fused_layernorm", mutates_args=())
def _fused_layernorm(
    input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, bias: Tensor | None, eps: float
) -> Tensor:
    if not _wants_torch("layer_norm"):
        out = dispatch("layer_norm", (input, weight, bias), (tuple(normalized_shape), eps))
        if out is not None:
            return out
    return F.layer_norm(input, list(normalized_shape), weight, bias, eps)


@_fused_layernorm.register_fake
def _(input, normalized_shape, weight, bias, eps):
    return torch.empty_like(input)


@torch.library.custom_op("xpuruntime::fused_layernorm_backward", mutates_args=())
def _fused_layernorm_backward(
    dy: Tensor, input: Tensor, normalized_shape: Sequence[int], weight: Tensor | None, bias: Tensor | None,
    eps: float,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    dims = tuple(normalized_shape)
    if not _wants_torch("layer_norm") and has_op("layer_norm_backward"):
        grads = _routed_layernorm_grads(dy, input, dims, weight, bias, eps)
        if grads is not None:
            return grads
    mean, rstd = native_layer_norm_stats(input, dims, weight, bias, eps)
    mask = [True, weight is not None, bias is not None]
    dx, dw, db = torch.ops.aten.native_layer_norm_backward(dy, input, list(dims), mean, rstd, weight, bias, mask)
    return dx, _or_empty(dw, input), _or_empty(db, input)


def _routed_layernorm_grads(dy, x, dims, weight, bias, eps):
    registry = get_dispatcher().registry
    wanted = {GRAD_ALIASES.get(n, n) for n in registry.op("layer_norm_backward").inputs}
    values = {"dout": dy, "x": x, "weight": weight, "bias": bias}
    if wanted & {"mean", "rstd"}:
        axes = tuple(range(x.dim() - len(dims), x.dim()))
        var, mean = torch.var_mean(x.float(), dim=axes, keepdim=True, correction=0)
        values["mean"], values["rstd"] = mean, torch.rsqrt(var + eps)
    inputs = inputs_for("layer_norm_backward", values, GRAD_ALIASES)
    result = None
    if inputs is not None:
        result = dispatch(
            "layer_norm_backward", inputs, attrs_for("layer_norm_backward", {"normalized_shape": dims, "eps": eps})
        )
    if result is None:
        return None
    dx, dw, db = unpack_norm_grads(result, x, dims, 2)
    return _unaliased(
        (dx, _or_empty(dw if weight is not None else None, x), _or_empty(db if bias is not None else None, x))
    )


def _unaliased(tensors: tuple) -> tuple:
    """Custom-op outputs must not share memory: gradients packed in one buffer are copied apart."""
    seen: set[int] = set()
    result = []
    for t in tensors:
        ptr = t.untyped_storage().data_ptr() if t.numel() else None
        result.append(t.clone() if ptr in seen else t)
        if ptr is not None:
            seen.add(ptr)
    return tuple(result)


def _or_empty(t: Tensor | None, like: Tensor) -> Tensor:
    """Custom ops return tensors only: an absent gradient travels as an empty tensor."""
    return like.new_empty((0,)) if t is None else t


@_fused_layernorm_backward.register_fake
def _(dy, input, normalized_shape, weight, bias, eps):
    dw = input.new_empty((0,)) if weight is None else torch.empty_like(weight)
    db = input.new_empty((0,)) if bias is None else torch.empty_like(bias)
    return torch.empty_like(input), dw, db


def _layernorm_setup(ctx, inputs, output) -> None:
    input, normalized_shape, weight, bias, eps = inputs
    ctx.save_for_backward(input, *(t for t in (weight, bias) if t is not None))
    ctx.normalized_shape, ctx.eps = tuple(normalized_shape), eps
    ctx.has_weight, ctx.has_bias = weight is not None, bias is not None


def _layernorm_backward(ctx, dy):
    input, *params = ctx.saved_tensors
    weight = params.pop(0) if ctx.has_weight else None
    bias = params.pop(0) if ctx.has_bias else None
    dx, dw, db = _fused_layernorm_backward(dy, input, ctx.normalized_shape, weight, bias, ctx.eps)
    return dx, None, dw if ctx.has_weight else None, db if ctx.has_bias else None, None


_fused_layernorm.register_autograd(_layernorm_backward, setup_context=_layernorm_setup)


def fused_layernorm(
    input: Tensor, normalized_shape: int | Sequence[int], weight: Tensor | None = None, bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:  # fmt: skip
    """Layer norm over the trailing dims through the selector (F.layer_norm's arguments)."""
    dims = [normalized_shape] if isinstance(normalized_shape, int) else [int(n) for n in normalized_shape]
    return _fused_layernorm(input, dims, weight, bias, float(eps))


# -- autocast -----------------------------------------------------------------------------------


def _register_autocast(op: torch._ops.OpOverload, device_type: str) -> None:
    """Cast floating inputs to the autocast dtype in force (bf16 or fp16), then run below autocast."""
    key_name = "Autocast" + torch._C._dispatch_key_for_device(device_type)
    key = getattr(torch._C.DispatchKey, key_name)

    def cast(args: tuple) -> tuple:
        """As PyTorch's autocast: floating tensors other than float64 take the autocast dtype."""
        dtype = torch.get_autocast_dtype(device_type)
        return tuple(
            a.to(dtype) if isinstance(a, Tensor) and a.is_floating_point() and a.dtype != torch.float64 else a
            for a in args
        )

    @op.py_impl(key)
    def autocast_py(*args):
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(key)):
            return op(*cast(args))

    _LIBRARY.impl(op.name().split("::")[1], lambda keyset, *args: autocast_py(*args), key_name, with_keyset=True)


_LIBRARY = torch.library.Library("xpuruntime", "IMPL")
for _op in (torch.ops.xpuruntime.fused_attention.default, torch.ops.xpuruntime.fused_layernorm.default):
    for _device_type in ("cuda", "cpu"):
        _register_autocast(_op, _device_type)
