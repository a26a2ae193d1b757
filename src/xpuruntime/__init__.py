"""xpuruntime: picks, explains and runs the kernel for each operation.

    import xpuruntime as xrt
    y = xrt.ops.matmul(a, b)
    with xrt.kernel_policy(matmul="blocked"):
        y = xrt.ops.matmul(a, b)
    xrt.explain("matmul", a, b)

Importing the package is cheap: names are resolved from their modules on first use (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "ops": "xpuruntime.ops",
    "InferenceSession": "xpuruntime.onnx",
    "SessionOptions": "xpuruntime.onnx",  # the ONNX front end
    # policy
    "KernelPolicy": "xpuruntime.policy",
    "set_kernel_policy": "xpuruntime.policy",
    "get_kernel_policy": "xpuruntime.policy",
    "clear_kernel_policy": "xpuruntime.policy",
    "kernel_policy": "xpuruntime.policy",
    # dispatch, plans, explain
    "Dispatcher": "xpuruntime.dispatch",
    "default_dispatcher": "xpuruntime.dispatch",
    "explain": "xpuruntime.dispatch",
    "plan_cache": "xpuruntime.dispatch",
    "last_event": "xpuruntime.dispatch",
    # logging and profiling
    "enable_dispatch_logging": "xpuruntime.log",
    "disable_dispatch_logging": "xpuruntime.log",
    "get_dispatch_logs": "xpuruntime.log",
    "clear_dispatch_logs": "xpuruntime.log",
    "dispatch_logging_enabled": "xpuruntime.log",
    "DispatchRecord": "xpuruntime.log",
    "profiler": "xpuruntime.profiling",
    "record_range": "xpuruntime.profiling",
    # registry and ABI
    "Registry": "xpuruntime.registry",
    "Backend": "xpuruntime.registry",
    "KernelSpec": "xpuruntime.registry",
    "kernel": "xpuruntime.registry",
    "register_kernel": "xpuruntime.registry",
    "default_registry": "xpuruntime.registry",
    "OpSchema": "xpuruntime.schema",
    "DispatchContext": "xpuruntime.context",
    "TensorSpec": "xpuruntime.abi",
    "ArgPack": "xpuruntime.abi",
    "LaunchConfig": "xpuruntime.abi",
    "MathMode": "xpuruntime.abi",
    "SyncPolicy": "xpuruntime.abi",
    # devices
    "devices": "xpuruntime.runtime.device",
    "DeviceInfo": "xpuruntime.runtime.device",
}
_ERRORS = (
    "XpuRuntimeError", "ArgumentError", "ShapeError", "DTypeError", "LayoutError", "DeviceMismatchError",
    "UnknownNameError", "UnknownOpError", "UnknownKernelError", "RegistrationError", "PolicyError",
    "NoKernelError", "UnsupportedByPolicyError", "UnsupportedModelError", "LaunchError", "OutOfMemoryError",
    "FileError", "KernelFallbackWarning",
)  # fmt: skip
_EXPORTS.update(dict.fromkeys(_ERRORS, "xpuruntime.errors"))

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'xpuruntime' has no attribute '{name}'")
    module = importlib.import_module(module_name)
    value = module if name == "ops" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


if TYPE_CHECKING:
    from . import ops
    from .abi import ArgPack, LaunchConfig, MathMode, SyncPolicy, TensorSpec
    from .context import DispatchContext
    from .dispatch import Dispatcher, default_dispatcher, explain, last_event, plan_cache
    from .errors import *
    from .log import (
        DispatchRecord,
        clear_dispatch_logs,
        disable_dispatch_logging,
        enable_dispatch_logging,
        get_dispatch_logs,
    )  # fmt: skip
    from .policy import KernelPolicy, clear_kernel_policy, get_kernel_policy, kernel_policy, set_kernel_policy
    from .profiling import profiler, record_range
    from .registry import Backend, KernelSpec, Registry, default_registry, kernel, register_kernel
    from .runtime.device import DeviceInfo, devices
    from .schema import OpSchema
