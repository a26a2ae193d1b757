"""CPU kernel for softmax."""

from __future__ import annotations

import numpy as np

from ...abi import ArgPack
from ...registry import kernel
from .common import CPU_FLOAT_DTYPES, compute_dtype


@kernel("softmax", "numpy", backend="cpu", dtypes=CPU_FLOAT_DTYPES, priority=10)
def softmax_numpy(args: ArgPack) -> None:
    """Max-subtracted exp, normalized; computes in fp32 for fp16. Safe with out is x (in-place)."""
    (x,) = args.inputs
    out, axis = args.out, args.attrs["axis"]
    if x.size == 0:
        return
    work = out if compute_dtype(x.dtype) == x.dtype else np.empty(x.shape, compute_dtype(x.dtype))
    with np.errstate(invalid="ignore"):  # an all -inf row gives NaN, as in PyTorch
        np.subtract(x, np.max(x, axis=axis, keepdims=True), out=work, dtype=work.dtype.type)
        np.exp(work, out=work)
        np.divide(work, np.sum(work, axis=axis, keepdims=True), out=work)
    if work is not out:
        np.copyto(out, work, casting="same_kind")
