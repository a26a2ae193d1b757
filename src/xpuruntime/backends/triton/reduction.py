"""Triton sum over any axes, accumulated in fp32.

Every call is brought to the form x[O, R, I] -> out[O, I] (reduce the middle axis), with strides, once
per plan. A program reduces a [BLOCK_R, BLOCK_I] tile stream; a reduction along contiguous memory
(sum(-1)) treats the rows as the I axis, so one kernel covers rows and columns. Few, very long
reductions are split along R into fp32 partials (workspace) and finished by a second pass of the same
kernel, deterministically (no atomics). Axes that do not collapse to that form are first permuted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ...abi import ArgPack, LaunchConfig
from ...context import DispatchContext
from ...registry import kernel
from .common import (
    FLOAT_DTYPES,
    as_torch,
    collapse,
    launch,
    next_pow2,
    no_negative_strides,
    out_strides,
    sm_count,
    workspace_f32,
)

TILE_ELEMENTS = 4096  # fp32 accumulator elements per program


@triton.jit
def _sum_kernel(
    x_ptr, out_ptr, R, I, n_i_blocks, r_per_split,
    sxo, sxr, sxi, soo, sos, soi, out_offset,
    BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    split = tl.program_id(1)
    o = (pid // n_i_blocks).to(tl.int64)
    i = (pid % n_i_blocks) * BLOCK_I + tl.arange(0, BLOCK_I)
    i_mask = i < I
    r_start = split * r_per_split
    r_end = tl.minimum(R, r_start + r_per_split)
    base = x_ptr + o * sxo + i[None, :].to(tl.int64) * sxi
    acc = tl.zeros([BLOCK_R, BLOCK_I], dtype=tl.float32)
    for r0 in range(r_start, r_end, BLOCK_R):
        r = r0 + tl.arange(0, BLOCK_R)
        mask = (r < r_end)[:, None] & i_mask[None, :]
        acc += tl.load(base + r[:, None].to(tl.int64) * sxr, mask=mask, other=0.0).to(tl.float32)
    total = tl.sum(acc, axis=0)
    out = out_ptr + out_offset + o * soo + split * sos + i.to(tl.int64) * soi
    tl.store(out, total.to(out_ptr.dtype.element_ty), mask=i_mask)


@dataclass(frozen=True)
class Problem:
    """x[O, R, I] -> out[O, I] in elements and strides; `permute` is set when x must be rearranged first."""

    O: int
    R: int
    I: int
    x_strides: tuple[int, int, int]
    out_strides: tuple[int, int]
    permute: tuple[int, ...] | None = None


def _one(dims: tuple[int, ...], strides: list[tuple[int, ...]]) -> tuple[int, list[int]] | None:
    """A group of dims as one (size, strides) pair, or None if they do not collapse."""
    if not dims:
        return 1, [0] * len(strides)
    shape, collapsed = collapse(dims, *strides)
    if len(shape) != 1:
        return None
    return shape[0], [s[0] for s in collapsed]


def reduce_problem(shape: tuple[int, ...], strides: tuple[int, ...], axes: tuple[int, ...],
                   out_kept_strides: tuple[int, ...]) -> Problem:  # fmt: skip
    """The (O, R, I) form of summing `axes` of a tensor, with the output's strides for the kept dims."""
    kept = [d for d in range(len(shape)) if d not in axes]
    out_of = dict(zip(kept, out_kept_strides))
    real_axes = [d for d in axes if shape[d] != 1]
    lo = min(real_axes, default=len(shape))
    hi = max(real_axes, default=len(shape))
    before = [d for d in kept if d < lo]
    after = [d for d in kept if d > hi]
    between = [d for d in kept if lo < d < hi and shape[d] != 1]
    groups = (
        _one(tuple(shape[d] for d in before), [tuple(strides[d] for d in before), tuple(out_of[d] for d in before)]),
        _one(tuple(shape[d] for d in real_axes), [tuple(strides[d] for d in real_axes)]),
        _one(tuple(shape[d] for d in after), [tuple(strides[d] for d in after), tuple(out_of[d] for d in after)]),
    )
    O_, R_, I_ = (math.prod(shape[d] for d in g) for g in (before, axes, after))
    if between or any(g is None for g in groups):
        return Problem(math.prod(shape[d] for d in kept), R_, 1, (R_, 1, 0), (1, 0), tuple(kept) + tuple(axes))
    (_, (sxo, soo)), (_, (sxr,)), (_, (sxi, soi)) = groups
    return Problem(O_, R_, I_, (sxo, sxr, sxi), (soo, soi))


def tiles(p: Problem, split_target: int) -> dict:
    """Tile sizes and the R split for a problem (rows along contiguous memory become the I axis)."""
    O, R, I, (sxo, sxr, sxi), (soo, soi) = p.O, p.R, p.I, p.x_strides, p.out_strides
    if I == 1:  # reduce along each row: rows are the independent axis
        O, I, sxi, soi, sxo, soo = 1, O, sxo, soo, 0, 0
    if sxr == 1 or I == 1:
        block_r = min(next_pow2(R), TILE_ELEMENTS)
        block_i = max(1, min(next_pow2(I), TILE_ELEMENTS // block_r, 64))
    else:
        block_i = min(next_pow2(I), 256)
        block_r = max(1, min(next_pow2(R), TILE_ELEMENTS // block_i, 64))
    n_i = triton.cdiv(I, block_i)
    programs = O * n_i
    split = 1
    if 0 < programs < split_target and 4 * block_r < R:
        split = min(triton.cdiv(R, block_r), triton.cdiv(2 * split_target, programs))
    r_per = triton.cdiv(triton.cdiv(max(R, 1), split), block_r) * block_r
    split = triton.cdiv(max(R, 1), r_per)
    warps = 8 if block_r * block_i >= 2048 else 4
    return dict(O=O, R=R, I=I, x=(sxo, sxr, sxi), out=(soo, soi), BLOCK_R=block_r, BLOCK_I=block_i,
                n_i=n_i, split=split, r_per=r_per, num_warps=warps)  # fmt: skip


def launch_sum(x: torch.Tensor, out: torch.Tensor, t: dict, partials: torch.Tensor | None = None) -> None:
    """Run the tiled sum `t` (from `tiles`) of x into out (from element `t["out_offset"]`, default 0),
    through fp32 partials when split."""
    O, I, split = t["O"], t["I"], t["split"]
    if O * I == 0:
        return
    grid = (O * t["n_i"], split)
    offset = t.get("out_offset", 0)
    if split == 1:
        launch(_sum_kernel, grid, x, out, t["R"], I, t["n_i"], t["r_per"], *t["x"], t["out"][0], 0, t["out"][1],
               offset, BLOCK_R=t["BLOCK_R"], BLOCK_I=t["BLOCK_I"], num_warps=t["num_warps"])  # fmt: skip
        return
    launch(_sum_kernel, grid, x, partials, t["R"], I, t["n_i"], t["r_per"], *t["x"], split * I, I, 1, 0,
           BLOCK_R=t["BLOCK_R"], BLOCK_I=t["BLOCK_I"], num_warps=t["num_warps"])  # fmt: skip
    second = tiles(Problem(O, split, I, (split * I, I, 1), t["out"]), split_target=0)
    second["out_offset"] = offset
    launch_sum(partials, out, second)


def _kept_out_strides(ctx: DispatchContext) -> tuple[int, ...]:
    axes, keep = ctx.attrs["axis"], ctx.attrs["keepdims"]
    strides = out_strides(ctx)
    if keep:
        return tuple(s for d, s in enumerate(strides) if d not in axes)
    return tuple(strides)


def sum_launch_config(ctx: DispatchContext) -> LaunchConfig:
    x = ctx.tensor("x")
    problem = reduce_problem(x.shape, x.strides, ctx.attrs["axis"], _kept_out_strides(ctx))
    t = tiles(problem, 2 * sm_count(ctx.device))
    params = {"tiles": t, "permute": problem.permute}
    shown = {k: t[k] for k in ("BLOCK_R", "BLOCK_I", "split", "num_warps")}
    return LaunchConfig(grid=(t["O"] * t["n_i"], t["split"]), block=(32 * t["num_warps"],), params={**params, **shown})


def sum_workspace_bytes(ctx: DispatchContext) -> int:
    t = sum_launch_config(ctx).params["tiles"]
    return 4 * t["O"] * t["split"] * t["I"] if t["split"] > 1 else 0


@kernel(
    "sum", "triton", backend="triton", dtypes=FLOAT_DTYPES, priority=25,
    conditions=(no_negative_strides,), launch_config=sum_launch_config, workspace_bytes=sum_workspace_bytes,
)  # fmt: skip
def sum_triton(args: ArgPack) -> None:
    """Tiled fp32 accumulation; each input element read once (plus a small partials pass when split)."""
    p = args.config.params
    t = p["tiles"]
    x, out = as_torch(args.inputs[0]), as_torch(args.out)
    partials = workspace_f32(args, t["O"] * t["split"] * t["I"], x.device) if t["split"] > 1 else None
    if p["permute"] is None:
        launch_sum(x, out, t, partials)
        return
    rows = x.permute(p["permute"]).reshape(t["I"], t["R"]).contiguous()  # copies only when needed
    flat = torch.empty(t["I"], dtype=out.dtype, device=out.device)
    launch_sum(rows, flat, t, partials)
    out.copy_(flat.view(out.shape))
