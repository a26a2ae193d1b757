"""ONNX front end: load a model, optimize its graph, run it with kernels chosen by the selector."""

from __future__ import annotations

from .errors import GraphError, InputFeedError, ModelLoadError, NodeExecutionError, UnsupportedModelError
from .options import GraphOptimizationLevel, SessionOptions
from .session import InferenceSession, NodeArg

__all__ = [
    "GraphError", "GraphOptimizationLevel", "InferenceSession", "InputFeedError", "ModelLoadError", "NodeArg",
    "NodeExecutionError", "SessionOptions", "UnsupportedModelError",
]  # fmt: skip
