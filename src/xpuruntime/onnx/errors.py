"""Errors of the ONNX front end, each a subclass of the runtime's `XpuRuntimeError` hierarchy."""

from __future__ import annotations

from ..errors import ArgumentError, LaunchError, XpuRuntimeError
from ..graph.ir import GraphError


class ModelLoadError(XpuRuntimeError, ValueError):
    """The model file or bytes cannot be read or parsed (missing, truncated, not ONNX, bad tensors)."""


class UnsupportedModelError(XpuRuntimeError, NotImplementedError):
    """The model uses ops, opsets or dtypes the session cannot run; the message lists all of them."""


class InputFeedError(ArgumentError):
    """`run()` got a missing, unknown or unconvertible input."""


class OutputTooLargeError(XpuRuntimeError, MemoryError):
    """A node's output, estimated from its input shapes before anything is allocated, exceeds the memory a
    tensor may take (SessionOptions.max_tensor_bytes); the message names the node, the shape and the bytes."""


class NodeExecutionError(LaunchError):
    """A node failed while running; the message names the node, its op and the input shapes."""


__all__ = [
    "GraphError", "InputFeedError", "ModelLoadError", "NodeExecutionError", "OutputTooLargeError",
    "RunTerminatedError", "UnsupportedModelError",
]  # fmt: skip


class RunTerminatedError(XpuRuntimeError, RuntimeError):
    """A run was refused because its RunOptions.terminate was set."""
