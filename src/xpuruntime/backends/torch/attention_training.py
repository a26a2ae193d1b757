"""PyTorch's fused SDPA backends as candidates for the training ops `attention_forward` and `attention_backward`.

Each kernel calls the aten op behind one SDPA backend directly (the ops autograd saves and replays):
`torch_flash` (aten._scaled_dot_product_flash_attention / _backward, FlashAttention-2), `torch_cudnn`
(aten._scaled_dot_product_cudnn_attention / _backward) and `torch_efficient`
(aten._scaled_dot_product_efficient_attention / _backward, the xFormers kernel, which takes a mask as an
additive bias). Only arguments whose meaning is the same in PyTorch 2.11 and later are passed.

The logsumexp. The op's `lse` is float32, contiguous, shape (*batch, L): the natural-log logsumexp of
each row of scaled, masked scores, +inf for a row that sees no key (flash_v2 and the CPU kernel write
the same). The backends' own formats, converted on the way in and out:
- flash: [B, H, L] float32, natural log of the scaled scores: the op's format as it is.
- cuDNN: [B, H, L, 1] float32 ("softmax stats", natural log of the scaled scores): the same values with a
  trailing unit dim; the backward gets the op's buffer viewed as [B, H, L, 1].
- efficient: [B, H, ceil(L/32)*32] float32 (the kernel reads whole 32-row blocks), natural log of the
  scaled, biased scores: the forward copies the first L columns; the backward passes the op's buffer
  when L % 32 == 0, else a padded copy.
So every backward accepts any kernel's forward (flash_v2, math or another of these): the pairing the
dispatcher makes under auto, a policy or autotune never depends on which forward ran.

Dropout is always 0 here, so the philox seed/offset the backward ops take are never read: uninitialized
scalars are passed (no fill kernel, safe under CUDA graph capture). A row that sees no key exists only with
a mask (causal masks are aligned top-left, so row i sees key 0), hence only for torch_efficient: its
forward marks such rows as the op says (out NaN, lse +inf) and its backward gives them no gradient.
Grouped-query attention: FlashAttention-2 takes fewer key/value heads natively (forward and backward);
torch_cudnn and torch_efficient decline it with a reason.

The forwards never allocate more than aten does; the backwards copy dq, dk, dv into the packed output (the
aten ops take no output buffers).
"""

from __future__ import annotations

import functools
import math

import torch

from ...abi import ArgPack, LaunchConfig
from ...context import DispatchContext
from ...registry import kernel
from .attention import _causal_square, _head_dim, _last_dim_contiguous, _no_mask, _nonempty, _sm80
from .common import HALF_DTYPES

aten = torch.ops.aten
EFFICIENT_DTYPES = frozenset({"float16", "bfloat16", "float32"})
EFFICIENT_LSE_ALIGN = 32  # rows per block of the efficient kernel's logsumexp
EFFICIENT_BIAS_ALIGN = 16  # elements; the bias's row stride must be a multiple (PyTorch pads the same way)


# ----------------------------------------------------------------------------------------------- conditions


def _rank(ctx: DispatchContext) -> str | None:
    for name in ("q", "k", "v"):
        if ctx.tensor(name).ndim > 4:
            return f"'{name}' has {ctx.tensor(name).ndim} dims; at most 2 batch dims ([B, H, S, D])"
    return None


def _equal_heads(ctx: DispatchContext) -> str | None:
    """cuDNN and efficient take k/v with q's heads here; GQA runs on torch_flash or flash_v2."""
    group = ctx.attrs.get("group", 1)
    if group > 1:
        hq, hk = ctx.tensor("q").shape[-3], ctx.tensor("k").shape[-3]
        return f"grouped-query attention ({hq} query heads, {hk} key/value heads): needs equal heads"
    return None


def _flash_causal_square(ctx: DispatchContext) -> str | None:
    """FlashAttention-2 aligns the causal mask bottom-right when L != S; the op aligns it top-left."""
    at = ctx.attrs
    if at["is_causal"] and at["L"] != at["S"]:
        return f"is_causal with L={at['L']} != S={at['S']} (FlashAttention-2 aligns causal masks bottom-right)"
    return None


FLASH_CONDITIONS = (_sm80, _rank, _last_dim_contiguous, _no_mask, _head_dim(256, 8), _flash_causal_square, _nonempty)
CUDNN_CONDITIONS = (
    _sm80, _rank, _equal_heads, _last_dim_contiguous, _no_mask, _head_dim(128, 8), _causal_square, _nonempty,
)  # fmt: skip
EFFICIENT_CONDITIONS = (_rank, _equal_heads, _last_dim_contiguous, _head_dim(512, 8), _nonempty)


def _launch_config(ctx: DispatchContext) -> LaunchConfig:
    return LaunchConfig(params={"adopt": ctx.out is None})  # the dispatcher owns the output: adopt, no copy


# ----------------------------------------------------------------------------------------------- layouts


def _view4(t: torch.Tensor) -> torch.Tensor:
    """(..., S, D) with at most 2 batch dims -> [B, H, S, D] (a view)."""
    return t.reshape((1,) * (4 - t.ndim) + tuple(t.shape)) if t.ndim < 4 else t


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.shape[-1] <= 1 or t.stride(-1) == 1 else t.contiguous()


def _dense_strides(shape: tuple[int, ...], like: torch.Tensor) -> tuple[int, ...]:
    """Dense strides for `shape` in the dimension order of `like` (innermost = smallest stride), as
    PyTorch's cuDNN path lays out its output (alloc_with_matching_layout)."""
    order = sorted(range(len(shape)), key=like.stride)  # innermost first; ties keep index order, as PyTorch
    strides = [0] * len(shape)
    step = 1
    for i in order:
        strides[i] = step
        step *= shape[i]
    return tuple(strides)


def _same_strides(t: torch.Tensor, strides: tuple[int, ...]) -> bool:
    return all(n <= 1 or s == w for n, s, w in zip(t.shape, t.stride(), strides))


def _in_layout_of(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`t` itself when it is dense in `like`'s dimension order, else a copy laid out so.

    cuDNN's backward caches its graph by q/k/v strides only, so out and grad_out must always come in one
    layout per q layout: the one its forward produces."""
    strides = _dense_strides(tuple(t.shape), like)
    if _same_strides(t, strides):
        return t
    return torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device).copy_(t)


def _store(args: ArgPack, result: torch.Tensor) -> None:
    out = args.out
    if args.config.params.get("adopt") and result.shape == out.shape and result.dtype == out.dtype:
        out.set_(result)
    else:
        out.copy_(result.reshape(out.shape))


def _unused_rng(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The philox seed and offset a backward takes; never read with dropout 0 (so left uninitialized)."""
    return torch.empty((), dtype=torch.int64, device=device), torch.empty((), dtype=torch.int64, device=device)


def _lse3(lse: torch.Tensor, q4: torch.Tensor) -> torch.Tensor:
    """The op's logsumexp as a contiguous [B, H, L] (a view unless a caller passed a strided one)."""
    return lse.reshape(q4.shape[:3]).contiguous()


def _unpack_into(args: ArgPack, q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, grads: tuple) -> None:
    a, b, c = args.attrs["sizes"]
    packed = args.out
    packed[:a].view(q4.shape).copy_(grads[0])
    packed[a : a + b].view(k4.shape).copy_(grads[1])
    packed[a + b : a + b + c].view(v4.shape).copy_(grads[2])


# ----------------------------------------------------------------------------------------------- flash


def flash_forward(q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, causal: bool, scale: float):
    """(out [B, H, L, Dv], lse [B, H, L]) from FlashAttention-2 (k/v may have fewer heads: GQA)."""
    result = aten._scaled_dot_product_flash_attention.default(q4, k4, v4, 0.0, causal, False, scale=scale)
    return result[0], result[1]


def flash_backward(do4, q4, k4, v4, o4, lse3, causal: bool, scale: float):
    seed, offset = _unused_rng(q4.device)
    L, S = q4.shape[2], k4.shape[2]
    return aten._scaled_dot_product_flash_attention_backward.default(
        do4, q4, k4, v4, o4, lse3, None, None, L, S, 0.0, causal, seed, offset, scale=scale
    )


@kernel(
    "attention_forward", "torch_flash", backend="torch", dtypes=HALF_DTYPES, priority=22, fused=True,
    tensor_cores=True, conditions=FLASH_CONDITIONS, launch_config=_launch_config,
)  # fmt: skip
def attention_forward_torch_flash(args: ArgPack) -> None:
    """PyTorch's FlashAttention-2 forward (aten._scaled_dot_product_flash_attention); GQA natively."""
    q, k, v, _, lse = args.inputs
    at = args.attrs
    out4, lse3 = flash_forward(_view4(q), _view4(k), _view4(v), at["is_causal"], at["scale"])
    lse.view(lse3.shape).copy_(lse3)
    _store(args, out4.view(args.out.shape))


@kernel(
    "attention_backward", "torch_flash", backend="torch", dtypes=HALF_DTYPES, priority=22, fused=True,
    tensor_cores=True, deterministic=False, conditions=FLASH_CONDITIONS,
)  # fmt: skip
def attention_backward_torch_flash(args: ArgPack) -> None:
    """PyTorch's FlashAttention-2 backward; takes any forward's (out, lse) (lse is the op's [B, H, L])."""
    do, q, k, v, out, lse, _ = args.inputs
    at = args.attrs
    q4, k4, v4 = _view4(q), _view4(k), _view4(v)
    do4, o4 = _unit_last(_view4(do)), _unit_last(_view4(out))
    lse3 = _lse3(lse, q4)
    grads = flash_backward(do4, q4, k4, v4, o4, lse3, at["is_causal"], at["scale"])
    _unpack_into(args, q4, k4, v4, grads)


# ----------------------------------------------------------------------------------------------- cuDNN


@functools.cache
def _cudnn_stats_rank() -> int:
    """The rank of the logsumexp cuDNN's forward returns ([B, H, L, 1] so far), from its meta kernel."""
    try:
        t = torch.empty((1, 1, 8, 8), dtype=torch.float16, device="meta")
        stats = aten._scaled_dot_product_cudnn_attention.default(t, t, t, None, True, 0.0, False, False)[1]
        return stats.dim()
    except Exception:
        return 4


def cudnn_forward(q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, causal: bool, scale: float):
    """(out [B, H, L, Dv] laid out like q, softmax stats) from cuDNN's fused attention."""
    result = aten._scaled_dot_product_cudnn_attention.default(q4, k4, v4, None, True, 0.0, causal, False,
                                                              scale=scale)  # fmt: skip
    return result[0], result[1]


def cudnn_backward(do4, q4, k4, v4, o4, lse3, causal: bool, scale: float):
    seed, offset = _unused_rng(q4.device)
    o4 = _in_layout_of(o4, q4)
    do4 = _in_layout_of(do4, o4)  # PyTorch would permute it to out's layout itself, with a warning
    stats = lse3.unsqueeze(-1) if _cudnn_stats_rank() == 4 else lse3
    L, S = q4.shape[2], k4.shape[2]
    return aten._scaled_dot_product_cudnn_attention_backward.default(
        do4, q4, k4, v4, o4, stats, seed, offset, None, None, None, L, S, 0.0, causal, scale=scale
    )


@kernel(
    "attention_forward", "torch_cudnn", backend="torch", dtypes=HALF_DTYPES, priority=25, fused=True,
    tensor_cores=True, conditions=CUDNN_CONDITIONS, launch_config=_launch_config,
)  # fmt: skip
def attention_forward_torch_cudnn(args: ArgPack) -> None:
    """cuDNN's fused attention forward with its softmax stats (PyTorch's default SDPA backend on the H100)."""
    q, k, v, _, lse = args.inputs
    at = args.attrs
    q4 = _view4(q)
    out4, stats = cudnn_forward(q4, _view4(k), _view4(v), at["is_causal"], at["scale"])
    lse.view(q4.shape[:3]).copy_(stats.reshape(q4.shape[:3]))
    _store(args, out4.view(args.out.shape))


@kernel(
    "attention_backward", "torch_cudnn", backend="torch", dtypes=HALF_DTYPES, priority=25, fused=True,
    tensor_cores=True, deterministic=False, conditions=CUDNN_CONDITIONS,
)  # fmt: skip
def attention_backward_torch_cudnn(args: ArgPack) -> None:
    """cuDNN's fused attention backward; takes any forward's (out, lse) (lse viewed as [B, H, L, 1])."""
    do, q, k, v, out, lse, _ = args.inputs
    at = args.attrs
    q4, k4, v4 = _view4(q), _view4(k), _view4(v)
    grads = cudnn_backward(_view4(do), q4, k4, v4, _view4(out), _lse3(lse, q4), at["is_causal"],
                           at["scale"])  # fmt: skip
    _unpack_into(args, q4, k4, v4, grads)


# ----------------------------------------------------------------------------------------------- efficient


def efficient_bias(mask: torch.Tensor | None, q4: torch.Tensor, S: int) -> torch.Tensor | None:
    """The mask as the efficient kernel's additive bias: q's dtype, -inf where a bool mask is False, in a
    buffer whose rows are padded to 16 elements, expanded to [B, H, L, S] (as PyTorch's SDPA prepares it)."""
    if mask is None:
        return None
    B, H, L = q4.shape[:3]
    m = mask.reshape((1,) * (4 - mask.ndim) + tuple(mask.shape)) if mask.ndim < 4 else mask
    rows = (m.shape[0], m.shape[1], L, S)
    padded = math.ceil(S / EFFICIENT_BIAS_ALIGN) * EFFICIENT_BIAS_ALIGN
    bias = torch.empty((*rows[:3], padded), dtype=q4.dtype, device=q4.device)[..., :S]
    if m.dtype == torch.bool:
        bias.zero_().masked_fill_(~m, float("-inf"))
    else:
        bias.copy_(m.expand(rows))
    return bias.expand(B, H, L, S)


def efficient_forward(q4, k4, v4, bias, causal: bool, scale: float):
    """(out [B, H, L, Dv], logsumexp [B, H, ceil(L/32)*32]) from the efficient kernel."""
    result = aten._scaled_dot_product_efficient_attention.default(q4, k4, v4, bias, True, 0.0, causal, scale=scale)
    return result[0], result[1]


def efficient_backward(do4, q4, k4, v4, o4, lse3, bias, causal: bool, scale: float):
    seed, offset = _unused_rng(q4.device)
    L = q4.shape[2]
    if L % EFFICIENT_LSE_ALIGN:  # the kernel reads whole 32-row blocks of the logsumexp
        padded = lse3.new_empty((*lse3.shape[:2], math.ceil(L / EFFICIENT_LSE_ALIGN) * EFFICIENT_LSE_ALIGN))
        padded[..., L:].fill_(float("inf"))
        padded[..., :L].copy_(lse3)
        lse3 = padded
    grads = aten._scaled_dot_product_efficient_attention_backward.default(
        do4, q4, k4, v4, bias, o4, lse3, seed, offset, 0.0, [True, True, True, False], causal, scale=scale
    )
    return grads[:3]


@kernel(
    "attention_forward", "torch_efficient", backend="torch", dtypes=EFFICIENT_DTYPES, priority=10, fused=True,
    tensor_cores=True, conditions=EFFICIENT_CONDITIONS, launch_config=_launch_config,
)  # fmt: skip
def attention_forward_torch_efficient(args: ArgPack) -> None:
    """PyTorch's memory-efficient (xFormers) forward; takes masks (as an additive bias) and float32."""
    q, k, v, mask, lse = args.inputs
    at = args.attrs
    q4 = _view4(q)
    L = q4.shape[2]
    out4, lse_padded = efficient_forward(q4, _view4(k), _view4(v), efficient_bias(mask, q4, at["S"]),
                                         at["is_causal"], at["scale"])  # fmt: skip
    lse3 = lse.view(q4.shape[:3])
    lse3.copy_(lse_padded[..., :L])
    if mask is not None:  # rows that see no key: out NaN, lse +inf (the op's convention)
        empty = ~torch.isfinite(lse3)
        lse3.masked_fill_(empty, float("inf"))
        out4 = out4.masked_fill(empty.unsqueeze(-1), float("nan"))
    _store(args, out4.view(args.out.shape))


@kernel(
    "attention_backward", "torch_efficient", backend="torch", dtypes=EFFICIENT_DTYPES, priority=10, fused=True,
    tensor_cores=True, deterministic=False, conditions=EFFICIENT_CONDITIONS,
)  # fmt: skip
def attention_backward_torch_efficient(args: ArgPack) -> None:
    """PyTorch's memory-efficient backward; takes any forward's (out, lse) (lse padded to 32 rows)."""
    do, q, k, v, out, lse, mask = args.inputs
    at = args.attrs
    q4, k4, v4 = _view4(q), _view4(k), _view4(v)
    lse3 = _lse3(lse, q4)
    o4 = _view4(out)
    if mask is not None:  # rows that saw no key (lse +inf, out NaN) must give no gradient: out -> 0 there
        o4 = o4.masked_fill(torch.isinf(lse3).unsqueeze(-1), 0.0)
    grads = efficient_backward(_unit_last(_view4(do)), q4, k4, v4, _unit_last(o4), lse3,
                               efficient_bias(mask, q4, at["S"]), at["is_causal"], at["scale"])  # fmt: skip
    _unpack_into(args, q4, k4, v4, grads)


__all__ = [
    "cudnn_backward",
    "cudnn_forward",
    "efficient_backward",
    "efficient_bias",
    "efficient_forward",
    "flash_backward",
    "flash_forward",
]
