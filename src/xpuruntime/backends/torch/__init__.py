"""The torch backend: PyTorch's own CUDA kernels (cuBLAS, its norms, softmax and reductions) registered
as ordinary candidates, so the selector can pick them and `explain` shows them beside ours."""

from __future__ import annotations

try:
    import torch  # noqa: F401  (the dependency this backend is about)
except ImportError as exc:  # the registry records the backend as missing with this reason
    raise ImportError(f"the torch backend needs PyTorch: {exc}") from exc

from ...registry import Backend
from .common import current_stream, empty, probe, record_event, synchronize

BACKEND = Backend(
    "torch",
    device_type="cuda",
    empty=empty,
    probe=probe,
    current_stream=current_stream,
    synchronize=synchronize,
    record_event=record_event,
    ambient_stream=True,  # PyTorch ops run on its current stream
    doc="PyTorch's CUDA kernels (cuBLAS matmul/linear, layer_norm, rms_norm, softmax, sum)",
)
