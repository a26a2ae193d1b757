"""CPU matmul kernels: BLAS through NumPy, a GEMV fast path, and a cache-blocked kernel with tile sizes
chosen by its launch-config function. fp16 inputs accumulate in fp32 in all three."""

from __future__ import annotations

import math

import numpy as np

from ...abi import ArgPack, LaunchConfig
from ...context import DispatchContext
from ...registry import kernel
from .common import CPU_FLOAT_DTYPES, INT_DTYPES, as_compute, compute_dtype


def _write(out: np.ndarray, result: np.ndarray) -> None:
    np.copyto(out, result, casting="same_kind")


@kernel("matmul", "numpy_blas", backend="cpu", dtypes=CPU_FLOAT_DTYPES | INT_DTYPES, priority=10)
def matmul_blas(args: ArgPack) -> None:
    """np.matmul (BLAS for float32/float64); any batch, 1-D operands."""
    a, b = args.inputs
    if a.dtype == np.float16:
        _write(args.out, np.matmul(as_compute(a), as_compute(b)))
    else:
        np.matmul(a, b, out=args.out)


def _is_gemv(ctx: DispatchContext) -> str | None:
    at = ctx.attrs
    if at["batch"]:
        return "batched call (GEMV path takes 1-D x 2-D or 2-D x 1-D)"
    if not (at["a_vector"] or at["b_vector"] or at["m"] == 1 or at["n"] == 1):
        return f"not a matrix-vector product (M={at['m']}, N={at['n']})"
    return None


@kernel("matmul", "gemv", backend="cpu", dtypes=CPU_FLOAT_DTYPES, conditions=(_is_gemv,), priority=20)
def matmul_gemv(args: ArgPack) -> None:
    """Matrix-vector fast path (M == 1 or N == 1) through np.dot."""
    a, b = args.inputs
    if a.dtype == np.float16:
        _write(args.out, np.dot(as_compute(a), as_compute(b)))
    else:
        out = args.out
        if out.flags.c_contiguous and out.flags.aligned and out.dtype.isnative:  # what np.dot(out=) requires
            np.dot(a, b, out=out)
        else:
            _write(out, np.dot(a, b))


def blocked_launch_config(ctx: DispatchContext) -> LaunchConfig:
    """Square-ish output tiles small enough for L2, a deep K step; one 'program' per output tile."""
    at = ctx.attrs
    bm = min(128, max(at["m"], 1))
    bn = min(128, max(at["n"], 1))
    bk = min(256, max(at["k"], 1))
    grid = (math.prod(at["batch"]), math.ceil(at["m"] / bm), math.ceil(at["n"] / bn))
    return LaunchConfig(grid=grid, block=(bm, bn), params={"BM": bm, "BN": bn, "BK": bk})


@kernel(
    "matmul", "blocked", backend="cpu", dtypes=CPU_FLOAT_DTYPES, priority=0,
    launch_config=blocked_launch_config,
)  # fmt: skip
def matmul_blocked(args: ArgPack) -> None:
    """Tiles the output into BM x BN blocks and accumulates BK-deep panels in fp32/fp64."""
    a, b = args.inputs
    at, p = args.attrs, args.config.params
    bm, bn, bk = p["BM"], p["BN"], p["BK"]
    m, n, k, batch = at["m"], at["n"], at["k"], at["batch"]
    a2 = a[None, :] if at["a_vector"] else a
    b2 = b[:, None] if at["b_vector"] else b
    out = args.out
    if at["b_vector"]:  # (..., m) -> (..., m, 1); first, so that a 0-d result of vector @ vector works
        out = out[..., None]
    if at["a_vector"]:  # (..., n) -> (..., 1, n)
        out = out[..., None, :]
    a2 = np.broadcast_to(a2, (*batch, m, k))
    b2 = np.broadcast_to(b2, (*batch, k, n))
    acc_dtype = compute_dtype(a.dtype)
    for index in np.ndindex(*batch):
        a_mat, b_mat, o_mat = a2[index], b2[index], out[index]
        for i in range(0, m, bm):
            for j in range(0, n, bn):
                acc = np.zeros((min(bm, m - i), min(bn, n - j)), acc_dtype)
                for p0 in range(0, k, bk):
                    a_tile = a_mat[i : i + bm, p0 : p0 + bk].astype(acc_dtype, copy=False)
                    b_tile = b_mat[p0 : p0 + bk, j : j + bn].astype(acc_dtype, copy=False)
                    acc += a_tile @ b_tile
                o_mat[i : i + bm, j : j + bn] = acc
