"""Triton softmax along one axis, fp32 math.

The call becomes x[O, R, I] (softmax along R) with strides, once per plan. A row that fits one tile is
read once and written once; a longer one takes an online pass (running max and sum) and a writing pass.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ...abi import ArgPack, LaunchConfig
from ...context import DispatchContext
from ...registry import kernel
from .common import FLOAT_DTYPES, as_torch, collapse, launch, next_pow2, no_negative_strides, out_strides

MAX_ONE_PASS = 16384  # elements of a row kept in registers


@triton.jit
def _softmax_kernel(
    x_ptr, y_ptr, R, I, n_i_blocks, sxo, sxr, sxi, syo, syr, syi,
    BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr, ONE_PASS: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    o = (pid // n_i_blocks).to(tl.int64)
    i = (pid % n_i_blocks) * BLOCK_I + tl.arange(0, BLOCK_I)
    i_mask = i < I
    x_base = x_ptr + o * sxo + i[None, :].to(tl.int64) * sxi
    y_base = y_ptr + o * syo + i[None, :].to(tl.int64) * syi
    r = tl.arange(0, BLOCK_R)
    if ONE_PASS:
        mask = (r < R)[:, None] & i_mask[None, :]
        x = tl.load(x_base + r[:, None].to(tl.int64) * sxr, mask=mask, other=-float("inf")).to(tl.float32)
        m = tl.max(x, axis=0)
        m = tl.where(m == -float("inf"), 0.0, m)  # a row of -inf: 0/0 = NaN below, as PyTorch
        e = tl.exp(x - m[None, :])
        y = e / tl.sum(e, axis=0)[None, :]
        tl.store(y_base + r[:, None].to(tl.int64) * syr, y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        m = tl.full([BLOCK_I], -float("inf"), tl.float32)
        s = tl.zeros([BLOCK_I], tl.float32)
        for r0 in range(0, R, BLOCK_R):
            rr = r0 + r
            mask = (rr < R)[:, None] & i_mask[None, :]
            x = tl.load(x_base + rr[:, None].to(tl.int64) * sxr, mask=mask, other=-float("inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, axis=0))
            shift = tl.where(m_new == -float("inf"), 0.0, m_new)
            s = s * tl.exp(m - shift) + tl.sum(tl.exp(x - shift[None, :]), axis=0)
            m = m_new
        shift = tl.where(m == -float("inf"), 0.0, m)
        for r0 in range(0, R, BLOCK_R):
            rr = r0 + r
            mask = (rr < R)[:, None] & i_mask[None, :]
            x = tl.load(x_base + rr[:, None].to(tl.int64) * sxr, mask=mask, other=-float("inf")).to(tl.float32)
            y = tl.exp(x - shift[None, :]) / s[None, :]
            tl.store(y_base + rr[:, None].to(tl.int64) * syr, y.to(y_ptr.dtype.element_ty), mask=mask)


def _group(dims: tuple[int, ...], *strides: tuple[int, ...]) -> tuple[int, list[int]] | None:
    if not dims:
        return 1, [0] * len(strides)
    shape, collapsed = collapse(dims, *strides)
    return (shape[0], [s[0] for s in collapsed]) if len(shape) == 1 else None


def softmax_launch_config(ctx: DispatchContext) -> LaunchConfig:
    x = ctx.tensor("x")
    axis = ctx.attrs["axis"]
    ys = out_strides(ctx)
    shape = x.shape
    before, after = range(axis), range(axis + 1, len(shape))
    g_before = _group(
        tuple(shape[d] for d in before), tuple(x.strides[d] for d in before), tuple(ys[d] for d in before)
    )
    g_after = _group(tuple(shape[d] for d in after), tuple(x.strides[d] for d in after), tuple(ys[d] for d in after))
    O, R, I = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1 :])
    contiguous = g_before is None or g_after is None  # rearrange into a contiguous copy first
    if contiguous:
        sx = sy = (R * I, I, 1)
    else:
        sx = (g_before[1][0], x.strides[axis], g_after[1][0])
        sy = (g_before[1][1], ys[axis], g_after[1][1])
    if I == 1:  # rows along R: rows are the independent axis
        O, I = 1, O
        sx, sy = (0, sx[1], sx[0]), (0, sy[1], sy[0])
    one_pass = R <= MAX_ONE_PASS
    block_r = next_pow2(R) if one_pass else 4096
    block_i = max(1, min(next_pow2(I), 4096 // block_r, 64)) if sx[1] == 1 else min(next_pow2(I), 128)
    if one_pass:
        block_i = max(1, min(block_i, MAX_ONE_PASS // block_r))
    else:
        block_r = max(1, 4096 // block_i)
    n_i = triton.cdiv(I, block_i)
    warps = min(16, max(4, block_r * block_i // 512))
    params = {"R": R, "I": I, "n_i": n_i, "sx": sx, "sy": sy, "BLOCK_R": block_r, "BLOCK_I": block_i,
              "ONE_PASS": one_pass, "num_warps": warps, "copy": contiguous}  # fmt: skip
    return LaunchConfig(grid=(O * n_i,), block=(32 * warps,), params=params)


@kernel(
    "softmax", "triton", backend="triton", dtypes=FLOAT_DTYPES, priority=15,
    conditions=(no_negative_strides,), launch_config=softmax_launch_config,
)  # fmt: skip
def softmax_triton(args: ArgPack) -> None:
    """One read and one write per element when a row fits a tile; else an online pass then a write."""
    p = args.config.params
    x, out = as_torch(args.inputs[0]), as_torch(args.out)
    if x.numel() == 0:
        return
    y = out
    if p["copy"]:
        x = x.contiguous()
        y = out if out.is_contiguous() else torch.empty_like(x)
    launch(
        _softmax_kernel, args.config.grid,
        x, y, p["R"], p["I"], p["n_i"], *p["sx"], *p["sy"],
        BLOCK_R=p["BLOCK_R"], BLOCK_I=p["BLOCK_I"], ONE_PASS=p["ONE_PASS"], num_warps=p["num_warps"],
    )  # fmt: skip
    if y is not out:
        out.copy_(y)
