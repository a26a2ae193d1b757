"""matmul through torch.matmul (cuBLAS), written straight into the output."""

from __future__ import annotations

import torch

from ...abi import ArgPack
from ...registry import kernel
from .common import GPU_FLOAT_DTYPES


@kernel(
    "matmul", "torch", backend="torch", dtypes=GPU_FLOAT_DTYPES, priority=20, tensor_cores=True,
    deterministic=True,
)  # fmt: skip
def matmul_torch(args: ArgPack) -> None:
    """torch.matmul(a, b, out=out): cuBLAS GEMM / GEMV, any batch; 1-D operands through a copy (PyTorch
    resizes `out` of a vector @ matrix product instead of writing it)."""
    a, b = args.inputs
    if a.dim() == 1 or b.dim() == 1:
        args.out.copy_(torch.matmul(a, b))
    else:
        torch.matmul(a, b, out=args.out)
