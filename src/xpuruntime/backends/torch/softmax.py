"""softmax through PyTorch's CUDA kernel, written straight into the output."""

from __future__ import annotations

import torch

from ...abi import ArgPack
from ...registry import kernel
from .common import GPU_FLOAT_DTYPES


@kernel("softmax", "torch", backend="torch", dtypes=GPU_FLOAT_DTYPES, priority=20)
def softmax_torch(args: ArgPack) -> None:
    """torch.softmax(x, axis, out=out); in-place safe (out may be x)."""
    (x,) = args.inputs
    torch.softmax(x, args.attrs["axis"], out=args.out)
