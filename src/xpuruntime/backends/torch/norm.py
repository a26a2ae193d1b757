"""layer_norm and rms_norm through PyTorch's fused CUDA kernels."""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F

from ...abi import ArgPack
from ...registry import kernel
from .common import GPU_FLOAT_DTYPES, returned


@kernel("layer_norm", "torch", backend="torch", dtypes=GPU_FLOAT_DTYPES, priority=20, returns_output=True)
def layer_norm_torch(args: ArgPack) -> Any:
    """F.layer_norm."""
    x, weight, bias = args.inputs
    at = args.attrs
    return returned(args, F.layer_norm(x, at["normalized_shape"], weight, bias, at["eps"]))


@kernel("rms_norm", "torch", backend="torch", dtypes=GPU_FLOAT_DTYPES, priority=20, returns_output=True)
def rms_norm_torch(args: ArgPack) -> Any:
    """F.rms_norm."""
    x, weight = args.inputs
    at = args.attrs
    return returned(args, F.rms_norm(x, at["normalized_shape"], weight, at["eps"]))
