"""autocast_linear(x, weight, bias=None, dtype): nn.Linear under autocast, x @ weight.T + bias computed in
`dtype` (float16 or bfloat16) from inputs of any float dtype, typically fp32 master weights.

This is what `torch.autocast` makes of F.linear: each input cast to `dtype`, then the product; the result
has dtype `dtype`. Kernels that train may also choose how the gradients come back (see `fused_cast`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..context import DispatchContext
from ..dispatch import run
from ..errors import ArgumentError, argument_error
from ..schema import OpSchema
from .checks import require_float
from .linear import flops, gemm_dims

COMPUTE_DTYPES = ("float16", "bfloat16")


def _normalize_attrs(ctx: DispatchContext) -> dict[str, Any]:
    dtype = ctx.attrs["dtype"]
    if dtype not in COMPUTE_DTYPES:
        raise argument_error(ArgumentError, ctx.op, "dtype", "'float16' or 'bfloat16'", repr(dtype))
    return {"dtype": dtype, **gemm_dims(ctx)}


def _infer_dtype(ctx: DispatchContext) -> str:
    for name in ("x", "weight", "bias"):
        if name == "x" or ctx.has_tensor(name):
            require_float(ctx, name)
    return ctx.attrs["dtype"]


def reference(x: Any, weight: Any, bias: Any = None, dtype: str = "bfloat16") -> np.ndarray:
    """float64 reference (of the exact product; kernels round their inputs to `dtype` first)."""
    z = np.asarray(x, np.float64) @ np.asarray(weight, np.float64).T
    return z if bias is None else z + np.asarray(bias, np.float64)


AUTOCAST_LINEAR = OpSchema(
    name="autocast_linear",
    inputs=("x", "weight", "bias"),
    optional=frozenset({"bias"}),
    attrs=("dtype",),
    defaults={"dtype": "bfloat16"},
    normalize_attrs=_normalize_attrs,
    infer_dtype=_infer_dtype,
    infer_shape=lambda ctx: (*ctx.attrs["batch"], ctx.attrs["n"]),
    reference=reference,
    flops=flops,
    doc="x @ weight.T + bias in `dtype` (fp16/bf16) from inputs of any float dtype: F.linear under autocast.",
)


def autocast_linear(x: Any, weight: Any, bias: Any = None, dtype: str = "bfloat16", *, out: Any = None) -> Any:
    """x @ weight.T + bias computed in `dtype` ('float16' or 'bfloat16'), as F.linear under autocast."""
    return run("autocast_linear", (x, weight, bias), (dtype,), out)
