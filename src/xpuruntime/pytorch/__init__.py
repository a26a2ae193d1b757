"""xpuruntime.pytorch: the kernel policy inside an unmodified PyTorch training loop.

    import xpuruntime.pytorch as xrt_torch
    xrt_torch.set_kernel_policy(matmul="cublasLt", attention="flash_v2")
    # ... the training loop as before: forward and backward follow the policy

The policy store is the core's; while the policy names a kernel for an op, that op's aten kernels
are overridden (see `overrides`), and nothing is installed otherwise.
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
except ImportError:
    raise ImportError("xpuruntime.pytorch requires PyTorch. Install with: pip install xpuruntime[torch]") from None

from . import ops
from .allocator import allocator_stats, reset_allocator, set_allocator
from .autocast import autocast
from .graphs import CUDAGraphWrapper, capture_graph
from .handback import handed_back
from .overrides import installed_overrides, refresh_overrides
from .policy import KernelPolicy, clear_kernel_policy, get_kernel_policy, kernel_policy, set_kernel_policy
from .profiling import profile

__all__ = [
    "CUDAGraphWrapper",
    "KernelPolicy",
    "allocator_stats",
    "autocast",
    "capture_graph",
    "clear_kernel_policy",
    "get_kernel_policy",
    "handed_back",
    "installed_overrides",
    "kernel_policy",
    "ops",
    "profile",
    "refresh_overrides",
    "reset_allocator",
    "set_allocator",
    "set_kernel_policy",
]

refresh_overrides()  # a policy from the environment applies from the start
