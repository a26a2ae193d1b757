"""ONNX front end: load a model, optimize its graph, run it with kernels chosen by the selector.

How a model goes through it, and where each part lives:

    session.py     InferenceSession: the onnxruntime-style API; loads, optimizes, checks feed names, keeps a
                   graph variant per set of fed initializers, and hands each run to its runner
    importer.py    ModelProto -> graph IR (graph/ir.py), every load-time check; old-opset forms rewritten and
                   declined attribute values refused through the op records (`upgrade`, `check`)
    ops/           one OpRecord per ONNX op, one module per op family (elementwise, shape, indexing, linalg,
                   reduce, nn, pad, resize, ...): its NumPy builder, its PyTorch builder (GPU path), the
                   inputs read on the host, tuple outputs, old-opset rewrites, checks, and its lowering to an
                   xrt op. record.py says what each fact means; adding an op touches only its family module.
    semantics.py   what the graph passes may ask about ONNX ops (fold a node, infer types): the passes in
                   graph/passes know the graph IR only
    runners/       the execution providers: CpuRunner (NumPy) and GpuRunner (PyTorch tensors, CUDA graphs),
                   each with its bounded plan cache; the session picks one for its device
    executor.py    Planner and ExecutionPlan: one plan per input signature, made by running the graph once
                   (kernel steps chosen by the selector, other steps the op records' functions, memory reuse)
    lowering.py    which nodes run as xrt ops through the selector (from the records, and the 'xrt' domain)
    feeds.py       checks of a run's inputs (dtype, rank, fixed and symbolic dims)
    export.py      graph IR -> ModelProto (shape inference, saving the optimized graph)
    backend.py     the onnx.backend adapter that runs ONNX's node test suite
    providers.py   onnxruntime's provider names and options -> the session's device (fallback with a warning)
    options.py     SessionOptions, RunOptions, GraphOptimizationLevel;  threads.py  thread pools sized by them
    iobinding.py   IOBinding: inputs and outputs bound to buffers once (device buffers on the GPU)
    errors.py      the errors it raises
"""

from __future__ import annotations

from .errors import (
    GraphError,
    InputFeedError,
    ModelLoadError,
    NodeExecutionError,
    OutputTooLargeError,
    RunTerminatedError,
    UnsupportedModelError,
)  # fmt: skip
from .iobinding import IOBinding
from .options import GraphOptimizationLevel, RunOptions, SessionOptions
from .providers import get_available_providers
from .session import InferenceSession, ModelMetadata, NodeArg

__all__ = [
    "GraphError", "GraphOptimizationLevel", "IOBinding", "InferenceSession", "InputFeedError", "ModelLoadError",
    "ModelMetadata", "NodeArg", "NodeExecutionError", "OutputTooLargeError", "RunOptions", "RunTerminatedError",
    "SessionOptions", "UnsupportedModelError", "get_available_providers",
]  # fmt: skip
