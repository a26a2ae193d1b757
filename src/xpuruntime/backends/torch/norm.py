"""layer_norm and rms_norm through PyTorch's fused CUDA kernels."""

from __future__ import annotations

import torch.nn.functional as F

from ...abi import ArgPack
from ...registry import kernel
from .common import GPU_FLOAT_DTYPES


@kernel("layer_norm", "torch", backend="torch", dtypes=GPU_FLOAT_DTYPES, priority=20)
def layer_norm_torch(args: ArgPack) -> None:
    """F.layer_norm, then a copy into the output (PyTorch has no out= form)."""
    x, weight, bias = args.inputs
    at = args.attrs
    args.out.copy_(F.layer_norm(x, at["normalized_shape"], weight, bias, at["eps"]))


@kernel("rms_norm", "torch", backend="torch", dtypes=GPU_FLOAT_DTYPES, priority=20)
def rms_norm_torch(args: ArgPack) -> None:
    """F.rms_norm, then a copy into the output (PyTorch has no out= form)."""
    x, weight = args.inputs
    at = args.attrs
    args.out.copy_(F.rms_norm(x, at["normalized_shape"], weight, at["eps"]))
