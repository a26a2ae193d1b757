"""Triton layer_norm and rms_norm, forward and backward, fp32 statistics.

Rows that fit in registers (N <= MAX_ONE_PASS) are read once: forward reads x and writes y; backward
reads dy and x and writes dx. Longer rows loop over chunks (Welford statistics, then the write pass).
Backward accumulates dweight/dbias per program in registers, stores one fp32 partial row per program
(workspace) and finishes with the tiled column sum: deterministic, no atomics.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ...abi import ArgPack, LaunchConfig
from ...context import DispatchContext
from ...registry import kernel
from .common import FLOAT_DTYPES, as_torch, launch, next_pow2, no_negative_strides, sm_count, workspace_f32
from .reduction import Problem, launch_sum, tiles

MAX_ONE_PASS = 16384  # row elements kept in registers
CHUNK = 4096  # row elements per step of the looped kernels
BACKWARD_PROGRAMS_PER_SM = 2


@triton.jit
def _row_stats(x, mask, N, eps, RMS: tl.constexpr):
    """Per-row (centered x or x, rstd) of a [BLOCK_M, BLOCK_N] tile holding whole rows."""
    if RMS:
        xc = x
    else:
        mean = tl.sum(x, axis=1) / N
        xc = tl.where(mask, x - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=1) / N + eps)
    return xc, rstd


@triton.jit
def _looped_stats(x_row, sxn, N, eps, RMS: tl.constexpr, BLOCK_N: tl.constexpr):
    """(mean, rstd) of one long row, chunk by chunk (Welford merges: no E[x^2]-E[x]^2 cancellation)."""
    cols = tl.arange(0, BLOCK_N)
    mean = 0.0
    m2 = 0.0
    for start in range(0, N, BLOCK_N):
        c = start + cols
        mask = c < N
        x = tl.load(x_row + c.to(tl.int64) * sxn, mask=mask, other=0.0).to(tl.float32)
        if RMS:
            m2 += tl.sum(x * x, axis=0)
        else:
            count = tl.sum(mask.to(tl.float32), axis=0)
            chunk_mean = tl.sum(x, axis=0) / count
            d = tl.where(mask, x - chunk_mean, 0.0)
            seen = start * 1.0
            total = seen + count
            delta = chunk_mean - mean
            mean += delta * count / total
            m2 += tl.sum(d * d, axis=0) + delta * delta * seen * count / total
    return mean, 1.0 / tl.sqrt(m2 / N + eps)


@triton.jit
def _norm_fwd_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, M, N, sxm, sxn, sym, syn, sw, sb, eps,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, RMS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ONE_PASS: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    if ONE_PASS:
        rows = (pid * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        cols = tl.arange(0, BLOCK_N).to(tl.int64)  # 64-bit offsets: cols * sxn may pass 2**31
        col_mask = cols < N
        mask = (rows < M)[:, None] & col_mask[None, :]
        x = tl.load(x_ptr + rows[:, None] * sxm + cols[None, :] * sxn, mask=mask, other=0.0).to(tl.float32)
        xc, rstd = _row_stats(x, mask, N, eps, RMS)
        y = xc * rstd[:, None]
        if HAS_W:
            y = y * tl.load(w_ptr + cols * sw, mask=col_mask, other=0.0).to(tl.float32)[None, :]
        if HAS_B:
            y = y + tl.load(b_ptr + cols * sb, mask=col_mask, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + rows[:, None] * sym + cols[None, :] * syn, y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        x_row = x_ptr + pid.to(tl.int64) * sxm
        y_row = y_ptr + pid.to(tl.int64) * sym
        mean, rstd = _looped_stats(x_row, sxn, N, eps, RMS, BLOCK_N)
        cols = tl.arange(0, BLOCK_N)
        for start in range(0, N, BLOCK_N):
            c = start + cols
            mask = c < N
            x = tl.load(x_row + c.to(tl.int64) * sxn, mask=mask, other=0.0).to(tl.float32)
            if RMS:
                y = x * rstd
            else:
                y = (x - mean) * rstd
            if HAS_W:
                y = y * tl.load(w_ptr + c * sw, mask=mask, other=0.0).to(tl.float32)
            if HAS_B:
                y = y + tl.load(b_ptr + c * sb, mask=mask, other=0.0).to(tl.float32)
            tl.store(y_row + c.to(tl.int64) * syn, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _norm_bwd_kernel(
    dy_ptr, x_ptr, w_ptr, dx_ptr, dw_part, M, N,
    sdym, sdyn, sxm, sxn, sdxm, sdxn, sw, eps,
    HAS_W: tl.constexpr, RMS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ONE_PASS: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N).to(tl.int64)  # 64-bit offsets: cols * sxn may pass 2**31
    part = pid.to(tl.int64) * N
    db_part = dw_part + programs.to(tl.int64) * N  # partials: [dweight rows; dbias rows], one row per program
    if ONE_PASS:
        col_mask = cols < N
        w = 1.0
        if HAS_W:
            w = tl.load(w_ptr + cols * sw, mask=col_mask, other=0.0).to(tl.float32)
        dw_acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        db_acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for block in range(pid, tl.cdiv(M, BLOCK_M), programs):
            rows = (block * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
            mask = (rows < M)[:, None] & col_mask[None, :]
            x = tl.load(x_ptr + rows[:, None] * sxm + cols[None, :] * sxn, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_ptr + rows[:, None] * sdym + cols[None, :] * sdyn, mask=mask, other=0.0).to(tl.float32)
            xc, rstd = _row_stats(x, mask, N, eps, RMS)
            xhat = xc * rstd[:, None]
            wdy = dy * w
            c1 = tl.sum(xhat * wdy, axis=1) / N
            if RMS:
                dx = (wdy - xhat * c1[:, None]) * rstd[:, None]
            else:
                c2 = tl.sum(wdy, axis=1) / N
                dx = (wdy - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
            tl.store(dx_ptr + rows[:, None] * sdxm + cols[None, :] * sdxn, dx.to(dx_ptr.dtype.element_ty), mask=mask)
            dw_acc += dy * xhat
            db_acc += dy
        tl.store(dw_part + part + cols, tl.sum(dw_acc, axis=0), mask=col_mask)
        tl.store(db_part + part + cols, tl.sum(db_acc, axis=0), mask=col_mask)
    else:
        for start in range(0, N, BLOCK_N):
            c = start + cols
            tl.store(dw_part + part + c, tl.zeros([BLOCK_N], tl.float32), mask=c < N)
            tl.store(db_part + part + c, tl.zeros([BLOCK_N], tl.float32), mask=c < N)
        for row in range(pid, M, programs):
            x_row = x_ptr + tl.cast(row, tl.int64) * sxm
            dy_row = dy_ptr + tl.cast(row, tl.int64) * sdym
            dx_row = dx_ptr + tl.cast(row, tl.int64) * sdxm
            mean, rstd = _looped_stats(x_row, sxn, N, eps, RMS, BLOCK_N)
            c1 = 0.0
            c2 = 0.0
            for start in range(0, N, BLOCK_N):
                c = start + cols
                mask = c < N
                x = tl.load(x_row + c.to(tl.int64) * sxn, mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(dy_row + c.to(tl.int64) * sdyn, mask=mask, other=0.0).to(tl.float32)
                w = 1.0
                if HAS_W:
                    w = tl.load(w_ptr + c * sw, mask=mask, other=0.0).to(tl.float32)
                if RMS:
                    xhat = x * rstd
                else:
                    xhat = tl.where(mask, x - mean, 0.0) * rstd
                c1 += tl.sum(xhat * dy * w, axis=0)
                c2 += tl.sum(dy * w, axis=0)
            c1 = c1 / N
            c2 = c2 / N
            for start in range(0, N, BLOCK_N):
                c = start + cols
                mask = c < N
                x = tl.load(x_row + c.to(tl.int64) * sxn, mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(dy_row + c.to(tl.int64) * sdyn, mask=mask, other=0.0).to(tl.float32)
                w = 1.0
                if HAS_W:
                    w = tl.load(w_ptr + c * sw, mask=mask, other=0.0).to(tl.float32)
                if RMS:
                    xhat = x * rstd
                else:
                    xhat = tl.where(mask, x - mean, 0.0) * rstd
                if RMS:
                    dx = (dy * w - xhat * c1) * rstd
                else:
                    dx = (dy * w - (xhat * c1 + c2)) * rstd
                tl.store(dx_row + c.to(tl.int64) * sdxn, dx.to(dx_ptr.dtype.element_ty), mask=mask)
                dw = tl.load(dw_part + part + c, mask=mask, other=0.0)
                tl.store(dw_part + part + c, dw + dy * xhat, mask=mask)
                db = tl.load(db_part + part + c, mask=mask, other=0.0)
                tl.store(db_part + part + c, db + dy, mask=mask)


# -- launch configuration ---------------------------------------------------------------------------


def _rows(ctx: DispatchContext, name: str = "x") -> tuple[int, int]:
    x = ctx.tensor(name)
    n = math.prod(ctx.attrs["normalized_shape"])
    return (math.prod(x.shape) // n if n else 0), n


def _tile(n: int, itemsize: int) -> dict:
    """Rows per program, block width and warps for rows of n elements."""
    if n > MAX_ONE_PASS:
        return {"BLOCK_M": 1, "BLOCK_N": CHUNK, "ONE_PASS": False, "num_warps": 8}
    block_n = next_pow2(n)
    block_m = max(1, min(16, 2048 // block_n))
    per_row_bytes = block_n * itemsize
    warps = 4 if per_row_bytes * block_m <= 4096 else (8 if per_row_bytes * block_m <= 16384 else 16)
    return {"BLOCK_M": block_m, "BLOCK_N": block_n, "ONE_PASS": True, "num_warps": warps}


def forward_launch_config(ctx: DispatchContext) -> LaunchConfig:
    m, n = _rows(ctx)
    t = _tile(n, ctx.tensor("x").itemsize)
    t.update(M=m, N=n, eps=ctx.attrs["eps"], lean=_lean(ctx, ("x",)))
    programs = triton.cdiv(m, t["BLOCK_M"]) if t["ONE_PASS"] else m
    return LaunchConfig(grid=(programs,), block=(32 * t["num_warps"],), params=t)


def backward_launch_config(ctx: DispatchContext) -> LaunchConfig:
    m, n = _rows(ctx)
    t = _tile(n, ctx.tensor("x").itemsize)
    row_blocks = triton.cdiv(m, t["BLOCK_M"])
    programs = max(1, min(row_blocks, BACKWARD_PROGRAMS_PER_SM * sm_count(ctx.device)))
    grads = 1 if ctx.op == "rms_norm_backward" else 2
    finish = tiles(Problem(grads, programs, n, (programs * n, n, 1), (n, 1)), 0)
    finish["out_offset"] = m * n  # the gradient rows follow dx in the packed (row-major) output
    t.update(M=m, N=n, P=programs, finish=finish, eps=ctx.attrs["eps"], lean=_lean(ctx, ("dy", "x")))
    return LaunchConfig(grid=(programs,), block=(32 * t["num_warps"],), params=t)


def _lean(ctx: DispatchContext, rows: tuple[str, ...]) -> bool:
    """Row-major inputs, parameters and output: launch on the arrays as they are (no views, fewer host steps)."""
    params = [n for n in ("weight", "bias") if n in ctx.arg_names and ctx.has_tensor(n)]
    dense = all(ctx.tensor(n).layout == "contiguous" for n in (*rows, *params))
    return dense and (ctx.out is None or ctx.out.layout == "contiguous")


def backward_workspace_bytes(ctx: DispatchContext) -> int:
    p = backward_launch_config(ctx).params
    return 4 * 2 * p["P"] * p["N"]


def _matrix(t: torch.Tensor, m: int, n: int) -> torch.Tensor:
    return t.reshape(m, n)  # a view where the strides allow, else a copy


def _output_matrix(out: torch.Tensor, m: int, n: int) -> tuple[torch.Tensor, bool]:
    """(an (m, n) view of out, True) or (a fresh buffer to copy into out afterwards, False)."""
    try:
        return out.view(m, n), True
    except RuntimeError:
        return torch.empty((m, n), dtype=out.dtype, device=out.device), False


def _vector(w: torch.Tensor | None) -> tuple[torch.Tensor | None, int]:
    if w is None:
        return None, 0
    w = w.reshape(-1)
    return w, w.stride(0)


def _forward(args: ArgPack, weight: torch.Tensor | None, bias: torch.Tensor | None, rms: bool) -> None:
    p = args.config.params
    m, n = p["M"], p["N"]
    out = as_torch(args.out)
    if m == 0:
        return
    if p["lean"]:
        x = as_torch(args.inputs[0])
        launch(
            _norm_fwd_kernel, args.config.grid,
            x, x if weight is None else weight, x if bias is None else bias, out, m, n, n, 1, n, 1, 1, 1, p["eps"],
            HAS_W=weight is not None, HAS_B=bias is not None, RMS=rms,
            BLOCK_M=p["BLOCK_M"], BLOCK_N=p["BLOCK_N"], ONE_PASS=p["ONE_PASS"], num_warps=p["num_warps"],
        )  # fmt: skip
        return
    x = _matrix(as_torch(args.inputs[0]), m, n)
    y, direct = _output_matrix(out, m, n)
    (w, sw), (b, sb) = _vector(weight), _vector(bias)
    launch(
        _norm_fwd_kernel, args.config.grid,
        x, w if w is not None else x, b if b is not None else x, y, m, n, *x.stride(), *y.stride(), sw, sb,
        float(args.attrs["eps"]), HAS_W=w is not None, HAS_B=b is not None, RMS=rms,
        BLOCK_M=p["BLOCK_M"], BLOCK_N=p["BLOCK_N"], ONE_PASS=p["ONE_PASS"], num_warps=p["num_warps"],
    )  # fmt: skip
    if not direct:
        out.copy_(y.view(out.shape))


def _backward(args: ArgPack, rms: bool) -> None:
    """Packed output: rows [0, M) are dx, row M is dweight, row M+1 (layer norm) is dbias."""
    p = args.config.params
    m, n, programs = p["M"], p["N"], p["P"]
    dy_in, x_in, weight = (as_torch(v) for v in args.inputs)
    out = as_torch(args.out)
    if p["lean"]:
        partials = workspace_f32(args, 2 * programs * n, out.device)
        launch(
            _norm_bwd_kernel, args.config.grid,
            dy_in, x_in, x_in if weight is None else weight, out, partials, m, n, n, 1, n, 1, n, 1, 1, p["eps"],
            HAS_W=weight is not None, RMS=rms, BLOCK_M=p["BLOCK_M"], BLOCK_N=p["BLOCK_N"], ONE_PASS=p["ONE_PASS"],
            num_warps=p["num_warps"],
        )  # fmt: skip
        launch_sum(partials, out, p["finish"])
        return
    packed, direct = _output_matrix(out, out.shape[0], n)
    x, dy = _matrix(x_in, m, n), _matrix(dy_in, m, n)
    dx = packed[:m]
    w, sw = _vector(weight)
    partials = workspace_f32(args, 2 * programs * n, packed.device)
    launch(
        _norm_bwd_kernel, args.config.grid,
        dy, x, w if w is not None else x, dx, partials, m, n,
        *dy.stride(), *x.stride(), *dx.stride(), sw, float(args.attrs["eps"]),
        HAS_W=w is not None, RMS=rms, BLOCK_M=p["BLOCK_M"], BLOCK_N=p["BLOCK_N"], ONE_PASS=p["ONE_PASS"],
        num_warps=p["num_warps"],
    )  # fmt: skip
    grads = packed[m:]
    finish = tiles(Problem(grads.shape[0], programs, n, (programs * n, n, 1), grads.stride()), 0)  # out's strides
    launch_sum(partials, grads, finish)
    if not direct:
        out.copy_(packed.view(out.shape))


# -- kernels ----------------------------------------------------------------------------------------

_HINTS = dict(backend="triton", dtypes=FLOAT_DTYPES, conditions=(no_negative_strides,))


@kernel("layer_norm", "triton", priority=30, launch_config=forward_launch_config, **_HINTS)
def layer_norm_triton(args: ArgPack) -> None:
    """One read of x and one write of y per element when a row fits in registers."""
    _, weight, bias = (as_torch(v) for v in args.inputs)
    _forward(args, weight, bias, rms=False)


@kernel("rms_norm", "triton", priority=30, launch_config=forward_launch_config, **_HINTS)
def rms_norm_triton(args: ArgPack) -> None:
    """One read of x and one write of y per element when a row fits in registers."""
    _, weight = (as_torch(v) for v in args.inputs)
    _forward(args, weight, None, rms=True)


@kernel(
    "layer_norm_backward", "triton", priority=30, launch_config=backward_launch_config,
    workspace_bytes=backward_workspace_bytes, **_HINTS,
)  # fmt: skip
def layer_norm_backward_triton(args: ArgPack) -> None:
    """dx in one pass over dy and x; dweight/dbias from per-program fp32 partials (deterministic)."""
    _backward(args, rms=False)


@kernel(
    "rms_norm_backward", "triton", priority=30, launch_config=backward_launch_config,
    workspace_bytes=backward_workspace_bytes, **_HINTS,
)  # fmt: skip
def rms_norm_backward_triton(args: ArgPack) -> None:
    """dx in one pass over dy and x; dweight from per-program fp32 partials (deterministic)."""
    _backward(args, rms=True)
