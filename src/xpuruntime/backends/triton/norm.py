"""Triton layer_norm and rms_norm, forward and backward, fp32 statistics; also the residual-add forms
(add_layer_norm / add_rms_norm and their backward ops), which are the same kernels with a flag.

Rows that fit in registers (N <= MAX_ONE_PASS) are read once: forward reads x and writes y; backward
reads dy and x and writes dx. Longer rows loop over chunks (Welford statistics, then the write pass).
Backward accumulates dweight/dbias per program in registers, stores one fp32 partial row per program
(workspace) and finishes with the tiled column sum: deterministic, no atomics.

The add forms read x and residual, round their sum h to h's dtype (what `x + residual` stores), write h
and normalize it: one read of each input, two writes (h and y). Their backward adds the gradient that
reaches h from the residual stream (dh) to dx in the same pass. RMS options (ops/norm.py): `offset` is
added to the weight; casting "llama" rounds x_hat to the input dtype before the weight (and the backward
takes the same roundings: w*dy rounded, dweight from the rounded x_hat).
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
def _load_input(x_ptrs, r_ptrs, h_ptrs, mask, HAS_RES: tl.constexpr, STORE_H: tl.constexpr):
    """x as fp32; with HAS_RES, h = x + residual rounded to h's dtype (stored when STORE_H) instead."""
    x = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        h = (x + tl.load(r_ptrs, mask=mask, other=0.0).to(tl.float32)).to(h_ptrs.dtype.element_ty)
        if STORE_H:
            tl.store(h_ptrs, h, mask=mask)
        x = h.to(tl.float32)
    return x


@triton.jit
def _looped_stats(x_row, sxn, r_row, srn, h_row, N, eps, RMS: tl.constexpr, HAS_RES: tl.constexpr,
                  BLOCK_N: tl.constexpr):  # fmt: skip
    """(mean, rstd) of one long row (of x + residual with HAS_RES), chunk by chunk (Welford merges: no
    E[x^2]-E[x]^2 cancellation)."""
    cols = tl.arange(0, BLOCK_N)
    mean = 0.0
    m2 = 0.0
    for start in range(0, N, BLOCK_N):
        c = start + cols
        mask = c < N
        c64 = c.to(tl.int64)
        x = _load_input(x_row + c64 * sxn, r_row + c64 * srn, h_row + c64, mask, HAS_RES, False)
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
    x_ptr, w_ptr, b_ptr, y_ptr, r_ptr, h_ptr, M, N, sxm, sxn, sym, syn, srm, srn, sw, sb, eps, offset,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, RMS: tl.constexpr, HAS_RES: tl.constexpr, CAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ONE_PASS: tl.constexpr,
):  # fmt: skip
    """y = norm(x) (or h = x + residual, stored contiguous, and y = norm(h)); h is (M, N) row-major."""
    eps, offset = tl.cast(eps, tl.float32), tl.cast(offset, tl.float32)  # fp32 also where inductor passes fp64
    pid = tl.program_id(0)
    if ONE_PASS:
        rows = (pid * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        cols = tl.arange(0, BLOCK_N).to(tl.int64)  # 64-bit offsets: cols * sxn may pass 2**31
        col_mask = cols < N
        mask = (rows < M)[:, None] & col_mask[None, :]
        x = _load_input(x_ptr + rows[:, None] * sxm + cols[None, :] * sxn,
                        r_ptr + rows[:, None] * srm + cols[None, :] * srn,
                        h_ptr + rows[:, None] * N + cols[None, :], mask, HAS_RES, True)  # fmt: skip
        xc, rstd = _row_stats(x, mask, N, eps, RMS)
        y = xc * rstd[:, None]
        if CAST:
            y = y.to(y_ptr.dtype.element_ty).to(tl.float32)
        if HAS_W:
            y = y * (tl.load(w_ptr + cols * sw, mask=col_mask, other=0.0).to(tl.float32)[None, :] + offset)
        if HAS_B:
            y = y + tl.load(b_ptr + cols * sb, mask=col_mask, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + rows[:, None] * sym + cols[None, :] * syn, y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        row = pid.to(tl.int64)
        x_row, r_row, h_row, y_row = x_ptr + row * sxm, r_ptr + row * srm, h_ptr + row * N, y_ptr + row * sym
        mean, rstd = _looped_stats(x_row, sxn, r_row, srn, h_row, N, eps, RMS, HAS_RES, BLOCK_N)
        cols = tl.arange(0, BLOCK_N)
        for start in range(0, N, BLOCK_N):
            c = start + cols
            mask = c < N
            c64 = c.to(tl.int64)
            x = _load_input(x_row + c64 * sxn, r_row + c64 * srn, h_row + c64, mask, HAS_RES, True)
            if RMS:
                y = x * rstd
            else:
                y = (x - mean) * rstd
            if CAST:
                y = y.to(y_ptr.dtype.element_ty).to(tl.float32)
            if HAS_W:
                y = y * (tl.load(w_ptr + c * sw, mask=mask, other=0.0).to(tl.float32) + offset)
            if HAS_B:
                y = y + tl.load(b_ptr + c * sb, mask=mask, other=0.0).to(tl.float32)
            tl.store(y_row + c64 * syn, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _weighted_grad(dy, w, dtype: tl.constexpr, CAST: tl.constexpr):
    """dy * (weight + offset), rounded to the input dtype under CAST (the forward's product was)."""
    wdy = dy * w
    if CAST:
        wdy = wdy.to(dtype).to(tl.float32)
    return wdy


@triton.jit
def _norm_bwd_kernel(
    dy_ptr, x_ptr, w_ptr, dx_ptr, dw_part, ds_ptr, M, N,
    sdym, sdyn, sxm, sxn, sdxm, sdxn, sdsm, sdsn, sw, eps, offset,
    HAS_W: tl.constexpr, RMS: tl.constexpr, HAS_DS: tl.constexpr, CAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ONE_PASS: tl.constexpr,
):  # fmt: skip
    """dx (+ ds, the gradient reaching the normalized input from elsewhere, with HAS_DS) and per-program
    partial rows of dweight and dbias."""
    eps, offset = tl.cast(eps, tl.float32), tl.cast(offset, tl.float32)  # fp32 also where inductor passes fp64
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N).to(tl.int64)  # 64-bit offsets: cols * sxn may pass 2**31
    part = pid.to(tl.int64) * N
    db_part = dw_part + programs.to(tl.int64) * N  # partials: [dweight rows; dbias rows], one row per program
    dtype = x_ptr.dtype.element_ty
    if ONE_PASS:
        col_mask = cols < N
        w = 1.0
        if HAS_W:
            w = tl.load(w_ptr + cols * sw, mask=col_mask, other=0.0).to(tl.float32) + offset
        dw_acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        db_acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for block in range(pid, tl.cdiv(M, BLOCK_M), programs):
            rows = (block * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
            mask = (rows < M)[:, None] & col_mask[None, :]
            x = tl.load(x_ptr + rows[:, None] * sxm + cols[None, :] * sxn, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_ptr + rows[:, None] * sdym + cols[None, :] * sdyn, mask=mask, other=0.0).to(tl.float32)
            xc, rstd = _row_stats(x, mask, N, eps, RMS)
            xhat = xc * rstd[:, None]
            wdy = _weighted_grad(dy, w, dtype, CAST)
            c1 = tl.sum(xhat * wdy, axis=1) / N
            if RMS:
                dx = (wdy - xhat * c1[:, None]) * rstd[:, None]
            else:
                c2 = tl.sum(wdy, axis=1) / N
                dx = (wdy - (xhat * c1[:, None] + c2[:, None])) * rstd[:, None]
            if HAS_DS:
                ds = tl.load(ds_ptr + rows[:, None] * sdsm + cols[None, :] * sdsn, mask=mask, other=0.0)
                dx += ds.to(tl.float32)
            tl.store(dx_ptr + rows[:, None] * sdxm + cols[None, :] * sdxn, dx.to(dx_ptr.dtype.element_ty), mask=mask)
            if CAST:
                xhat = xhat.to(dtype).to(tl.float32)
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
            ds_row = ds_ptr + tl.cast(row, tl.int64) * sdsm
            mean, rstd = _looped_stats(x_row, sxn, x_row, 0, x_row, N, eps, RMS, False, BLOCK_N)
            c1 = 0.0
            c2 = 0.0
            for start in range(0, N, BLOCK_N):
                c = start + cols
                mask = c < N
                x = tl.load(x_row + c.to(tl.int64) * sxn, mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(dy_row + c.to(tl.int64) * sdyn, mask=mask, other=0.0).to(tl.float32)
                w = 1.0
                if HAS_W:
                    w = tl.load(w_ptr + c * sw, mask=mask, other=0.0).to(tl.float32) + offset
                if RMS:
                    xhat = x * rstd
                else:
                    xhat = tl.where(mask, x - mean, 0.0) * rstd
                wdy = _weighted_grad(dy, w, dtype, CAST)
                c1 += tl.sum(xhat * wdy, axis=0)
                c2 += tl.sum(wdy, axis=0)
            c1 = c1 / N
            c2 = c2 / N
            for start in range(0, N, BLOCK_N):
                c = start + cols
                mask = c < N
                x = tl.load(x_row + c.to(tl.int64) * sxn, mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(dy_row + c.to(tl.int64) * sdyn, mask=mask, other=0.0).to(tl.float32)
                w = 1.0
                if HAS_W:
                    w = tl.load(w_ptr + c * sw, mask=mask, other=0.0).to(tl.float32) + offset
                if RMS:
                    xhat = x * rstd
                else:
                    xhat = tl.where(mask, x - mean, 0.0) * rstd
                wdy = _weighted_grad(dy, w, dtype, CAST)
                if RMS:
                    dx = (wdy - xhat * c1) * rstd
                else:
                    dx = (wdy - (xhat * c1 + c2)) * rstd
                if HAS_DS:
                    dx += tl.load(ds_row + c.to(tl.int64) * sdsn, mask=mask, other=0.0).to(tl.float32)
                tl.store(dx_row + c.to(tl.int64) * sdxn, dx.to(dx_ptr.dtype.element_ty), mask=mask)
                if CAST:
                    xhat = xhat.to(dtype).to(tl.float32)
                dw = tl.load(dw_part + part + c, mask=mask, other=0.0)
                tl.store(dw_part + part + c, dw + dy * xhat, mask=mask)
                db = tl.load(db_part + part + c, mask=mask, other=0.0)
                tl.store(db_part + part + c, db + dy, mask=mask)


# -- launch configuration ---------------------------------------------------------------------------


def _row_input(ctx: DispatchContext) -> str:
    """The argument whose rows are normalized: x, or h (= x + residual) in the add forms' backward."""
    return "h" if "h" in ctx.arg_names else "x"


def _rows(ctx: DispatchContext) -> tuple[int, int]:
    x = ctx.tensor(_row_input(ctx))
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


def _options(ctx: DispatchContext) -> dict:
    """eps, and the RMS options as the kernels take them (ops/norm.py)."""
    at = ctx.attrs
    return {"eps": at["eps"], "offset": at.get("offset", 0.0), "cast": at.get("casting") == "llama"}


def forward_launch_config(ctx: DispatchContext) -> LaunchConfig:
    m, n = _rows(ctx)
    t = _tile(n, ctx.tensor("x").itemsize)
    t.update(M=m, N=n, lean=_lean(ctx, ("x", "residual", "residual_out")), **_options(ctx))
    programs = triton.cdiv(m, t["BLOCK_M"]) if t["ONE_PASS"] else m
    return LaunchConfig(grid=(programs,), block=(32 * t["num_warps"],), params=t)


def backward_launch_config(ctx: DispatchContext) -> LaunchConfig:
    m, n = _rows(ctx)
    t = _tile(n, ctx.tensor(_row_input(ctx)).itemsize)
    row_blocks = triton.cdiv(m, t["BLOCK_M"])
    programs = max(1, min(row_blocks, BACKWARD_PROGRAMS_PER_SM * sm_count(ctx.device)))
    grads = 1 if "rms_norm" in ctx.op else 2
    finish = tiles(Problem(grads, programs, n, (programs * n, n, 1), (n, 1)), 0)
    finish["out_offset"] = m * n  # the gradient rows follow dx in the packed (row-major) output
    t.update(M=m, N=n, P=programs, finish=finish, lean=_lean(ctx, ("dy", "dh", _row_input(ctx))), **_options(ctx))
    return LaunchConfig(grid=(programs,), block=(32 * t["num_warps"],), params=t)


def _lean(ctx: DispatchContext, rows: tuple[str, ...]) -> bool:
    """Row-major inputs, parameters and output: launch on the arrays as they are (no views, fewer host steps)."""
    present = [n for n in (*rows, "weight", "bias") if n in ctx.arg_names and ctx.has_tensor(n)]
    dense = all(ctx.tensor(n).layout == "contiguous" for n in present)
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


def _forward(args: ArgPack, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, rms: bool,
             residual: torch.Tensor | None = None, h: torch.Tensor | None = None) -> None:  # fmt: skip
    """y = norm(x), or with a residual: h = x + residual (into the contiguous buffer h) and y = norm(h)."""
    p = args.config.params
    m, n = p["M"], p["N"]
    out = as_torch(args.out)
    if m == 0:
        return
    flags = dict(
        HAS_W=weight is not None, HAS_B=bias is not None, RMS=rms, HAS_RES=residual is not None, CAST=p["cast"],
        BLOCK_M=p["BLOCK_M"], BLOCK_N=p["BLOCK_N"], ONE_PASS=p["ONE_PASS"], num_warps=p["num_warps"],
    )  # fmt: skip
    if p["lean"]:
        launch(
            _norm_fwd_kernel, args.config.grid,
            x, x if weight is None else weight, x if bias is None else bias, out,
            x if residual is None else residual, x if h is None else h,
            m, n, n, 1, n, 1, n, 1, 1, 1, p["eps"], p["offset"], **flags,
        )  # fmt: skip
        return
    xm = _matrix(x, m, n)
    r = xm if residual is None else _matrix(residual, m, n)
    y, direct = _output_matrix(out, m, n)
    (w, sw), (b, sb) = _vector(weight), _vector(bias)
    launch(
        _norm_fwd_kernel, args.config.grid,
        xm, w if w is not None else xm, b if b is not None else xm, y, r, xm if h is None else h,
        m, n, *xm.stride(), *y.stride(), *r.stride(), sw, sb, float(p["eps"]), float(p["offset"]), **flags,
    )  # fmt: skip
    if not direct:
        out.copy_(y.view(out.shape))


def _backward(args: ArgPack, dy_in: torch.Tensor, x_in: torch.Tensor, weight: torch.Tensor | None, rms: bool,
              ds_in: torch.Tensor | None = None) -> None:  # fmt: skip
    """Packed output: rows [0, M) are dx (+ ds), row M is dweight, row M+1 (layer norm) is dbias."""
    p = args.config.params
    m, n, programs = p["M"], p["N"], p["P"]
    out = as_torch(args.out)
    flags = dict(
        HAS_W=weight is not None, RMS=rms, HAS_DS=ds_in is not None, CAST=p["cast"],
        BLOCK_M=p["BLOCK_M"], BLOCK_N=p["BLOCK_N"], ONE_PASS=p["ONE_PASS"], num_warps=p["num_warps"],
    )  # fmt: skip
    if p["lean"]:
        partials = workspace_f32(args, 2 * programs * n, out.device)
        launch(
            _norm_bwd_kernel, args.config.grid,
            dy_in, x_in, x_in if weight is None else weight, out, partials, dy_in if ds_in is None else ds_in, m, n,
            n, 1, n, 1, n, 1, n, 1, 1, p["eps"], p["offset"], **flags,
        )  # fmt: skip
        launch_sum(partials, out, p["finish"])
        return
    packed, direct = _output_matrix(out, out.shape[0], n)
    x, dy = _matrix(x_in, m, n), _matrix(dy_in, m, n)
    ds = dy if ds_in is None else _matrix(ds_in, m, n)
    dx = packed[:m]
    w, sw = _vector(weight)
    partials = workspace_f32(args, 2 * programs * n, packed.device)
    launch(
        _norm_bwd_kernel, args.config.grid,
        dy, x, w if w is not None else x, dx, partials, ds, m, n,
        *dy.stride(), *x.stride(), *dx.stride(), *ds.stride(), sw, float(p["eps"]), float(p["offset"]), **flags,
    )  # fmt: skip
    grads = packed[m:]
    finish = tiles(Problem(grads.shape[0], programs, n, (programs * n, n, 1), grads.stride()), 0)  # out's strides
    launch_sum(partials, grads, finish)
    if not direct:
        out.copy_(packed.view(out.shape))


# -- kernels ----------------------------------------------------------------------------------------


def no_float64(ctx: DispatchContext) -> str | None:
    """Triton computes fp16/bf16/fp32 here: the add forms' sum of a float64 residual would be float64."""
    if any(t.dtype == "float64" for t in ctx.tensors):
        return "a float64 argument (these kernels compute float16, bfloat16 and float32)"
    return None


_HINTS = dict(backend="triton", dtypes=FLOAT_DTYPES, conditions=(no_negative_strides, no_float64), traceable=True)
_BACKWARD = dict(launch_config=backward_launch_config, workspace_bytes=backward_workspace_bytes, **_HINTS)


@kernel("layer_norm", "triton", priority=30, launch_config=forward_launch_config, **_HINTS)
def layer_norm_triton(args: ArgPack) -> None:
    """One read of x and one write of y per element when a row fits in registers."""
    x, weight, bias = (as_torch(v) for v in args.inputs)
    _forward(args, x, weight, bias, rms=False)


@kernel("rms_norm", "triton", priority=30, launch_config=forward_launch_config, **_HINTS)
def rms_norm_triton(args: ArgPack) -> None:
    """One read of x and one write of y per element when a row fits in registers."""
    x, weight = (as_torch(v) for v in args.inputs)
    _forward(args, x, weight, None, rms=True)


@kernel("add_layer_norm", "triton", priority=30, launch_config=forward_launch_config, **_HINTS)
def add_layer_norm_triton(args: ArgPack) -> None:
    """One read of x and residual, one write of h = x + residual and of y, when a row fits in registers."""
    x, residual, weight, bias, h = (as_torch(v) for v in args.inputs)
    _forward(args, x, weight, bias, rms=False, residual=residual, h=h)


@kernel("add_rms_norm", "triton", priority=30, launch_config=forward_launch_config, **_HINTS)
def add_rms_norm_triton(args: ArgPack) -> None:
    """One read of x and residual, one write of h = x + residual and of y, when a row fits in registers."""
    x, residual, weight, h = (as_torch(v) for v in args.inputs)
    _forward(args, x, weight, None, rms=True, residual=residual, h=h)


@kernel("layer_norm_backward", "triton", priority=30, **_BACKWARD)
def layer_norm_backward_triton(args: ArgPack) -> None:
    """dx in one pass over dy and x; dweight/dbias from per-program fp32 partials (deterministic)."""
    dy, x, weight = (as_torch(v) for v in args.inputs)
    _backward(args, dy, x, weight, rms=False)


@kernel("rms_norm_backward", "triton", priority=30, **_BACKWARD)
def rms_norm_backward_triton(args: ArgPack) -> None:
    """dx in one pass over dy and x; dweight from per-program fp32 partials (deterministic)."""
    dy, x, weight = (as_torch(v) for v in args.inputs)
    _backward(args, dy, x, weight, rms=True)


@kernel("add_layer_norm_backward", "triton", priority=30, **_BACKWARD)
def add_layer_norm_backward_triton(args: ArgPack) -> None:
    """dh = norm's dx + the residual stream's dh in one pass over dy, dh and h; dweight/dbias as above."""
    dy, dh, h, weight = (as_torch(v) for v in args.inputs)
    _backward(args, dy, h, weight, rms=False, ds_in=dh)


@kernel("add_rms_norm_backward", "triton", priority=30, **_BACKWARD)
def add_rms_norm_backward_triton(args: ArgPack) -> None:
    """dh = norm's dx + the residual stream's dh in one pass over dy, dh and h; dweight as above."""
    dy, dh, h, weight = (as_torch(v) for v in args.inputs)
    _backward(args, dy, h, weight, rms=True, ds_in=dh)
