"""The cublaslt backend: cuBLASLt GEMMs with fused epilogues (bias, ReLU, GELU and their backward
forms) through nvmath-python, on CUDA torch tensors. Policy name of its kernels: `cublasLt`."""

from __future__ import annotations

try:
    import torch  # noqa: F401  (operands are CUDA torch tensors)
except ImportError as exc:  # the registry records the backend as missing with this reason
    raise ImportError(f"the cublaslt backend needs PyTorch (and nvmath-python): {exc}") from exc

from ...registry import Backend
from ..torch.common import current_stream, empty, record_event, synchronize
from .common import probe

BACKEND = Backend(
    "cublaslt",
    device_type="cuda",
    empty=empty,
    probe=probe,
    current_stream=current_stream,
    synchronize=synchronize,
    record_event=record_event,
    doc="cuBLASLt through nvmath-python: stateful plans per signature, bias/ReLU/GELU epilogues",
)
