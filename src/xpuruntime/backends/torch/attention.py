"""PyTorch's scaled_dot_product_attention backends as candidates for the `attention` op.

The flash and cuDNN kernels call the aten op SDPA would pick (less host time than SDPA with only that
backend enabled); efficient and math call F.scaled_dot_product_attention under
torch.nn.attention.sdpa_kernel. Each declares the conditions PyTorch checks before that backend may run,
so `explain` says why one cannot run instead of PyTorch raising "No available kernel". The kernels
return SDPA's own output (`returns_output`): copied only into a caller's out= buffer.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ...abi import ArgPack
from ...context import DispatchContext
from ...registry import kernel
from .common import GPU_FLOAT_DTYPES, HALF_DTYPES, returned


def _four_dims(ctx: DispatchContext) -> str | None:
    """The fused backends take [B, H, S, D] with equal batch and heads on q, k, v (no broadcasting)."""
    q, k, v = (ctx.tensor(n) for n in ("q", "k", "v"))
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        return f"needs 4-d q, k, v ([B, H, S, D]); got {q.ndim}-d, {k.ndim}-d, {v.ndim}-d"
    if not q.shape[:2] == k.shape[:2] == v.shape[:2]:
        return f"batch/heads differ (q {q.shape[:2]}, k {k.shape[:2]}, v {v.shape[:2]}); fused kernels do not broadcast"
    return None


def _last_dim_contiguous(ctx: DispatchContext) -> str | None:
    for name in ("q", "k", "v"):
        t = ctx.tensor(name)
        if t.shape[-1] > 1 and t.strides[-1] != 1:
            return f"'{name}' last-dim stride {t.strides[-1]} (fused kernels need 1)"
    return None


def _no_mask(ctx: DispatchContext) -> str | None:
    return "does not take attn_mask (only is_causal)" if ctx.has_tensor("attn_mask") else None


def _sm80(ctx: DispatchContext) -> str | None:
    cc = ctx.compute_capability
    if cc is None or cc < (8, 0):
        return f"needs sm80+, device has {'none' if cc is None else f'sm{cc[0]}{cc[1]}'}"
    return None


def _head_dim(limit: int, multiple: int):
    def check(ctx: DispatchContext) -> str | None:
        e, ev = ctx.tensor("q").shape[-1], ctx.tensor("v").shape[-1]
        if e != ev:
            return f"value head dim {ev} differs from query head dim {e}"
        if e > limit or e % multiple:
            return f"head dim {e} not a multiple of {multiple} in [{multiple}, {limit}]"
        return None

    check.__name__ = f"head_dim_{limit}_{multiple}"
    return check


def _scale_not_negative(ctx: DispatchContext) -> str | None:
    """PyTorch's flash and cuDNN kernels return NaN for a scale < 0 (H100, PyTorch 2.11; efficient and math
    are right)."""
    scale = ctx.attrs["scale"]
    return f"scale {scale} < 0 (this fused kernel returns NaN for a negative scale)" if scale < 0 else None


def _causal_square(ctx: DispatchContext) -> str | None:
    """cuDNN aligns causal masks differently from PyTorch's top-left convention when L != S."""
    at = ctx.attrs
    if at["is_causal"] and at["L"] != at["S"]:
        return f"is_causal with L={at['L']} != S={at['S']} (cuDNN's causal alignment differs)"
    return None


def _flash_causal_square(ctx: DispatchContext) -> str | None:
    """FlashAttention-2 aligns the causal mask bottom-right when L != S; the op aligns it top-left."""
    at = ctx.attrs
    if at["is_causal"] and at["L"] != at["S"]:
        return f"is_causal with L={at['L']} != S={at['S']} (FlashAttention-2 aligns causal masks bottom-right)"
    return None


def _nonempty(ctx: DispatchContext) -> str | None:
    return "an empty dimension (fused kernels reject 0-size inputs)" if 0 in ctx.tensor("q").shape else None


MATH_MAX_SCORES = 1 << 29  # elements of the score matrix the math backend materializes (2 GiB in fp32)


def _scores_fit(ctx: DispatchContext) -> str | None:
    at = ctx.attrs
    n = math.prod(at["batch"]) * at["L"] * at["S"]
    return f"materializes a {n}-element score matrix (> {MATH_MAX_SCORES})" if n > MATH_MAX_SCORES else None


def flash_forward(q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, causal: bool, scale: float | None):
    """(out [B, H, L, Dv], lse [B, H, L]) from FlashAttention-2 (k/v may have fewer heads: GQA). The aten op
    itself: F.scaled_dot_product_attention under sdpa_kernel costs tens of µs more host time per call."""
    result = torch._scaled_dot_product_flash_attention(q4, k4, v4, 0.0, causal, False, scale=scale)
    return result[0], result[1]


def cudnn_forward(
    q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, causal: bool, scale: float | None, lse: bool = True
):  # fmt: skip
    """(out [B, H, L, Dv] laid out like q, softmax stats or an empty tensor) from cuDNN's fused attention."""
    result = torch._scaled_dot_product_cudnn_attention(q4, k4, v4, None, lse, 0.0, causal, False, scale=scale)
    return result[0], result[1]


def _blind_rows(mask: torch.Tensor) -> torch.Tensor:
    """(..., L, 1): True on the query rows the mask lets see no key."""
    if mask.dtype == torch.bool:
        return ~mask.any(dim=-1, keepdim=True)
    return (mask == float("-inf")).all(dim=-1, keepdim=True)


def exp2_safe_mask(mask: torch.Tensor | None) -> torch.Tensor | None:
    """An additive mask the memory-efficient kernel reads right. It multiplies scores by log2(e) before its exp2,
    so a value below -finfo.max / log2(e), such as Hugging Face's finfo(float32).min padding, turns into -inf
    there, and a query row whose every key has such a value comes out NaN instead of the plain average of v
    that the op (and the exported graph) computes. Values below finfo.min / 2 are raised to it; -inf stays.
    No result changes (so low a value swamps any score in float32, leaving weight 0 beside a real key and equal
    weights in a row of them) unless a row holds only such values and they differ. float16 masks cannot be
    that low: returned as they are, as are boolean masks."""
    if mask is None or mask.dtype in (torch.bool, torch.float16):
        return mask
    floor = torch.finfo(mask.dtype).min / 2
    return torch.where((mask < floor) & (mask != float("-inf")), floor, mask)


def _sdpa(args: ArgPack, backend: SDPBackend, mask: torch.Tensor | None = None) -> torch.Tensor:
    """SDPA with one backend (with `mask` instead of the call's own, given as the kernel reads it). Since
    PyTorch 2.5 the math backend (its _safe_softmax) gives 0 on a row that sees no key; the op gives NaN there
    (as the reference, flash_v2 and the CPU kernels do), so such rows are set, unless the mask is bounded (no
    such row)."""
    q, k, v, given = args.inputs
    at = args.attrs
    grouped = {"enable_gqa": True} if at.get("group", 1) > 1 else {}  # fused backends decline it (_four_dims)
    with sdpa_kernel([backend]):
        result = F.scaled_dot_product_attention(
            q, k, v, attn_mask=given if mask is None else mask, is_causal=at["is_causal"], scale=at["scale"], **grouped
        )
    if given is not None and given.numel() and not at["bounded_mask"]:
        result.masked_fill_(_blind_rows(given), float("nan"))
    return returned(args, result)


@kernel(
    "attention", "torch_flash", backend="torch", dtypes=HALF_DTYPES, priority=15, fused=True, tensor_cores=True,
    conditions=(
        _sm80, _four_dims, _last_dim_contiguous, _no_mask, _head_dim(256, 8), _flash_causal_square,
        _scale_not_negative, _nonempty,
    ),
    returns_output=True,
)  # fmt: skip
def attention_torch_flash(args: ArgPack) -> torch.Tensor:
    """PyTorch's FlashAttention-2 backend (what SDPA runs with only that backend enabled)."""
    q, k, v, _ = args.inputs
    return returned(args, flash_forward(q, k, v, args.attrs["is_causal"], args.attrs["scale"])[0])


@kernel(
    "attention", "torch_efficient", backend="torch", dtypes=GPU_FLOAT_DTYPES - {"float64"}, priority=10, fused=True,
    tensor_cores=True, conditions=(_four_dims, _last_dim_contiguous, _head_dim(512, 8), _nonempty),
    returns_output=True,
)  # fmt: skip
def attention_torch_efficient(args: ArgPack) -> torch.Tensor:
    """SDPA with only PyTorch's memory-efficient (xFormers) backend; takes masks (see exp2_safe_mask)."""
    mask = args.inputs[3]
    return _sdpa(args, SDPBackend.EFFICIENT_ATTENTION, mask if args.attrs["bounded_mask"] else exp2_safe_mask(mask))


@kernel(
    "attention", "torch_cudnn", backend="torch", dtypes=HALF_DTYPES, priority=25, fused=True, tensor_cores=True,
    conditions=(
        _sm80, _four_dims, _last_dim_contiguous, _no_mask, _head_dim(128, 8), _causal_square, _scale_not_negative,
        _nonempty,
    ),
    returns_output=True,
)  # fmt: skip
def attention_torch_cudnn(args: ArgPack) -> torch.Tensor:
    """PyTorch's cuDNN backend (its default on the H100), without the logsumexp."""
    q, k, v, _ = args.inputs
    return returned(args, cudnn_forward(q, k, v, args.attrs["is_causal"], args.attrs["scale"], lse=False)[0])


@kernel(
    "attention", "torch_math", backend="torch", dtypes=GPU_FLOAT_DTYPES, priority=0, conditions=(_scores_fit,),
    returns_output=True,
)  # fmt: skip
def attention_torch_math(args: ArgPack) -> torch.Tensor:
    """SDPA's math backend: explicit softmax(q k^T) v in PyTorch ops; any shape, dtype and mask."""
    return _sdpa(args, SDPBackend.MATH)
