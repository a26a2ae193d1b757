"""autocast: PyTorch's autocast plus the math mode the selector sees for the calls inside it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from .policy import kernel_policy

_MATH_MODE = {torch.float16: "fp16", torch.bfloat16: "bf16"}


@contextlib.contextmanager
def autocast(
    dtype: torch.dtype = torch.float16, enabled: bool = True, cache_enabled: bool = True, device_type: str = "cuda"
) -> Iterator[None]:
    """`torch.autocast(device_type, dtype)` with the policy's math mode set to fp16 / bf16 inside."""
    if dtype not in _MATH_MODE:
        from ..errors import ArgumentError

        raise ArgumentError(f"autocast: argument 'dtype' expected torch.float16 or torch.bfloat16, got {dtype}")
    with torch.autocast(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled):
        if not enabled:
            yield
            return
        with kernel_policy(math_mode=_MATH_MODE[dtype]):
            yield
