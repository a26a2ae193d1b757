"""Helpers shared by the backends that run on CUDA torch tensors: allocation, streams, events, dtypes."""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

from ...runtime.streams import current_stream

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64,
    "int8": torch.int8, "int16": torch.int16, "int32": torch.int32, "int64": torch.int64, "uint8": torch.uint8,
    "bool": torch.bool,
}  # fmt: skip
GPU_FLOAT_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})
HALF_DTYPES = frozenset({"float16", "bfloat16"})
__all__ = [
    "GPU_FLOAT_DTYPES",
    "TORCH_DTYPES",
    "autocast_linear",
    "current_stream",
    "empty",
    "probe",
    "record_event",
    "returned",
    "rows",
    "synchronize",
]


def probe() -> str | None:
    """Why PyTorch cannot run CUDA kernels here, or None."""
    if not torch.cuda.is_available():
        return f"no CUDA device (torch {torch.__version__}: torch.cuda.is_available() is False)"
    return None


_device = functools.cache(torch.device)  # torch.empty parses a device string on every call (+1 µs)


def empty(shape: tuple[int, ...], dtype: str, device: str, stream: Any = None) -> torch.Tensor:
    """An uninitialized tensor from PyTorch's caching allocator (stream-ordered on the current stream)."""
    return torch.empty(shape, dtype=TORCH_DTYPES[dtype], device=_device(device))


def synchronize(device: str, stream: Any) -> None:
    if stream is not None:
        stream.synchronize()
    else:
        torch.cuda.synchronize(torch.device(device))


def record_event(device: str, stream: Any) -> Any:
    event = torch.cuda.Event()
    event.record(stream)
    return event


def returned(args: Any, y: torch.Tensor) -> torch.Tensor:
    """What a `returns_output` kernel gives back: PyTorch's own result when the caller passed no out= (no
    allocation, no copy), else that result copied into the caller's buffer."""
    out = args.out
    if out is None:
        return y
    out.copy_(y if y.shape == out.shape else y.reshape(out.shape))
    return out


def autocast_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> Any:
    """F.linear as autocast runs it: each floating input other than float64 cast to `dtype` first."""

    def cast(t: torch.Tensor | None) -> torch.Tensor | None:
        eligible = t is not None and t.is_floating_point() and t.dtype != torch.float64
        return t.to(dtype) if eligible else t

    return torch.nn.functional.linear(cast(x), cast(weight), cast(bias))


def rows(t: torch.Tensor) -> torch.Tensor:
    """(..., C) -> (M, C): a view where the leading dims collapse, else a copy."""
    return t.reshape(math.prod(t.shape[:-1]), t.shape[-1])
