"""Triton rotary_embedding and its backward: q and k in one launch, one program per token.

A token is one position of the two leading axes other than the heads axis (the axis cos is unsqueezed
at), so cos and sin (gathered by position_ids when given) are loaded once per program and used for every
head of q and of k. A program rotates [heads, rotary_dim / 2] tiles: the pairs (a, b) are (j, j + R/2)
for rotate-half and (2j, 2j + 1) interleaved, so each element is read once:
    forward   y_a = x_a cos_a - x_b sin_a,   y_b = x_b cos_b + x_a sin_b
    backward  g_a = d_a cos_a + d_b sin_b,   g_b = d_b cos_b - d_a sin_a
Dims past rotary_dim are copied. Inputs may be strided (HF's q is a transposed view); the output is the
packed [q | k] buffer, each part contiguous. Memory-bound: one read of q and k, one write, plus cos and
sin once per token.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from ...abi import ArgPack, LaunchConfig
from ...context import DispatchContext
from ...registry import kernel
from .common import FLOAT_DTYPES, as_torch, launch, next_pow2, no_negative_strides


@triton.jit
def _rotate_heads(
    x_ptr, o_ptr, c_row, s_row, H, sxh, sxd, soh, scd, ssd, poison,
    HALF: tl.constexpr, D: tl.constexpr, INTERLEAVED: tl.constexpr, BACKWARD: tl.constexpr, ROUND: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr,
):  # fmt: skip
    """Rotate the [H, D] rows of one token at x_ptr (strides sxh, sxd) into o_ptr (strides soh, 1)."""
    heads = tl.arange(0, BLOCK_H).to(tl.int64)
    j = tl.arange(0, BLOCK_HALF)
    if INTERLEAVED:
        ca = 2 * j
        cb = 2 * j + 1
    else:
        ca = j
        cb = j + HALF
    jmask = j < HALF
    mask = (heads < H)[:, None] & jmask[None, :]
    cos_a = tl.load(c_row + ca * scd, mask=jmask, other=0.0).to(tl.float32) + poison
    cos_b = tl.load(c_row + cb * scd, mask=jmask, other=0.0).to(tl.float32) + poison
    sin_a = tl.load(s_row + ca * ssd, mask=jmask, other=0.0).to(tl.float32) + poison
    sin_b = tl.load(s_row + cb * ssd, mask=jmask, other=0.0).to(tl.float32) + poison
    rows = x_ptr + heads[:, None] * sxh
    xa = tl.load(rows + ca[None, :] * sxd, mask=mask, other=0.0).to(tl.float32)
    xb = tl.load(rows + cb[None, :] * sxd, mask=mask, other=0.0).to(tl.float32)
    dtype = o_ptr.dtype.element_ty
    a1 = xa * cos_a[None, :]
    b1 = xb * cos_b[None, :]
    if BACKWARD:
        a2 = xb * sin_b[None, :]
        b2 = -(xa * sin_a[None, :])
    else:
        a2 = -(xb * sin_a[None, :])
        b2 = xa * sin_b[None, :]
    if ROUND:  # PyTorch's eager form stores each product in the half dtype
        a1 = a1.to(dtype).to(tl.float32)
        a2 = a2.to(dtype).to(tl.float32)
        b1 = b1.to(dtype).to(tl.float32)
        b2 = b2.to(dtype).to(tl.float32)
    out = o_ptr + heads[:, None] * soh
    tl.store(out + ca[None, :], (a1 + a2).to(dtype), mask=mask)
    tl.store(out + cb[None, :], (b1 + b2).to(dtype), mask=mask)
    if BLOCK_PASS > 0:  # partial rotary: the dims past rotary_dim as they are
        p = 2 * HALF + tl.arange(0, BLOCK_PASS)
        pmask = (heads < H)[:, None] & (p < D)[None, :]
        tl.store(out + p[None, :], tl.load(rows + p[None, :] * sxd, mask=pmask, other=0.0).to(dtype), mask=pmask)


@triton.jit
def _rotary_kernel(
    q_ptr, k_ptr, oq_ptr, ok_ptr, cos_ptr, sin_ptr, pos_ptr, n2, Hq, Hk, P,
    sq1, sq2, sqh, sqd, sk1, sk2, skh, skd, oq1, oq2, oqh, ok1, ok2, okh,
    sc1, sc2, scd, ss1, ss2, ssd, sp1, sp2,
    HALF: tl.constexpr, D: tl.constexpr, HAS_POS: tl.constexpr, INTERLEAVED: tl.constexpr,
    BACKWARD: tl.constexpr, ROUND: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr,
    BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0).to(tl.int64)
    t1 = pid // n2
    t2 = pid % n2
    if HAS_POS:  # cos/sin are tables: row = position; one outside [0, P) poisons the token with NaN
        position = tl.load(pos_ptr + t1 * sp1 + t2 * sp2).to(tl.int64)
        valid = (position >= 0) & (position < P)
        poison = tl.where(valid, 0.0, float("nan"))
        position = tl.where(valid, position, 0)
        c_row = cos_ptr + position * sc1
        s_row = sin_ptr + position * ss1
    else:
        poison = 0.0
        c_row = cos_ptr + t1 * sc1 + t2 * sc2
        s_row = sin_ptr + t1 * ss1 + t2 * ss2
    _rotate_heads(
        q_ptr + t1 * sq1 + t2 * sq2, oq_ptr + t1 * oq1 + t2 * oq2, c_row, s_row, Hq, sqh, sqd, oqh, scd, ssd,
        poison, HALF, D, INTERLEAVED, BACKWARD, ROUND, BLOCK_HQ, BLOCK_HALF, BLOCK_PASS,
    )  # fmt: skip
    _rotate_heads(
        k_ptr + t1 * sk1 + t2 * sk2, ok_ptr + t1 * ok1 + t2 * ok2, c_row, s_row, Hk, skh, skd, okh, scd, ssd,
        poison, HALF, D, INTERLEAVED, BACKWARD, ROUND, BLOCK_HK, BLOCK_HALF, BLOCK_PASS,
    )  # fmt: skip


def launch_config(ctx: DispatchContext) -> LaunchConfig:
    at = ctx.attrs
    names = [n for n in ctx.arg_names[:2]]
    q4, k4 = ((1,) * (4 - ctx.tensor(n).ndim) + ctx.tensor(n).shape for n in names)
    t1, t2 = at["token_axes"]
    half, d = at["rotary_dim"] // 2, at["head_dim"]
    hq, hk = q4[at["head_axis"]], k4[at["head_axis"]]
    block_pass = next_pow2(d - 2 * half) if d > 2 * half else 0
    elements = next_pow2(max(hq, hk)) * max(2 * next_pow2(half), block_pass)
    params = dict(
        tokens=q4[t1] * q4[t2], n2=q4[t2], Hq=hq, Hk=hk, HALF=half, D=d, BLOCK_HQ=next_pow2(hq),
        BLOCK_HK=next_pow2(hk), BLOCK_HALF=next_pow2(half), BLOCK_PASS=block_pass,
        num_warps=1 if elements <= 256 else (2 if elements <= 1024 else 4),
    )  # fmt: skip
    return LaunchConfig(grid=(params["tokens"],), block=(32 * params["num_warps"],), params=params)


def _padded(t: torch.Tensor, ndim: int) -> torch.Tensor:
    """t with leading size-1 dims up to `ndim` (a view)."""
    return t.reshape((1,) * (ndim - t.dim()) + tuple(t.shape))


def _axis_strides(t: torch.Tensor, axes: tuple[int, ...]) -> list[int]:
    return [t.stride(a) for a in axes]


def _table_strides(table: torch.Tensor, pos: torch.Tensor | None, at: Any, shape: tuple[int, ...]) -> list[int]:
    """(row stride, 0, col stride) of a cos/sin table read by position, or the token axes' strides and col
    stride of cos/sin unsqueezed and broadcast to the 4-d leading shape."""
    if pos is not None:
        return [table.stride(0), 0, table.stride(1)]
    b = torch.broadcast_to(_padded(table.unsqueeze(at["unsqueeze_dim"]), 4), (*shape[:3], table.shape[-1]))
    return [*_axis_strides(b, at["token_axes"]), b.stride(3)]


def _run(args: ArgPack, backward: bool) -> None:
    p, at = args.config.params, args.attrs
    if p["tokens"] == 0:
        return
    q_in, k_in, cos, sin, pos = (as_torch(t) for t in args.inputs)
    q, k = _padded(q_in, 4), _padded(k_in, 4)
    out = as_torch(args.out)
    direct = out.is_contiguous()
    flat = out if direct else torch.empty(out.shape, dtype=out.dtype, device=out.device)
    oq, ok = flat[: q.numel()].view(q.shape), flat[q.numel() :].view(k.shape)
    axes, head = at["token_axes"], at["head_axis"]
    pos_strides = [0, 0]
    if pos is not None:
        b = torch.broadcast_to(_padded(pos.unsqueeze(at["unsqueeze_dim"]), 3), q.shape[:3])
        pos_strides = _axis_strides(b, axes)
    c_strides, s_strides = (_table_strides(t, pos, at, tuple(q.shape)) for t in (cos, sin))
    launch(
        _rotary_kernel, args.config.grid, q, k, oq, ok, cos, sin, cos if pos is None else pos, p["n2"], p["Hq"],
        p["Hk"], cos.shape[0],
        *_axis_strides(q, axes), q.stride(head), q.stride(3), *_axis_strides(k, axes), k.stride(head), k.stride(3),
        *_axis_strides(oq, axes), oq.stride(head), *_axis_strides(ok, axes), ok.stride(head),
        c_strides[0], c_strides[1], c_strides[2], s_strides[0], s_strides[1], s_strides[2], *pos_strides,
        HALF=p["HALF"], D=p["D"], HAS_POS=pos is not None, INTERLEAVED=at["interleaved"], BACKWARD=backward,
        ROUND=q.dtype == cos.dtype and q.dtype in (torch.float16, torch.bfloat16), BLOCK_HQ=p["BLOCK_HQ"],
        BLOCK_HK=p["BLOCK_HK"], BLOCK_HALF=p["BLOCK_HALF"], BLOCK_PASS=p["BLOCK_PASS"], num_warps=p["num_warps"],
    )  # fmt: skip
    if not direct:
        out.copy_(flat)


_HINTS = dict(backend="triton", dtypes=FLOAT_DTYPES, priority=30, launch_config=launch_config,
              conditions=(no_negative_strides,), traceable=True)  # fmt: skip


def no_float64_tables(ctx: DispatchContext) -> str | None:
    """cos and sin are read in fp32 at most."""
    return "cos/sin are float64 (these kernels compute in fp32)" if ctx.tensor("cos").dtype == "float64" else None


@kernel("rotary_embedding", "triton", **{**_HINTS, "conditions": (no_negative_strides, no_float64_tables)})
def rotary_embedding_triton(args: ArgPack) -> None:
    """q and k rotated in one launch, cos/sin read once per token."""
    _run(args, backward=False)


@kernel("rotary_embedding_backward", "triton", **{**_HINTS, "conditions": (no_negative_strides, no_float64_tables)})
def rotary_embedding_backward_triton(args: ArgPack) -> None:
    """The transposed rotation of dq and dk in one launch."""
    _run(args, backward=True)
