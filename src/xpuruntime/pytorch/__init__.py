"""xpuruntime.pytorch: the kernel policy inside an unmodified PyTorch training loop, eager or compiled.

    import xpuruntime.pytorch as xrt_torch
    xrt_torch.set_kernel_policy(matmul="cublasLt", attention="flash_v2")
    # ... the training loop as before: forward and backward follow the policy, also under torch.compile

The policy store is the core's; while the policy names a kernel for an op, that op's aten kernels are
overridden (see `install`), and nothing is installed otherwise. `patch(model)` puts the fused training ops
into a Hugging Face model (see `patching`). Every routed op is also a torch.library
custom op (`custom_ops`), which the routes emit into graphs that torch.compile traces (see `tracing` and
`compiled`); where the chosen kernel is traceable, the fused ops' bodies are traced into the graph and
inductor launches their Triton kernels itself (`custom_ops.inline`).

The modules form layers, each importing only those below it (tests/pytorch/test_pytorch_layers.py checks):

    __init__, policy, ops, graphs, autocast, profiling, allocator,
    patching                                                         the public API (patching: patch(model))
    install      the aten registrations the policies need
    compiled     inductor's graph passes (matrix products; the routing guard)
    inductor_pass  the pass object in inductor's config (imported once inductor is loaded)
    routes       the aten overrides, one file per op family
    tracing      decisions while a graph is traced; the routing guard; calls a policy cannot take
    custom_ops   the torch.library ops and their bodies, one file per op family (over custom_ops.eager, how
                 the fused training ops run eagerly or compiled, custom_ops.inline, how their kernels are
                 traced into compiled graphs, custom_ops.replay, how an eager body's launches are replayed,
                 and custom_ops.common)
    router       dispatching a routed call; which ops a policy steers; op families against the registry
    tuner        autotune's verdicts on routed calls and its hand-backs to PyTorch
    native       the C++ routes (native_routes.cpp)
    families     which ops share a policy's kernel name
    state        the one state object, STATE
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
except ImportError:
    raise ImportError("xpuruntime.pytorch requires PyTorch. Install with: pip install xpuruntime[torch]") from None

from . import ops
from .allocator import allocator_stats, reset_allocator, set_allocator
from .autocast import autocast
from .compiled import watch_inductor
from .graphs import CUDAGraphWrapper, capture_graph
from .install import installed_overrides, refresh_overrides
from .patching import PatchPlan, patch, patched, unpatch
from .policy import KernelPolicy, clear_kernel_policy, get_kernel_policy, kernel_policy, set_kernel_policy
from .profiling import profile
from .tracing import compiled_decisions
from .tuner import handed_back

__all__ = [
    "CUDAGraphWrapper",
    "KernelPolicy",
    "PatchPlan",
    "allocator_stats",
    "autocast",
    "capture_graph",
    "clear_kernel_policy",
    "compiled_decisions",
    "get_kernel_policy",
    "handed_back",
    "installed_overrides",
    "kernel_policy",
    "ops",
    "patch",
    "patched",
    "profile",
    "refresh_overrides",
    "reset_allocator",
    "set_allocator",
    "set_kernel_policy",
    "unpatch",
]

refresh_overrides()  # a policy from the environment applies from the start
watch_inductor()  # the graph passes, once torch.compile loads inductor
