"""Triton sin_affine: y = sin(a*x + b) with broadcasting and any strides, fp32 math, one rounding.

The launch-config function collapses the broadcast layout once per plan: contiguous operands and
Python-number `a`/`b` take a flat 1-D path (the fast one); anything else indexes up to 4 collapsed dims.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import libdevice

from ...abi import ArgPack, LaunchConfig, TensorSpec
from ...context import DispatchContext
from ...registry import kernel
from .common import FLOAT_DTYPES, INTERPRET, as_torch, broadcast_strides, collapse, no_negative_strides, out_strides

# libdevice's sinf is accurate to a few ulp; tl.sin may lower to the approximate sin.approx.f32. The
# interpreter implements only tl.sin (through NumPy, exactly).
LIBDEVICE_SIN = tl.constexpr(not INTERPRET)

MAX_DIMS = 4
SCALAR, SPLAT, LINEAR, STRIDED = 0, 1, 2, 3  # how an operand is read: Python number, one element, flat, strided


@triton.jit
def _offsets(idx, d1, d2, d3, s0, s1, s2, s3):
    """Element offsets of flat (row-major over the collapsed dims d0..d3) indices `idx`."""
    i3 = idx % d3
    rest = idx // d3
    i2 = rest % d2
    rest = rest // d2
    i1 = rest % d1
    i0 = rest // d1
    return i0 * s0 + i1 * s1 + i2 * s2 + i3 * s3


@triton.jit
def _operand(ptr, value, idx, mask, d1, d2, d3, s0, s1, s2, s3, MODE: tl.constexpr):
    if MODE == 0:
        return value
    elif MODE == 1:
        return tl.load(ptr).to(tl.float32)
    elif MODE == 2:
        return tl.load(ptr + idx, mask=mask).to(tl.float32)
    else:
        return tl.load(ptr + _offsets(idx, d1, d2, d3, s0, s1, s2, s3), mask=mask).to(tl.float32)


@triton.jit
def _sin_affine_kernel(
    x_ptr, a_ptr, b_ptr, y_ptr, a_value, b_value, n,
    d1, d2, d3,
    xs0, xs1, xs2, xs3, as0, as1, as2, as3, bs0, bs1, bs2, bs3, ys0, ys1, ys2, ys3,
    X_MODE: tl.constexpr, A_MODE: tl.constexpr, B_MODE: tl.constexpr, Y_LINEAR: tl.constexpr,
    WIDE: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    if WIDE:
        idx = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    else:
        idx = pid * BLOCK + tl.arange(0, BLOCK)
    mask = idx < n
    x = _operand(x_ptr, 0.0, idx, mask, d1, d2, d3, xs0, xs1, xs2, xs3, X_MODE)
    a = _operand(a_ptr, a_value, idx, mask, d1, d2, d3, as0, as1, as2, as3, A_MODE)
    b = _operand(b_ptr, b_value, idx, mask, d1, d2, d3, bs0, bs1, bs2, bs3, B_MODE)
    if LIBDEVICE_SIN:
        y = libdevice.sin(a * x + b).to(y_ptr.dtype.element_ty)
    else:
        y = tl.sin(a * x + b).to(y_ptr.dtype.element_ty)
    if Y_LINEAR:
        tl.store(y_ptr + idx, y, mask=mask)
    else:
        tl.store(y_ptr + _offsets(idx, d1, d2, d3, ys0, ys1, ys2, ys3), y, mask=mask)


def _strides_of(ctx: DispatchContext, name: str) -> tuple[int, ...] | None:
    spec = ctx[name]
    if not isinstance(spec, TensorSpec):
        return None
    return broadcast_strides(spec.shape, ctx.out_shape, spec.strides)


def _layout(ctx: DispatchContext) -> tuple[tuple[int, ...], list[tuple[int, ...] | None]]:
    """Collapsed dims and per-operand strides (x, a, b, y); None for Python-number operands."""
    names = ("x", "a", "b")
    given = [_strides_of(ctx, n) for n in names] + [out_strides(ctx)]
    present = [s for s in given if s is not None]
    dims, collapsed = collapse(ctx.out_shape, *present)
    it = iter(collapsed)
    return dims, [None if s is None else next(it) for s in given]


def _at_most_4_dims(ctx: DispatchContext) -> str | None:
    dims, _ = _layout(ctx)
    if len(dims) > MAX_DIMS:
        return f"broadcast layout needs {len(dims)} dims after collapsing (kernel indexes at most {MAX_DIMS})"
    return None


def _mode(strides: tuple[int, ...] | None, linear: tuple[int, ...]) -> int:
    if strides is None:
        return SCALAR
    if all(s == 0 for s in strides):
        return SPLAT
    return LINEAR if strides == linear else STRIDED


def sin_affine_launch_config(ctx: DispatchContext) -> LaunchConfig:
    dims, strides = _layout(ctx)
    pad = MAX_DIMS - len(dims)
    padded_dims = (1,) * pad + dims
    linear = tuple(0 if n == 1 else s for n, s in zip(dims, _row_major(dims)))
    n = 1
    for d in dims:
        n *= d
    block, warps = (1024, 4) if n < (1 << 22) else (4096, 8)
    params = {
        "dims": padded_dims[1:],
        "strides": [((0,) * pad + s) if s is not None else (0,) * MAX_DIMS for s in strides],
        "X_MODE": _mode(strides[0], linear),
        "A_MODE": _mode(strides[1], linear),
        "B_MODE": _mode(strides[2], linear),
        "Y_LINEAR": strides[3] == linear or n <= 1,
        "WIDE": _max_offset(ctx, n) >= 2**31 - 1,
        "BLOCK": block,
        "num_warps": warps,
        "n": n,
    }
    return LaunchConfig(grid=(triton.cdiv(n, block),), block=(warps * 32,), params=params)


def _row_major(dims: tuple[int, ...]) -> tuple[int, ...]:
    out, step = [], 1
    for d in reversed(dims):
        out.append(step)
        step *= d
    return tuple(reversed(out))


def _max_offset(ctx: DispatchContext, n: int) -> int:
    reach = n
    for spec in (*ctx.tensors, ctx.out):
        if spec is not None:
            reach = max(reach, sum((d - 1) * abs(s) for d, s in zip(spec.shape, spec.strides)) + 1)
    return reach


@kernel(
    "sin_affine", "triton", backend="triton", dtypes=FLOAT_DTYPES, priority=30,
    conditions=(_at_most_4_dims, no_negative_strides), launch_config=sin_affine_launch_config,
)  # fmt: skip
def sin_affine_triton(args: ArgPack) -> None:
    """One pass: each input element read once (broadcast operands from cache), each output written once."""
    p = args.config.params
    if p["n"] == 0:
        return
    x, a, b = (as_torch(v) for v in args.inputs)
    y = as_torch(args.out)
    a_tensor, b_tensor = not isinstance(a, float | int), not isinstance(b, float | int)
    xs, as_, bs, ys = p["strides"]
    _sin_affine_kernel[args.config.grid](
        x, a if a_tensor else x, b if b_tensor else x, y,
        0.0 if a_tensor else float(a), 0.0 if b_tensor else float(b), p["n"],
        *p["dims"], *xs, *as_, *bs, *ys,
        X_MODE=p["X_MODE"], A_MODE=p["A_MODE"], B_MODE=p["B_MODE"], Y_LINEAR=p["Y_LINEAR"],
        WIDE=p["WIDE"], BLOCK=p["BLOCK"], num_warps=p["num_warps"],
    )  # fmt: skip
