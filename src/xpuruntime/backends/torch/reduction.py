"""sum through PyTorch's CUDA reduction, written straight into the output."""

from __future__ import annotations

import torch

from ...abi import ArgPack
from ...registry import kernel
from .common import GPU_FLOAT_DTYPES

_INTEGER_DTYPES = frozenset({"bool", "int8", "int16", "int32", "int64", "uint8"})


@kernel("sum", "torch", backend="torch", dtypes=GPU_FLOAT_DTYPES | _INTEGER_DTYPES, priority=20)
def sum_torch(args: ArgPack) -> None:
    """torch.sum over the axes (fp32 accumulation for half types; integers into int64)."""
    (x,) = args.inputs
    at = args.attrs
    axes = at["axis"]
    if not axes:  # a 0-d input: nothing to reduce
        args.out.copy_(x)
        return
    torch.sum(x, dim=axes, keepdim=at["keepdims"], dtype=args.out.dtype, out=args.out)
