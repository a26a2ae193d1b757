"""matmul through PyTorch's cuBLAS GEMM / GEMV, written straight into the output."""

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
    """mm / bmm into the output (the aten ops an override of aten::mm may call with operands that require
    grad: matmul is a composite whose out= form refuses them), matmul for other batch shapes; 1-D operands
    through a copy (PyTorch resizes `out` of a vector @ matrix product instead of writing it)."""
    a, b = args.inputs
    if a.dim() == 2 and b.dim() == 2:
        torch.mm(a, b, out=args.out)
    elif a.dim() == 3 and b.dim() == 3 and a.shape[0] == b.shape[0]:
        torch.bmm(a, b, out=args.out)
    elif a.dim() == 1 or b.dim() == 1:
        args.out.copy_(torch.matmul(a, b))
    else:
        torch.matmul(a, b, out=args.out)
