"""CPU kernel for sin_affine."""

from __future__ import annotations

import numpy as np

from ...abi import ArgPack
from ...ops.checks import CPU_FLOAT_DTYPES
from ...registry import kernel


@kernel("sin_affine", "numpy", backend="cpu", dtypes=CPU_FLOAT_DTYPES, priority=10)
def sin_affine_numpy(args: ArgPack) -> None:
    """Computes in float64 and rounds once, so float32/float16 results are correctly rounded."""
    x, a, b = args.inputs
    out = args.out
    if out.dtype == np.float64:
        np.multiply(x, a, out=out)
        np.add(out, b, out=out)
        np.sin(out, out=out)
        return
    y = np.multiply(x, a, dtype=np.float64)
    np.add(y, b, out=y)
    np.sin(y, out=y)
    np.copyto(out, y, casting="same_kind")


KERNELS = (sin_affine_numpy,)
