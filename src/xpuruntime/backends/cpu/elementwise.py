"""CPU kernel for sin_affine."""

from __future__ import annotations

import numpy as np

from ...abi import ArgPack
from ...registry import kernel
from .common import CPU_FLOAT_DTYPES


@kernel("sin_affine", "numpy", backend="cpu", dtypes=CPU_FLOAT_DTYPES, priority=10)
def sin_affine_numpy(args: ArgPack) -> None:
    """Computes in float64 and rounds once, so float32/float16 results are correctly rounded."""
    x, a, b = args.inputs
    out = args.out
    # The float64 work array has the full broadcast shape (b may add dims that x*a lacks) and is never
    # a 0-d scalar. A float64 `out` is used directly unless it is `b` itself, which is read after
    # x*a has been written.
    in_out = out.dtype == np.float64 and not (isinstance(b, np.ndarray) and np.may_share_memory(out, b))
    y = out if in_out else np.empty(out.shape, np.float64)
    np.multiply(x, a, out=y, dtype=np.float64)
    np.add(y, b, out=y)
    np.sin(y, out=y)
    if y is not out:
        np.copyto(out, y, casting="same_kind")
