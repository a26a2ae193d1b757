"""CPU kernel for sum."""

from __future__ import annotations

import numpy as np

from ...abi import ArgPack
from ...registry import kernel


@kernel("sum", "numpy", backend="cpu", priority=10)
def sum_numpy(args: ArgPack) -> None:
    """Accumulates floats in float64 and integers in the 64-bit output type, then rounds once into `out`."""
    (x,) = args.inputs
    out = args.out
    acc = np.float64 if out.dtype.kind == "f" else out.dtype.type  # integers: int64 (uint64 for uint64)
    total = np.sum(x, axis=args.attrs["axis"], dtype=acc, keepdims=args.attrs["keepdims"])
    np.copyto(out, total, casting="same_kind")
