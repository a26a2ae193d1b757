"""The Triton backend: our own GPU kernels written in Triton, one module per op family.

On a machine with a CUDA device it takes CUDA torch tensors. Under `TRITON_INTERPRET=1` (CI) the same
kernels run on the CPU through Triton's interpreter; the backend then serves NumPy arrays (viewed as
torch tensors) and is explicit-only, so it runs only where a policy names one of its kernels.
"""

from __future__ import annotations

from typing import Any

try:
    import torch
    import triton  # noqa: F401  (the dependency this backend is about)
except ImportError as exc:  # the registry records the backend as missing with this reason
    raise ImportError(f"the triton backend needs PyTorch and Triton: {exc}") from exc

from ...registry import Backend
from ...runtime.streams import current_stream
from .common import INTERPRET, numpy_or_torch_empty


def _probe() -> str | None:
    if INTERPRET:
        return None
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False; set TRITON_INTERPRET=1 to run on the CPU)"
    return None


def _empty(shape: tuple[int, ...], dtype: str, device: str, stream: Any = None) -> Any:
    return numpy_or_torch_empty(shape, dtype, device)


def _synchronize(device: str, stream: Any) -> None:
    if stream is not None:
        stream.synchronize()
    elif device.startswith("cuda"):
        torch.cuda.synchronize(torch.device(device))


def _record_event(device: str, stream: Any) -> Any:
    if not device.startswith("cuda"):
        return None
    event = torch.cuda.Event()
    event.record(stream)
    return event


BACKEND = Backend(
    "triton",
    device_type="cpu" if INTERPRET else "cuda",
    empty=_empty,
    probe=_probe,
    current_stream=current_stream,
    synchronize=_synchronize,
    record_event=_record_event,
    ambient_stream=True,  # `common.launch` asks Triton's driver for the current stream
    explicit_only=INTERPRET,
    doc="Triton kernels on CUDA tensors" + (" (interpreter: only where the policy names them)" if INTERPRET else ""),
)
