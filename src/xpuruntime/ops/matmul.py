"""matmul(a, b) with NumPy/PyTorch semantics: 2-D, batched with broadcast batch dims, 1-D operands (GEMV)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..abi import FLOAT_DTYPES, INT_DTYPES
from ..context import DispatchContext
from ..dispatch import run
from ..errors import DTypeError, ShapeError, argument_error
from ..schema import OpSchema
from .checks import broadcast, require_dtype_like, require_ndim


def _normalize_attrs(ctx: DispatchContext) -> dict[str, Any]:
    """Derive the GEMM problem: batch shape, M, N, K, and which operands were 1-D."""
    require_ndim(ctx, "a", 1)
    require_ndim(ctx, "b", 1)
    a, b = ctx.tensor("a").shape, ctx.tensor("b").shape
    a_vec, b_vec = len(a) == 1, len(b) == 1
    a2 = (1, *a) if a_vec else a
    b2 = (*b, 1) if b_vec else b
    if a2[-1] != b2[-2]:
        raise argument_error(
            ShapeError, ctx.op, "b", f"{a2[-1]} rows to match the {a2[-1]} columns of 'a' {a}", f"shape {b}"
        )
    batch = broadcast(ctx.op, [("a", a2[:-2]), ("b", b2[:-2])])
    return {"batch": batch, "m": a2[-2], "n": b2[-1], "k": a2[-1], "a_vector": a_vec, "b_vector": b_vec}


def _infer_dtype(ctx: DispatchContext) -> str:
    dtype = ctx.tensor("a").dtype
    if dtype not in FLOAT_DTYPES | INT_DTYPES:
        raise argument_error(DTypeError, ctx.op, "a", "a floating or integer dtype", dtype)
    require_dtype_like(ctx, "b", "a")
    return dtype


def _infer_shape(ctx: DispatchContext) -> tuple[int, ...]:
    at = ctx.attrs
    return (*at["batch"], *(() if at["a_vector"] else (at["m"],)), *(() if at["b_vector"] else (at["n"],)))


def flops(ctx: DispatchContext) -> int:
    at = ctx.attrs
    return 2 * math.prod(at["batch"]) * at["m"] * at["n"] * at["k"]


def reference(a: Any, b: Any) -> np.ndarray:
    """float64 reference (int64 for integers)."""
    a, b = np.asarray(a), np.asarray(b)
    acc = np.float64 if a.dtype.kind == "f" else np.int64
    return np.matmul(a.astype(acc), b.astype(acc))


MATMUL = OpSchema(
    name="matmul",
    inputs=("a", "b"),
    normalize_attrs=_normalize_attrs,
    infer_dtype=_infer_dtype,
    infer_shape=_infer_shape,
    reference=reference,
    flops=flops,
    doc="Matrix product with broadcast batch dims; a 1-D operand is a vector (GEMV).",
)


def matmul(a: Any, b: Any, *, out: Any = None) -> Any:
    """a @ b with NumPy semantics (batch broadcasting, 1-D operands); fp16 accumulates in fp32."""
    return run("matmul", (a, b), (), out)
