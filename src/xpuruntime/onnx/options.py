"""SessionOptions and GraphOptimizationLevel, named as in onnxruntime."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ..errors import ArgumentError


class GraphOptimizationLevel(enum.IntEnum):
    """Which passes run: none; basic cleanups; + pattern fusions into xrt ops; + elementwise fusion."""

    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_ALL = 99

    @classmethod
    def parse(cls, value: GraphOptimizationLevel | int | str) -> GraphOptimizationLevel:
        """Accept the enum, its int value, or a name: 'disabled', 'basic', 'extended', 'all'."""
        if isinstance(value, cls):
            return value
        names = {"disabled": 0, "disable": 0, "none": 0, "basic": 1, "extended": 2, "all": 99}
        try:
            if isinstance(value, str):
                key = value.strip().lower()
                return cls(names[key]) if key in names else cls[value.strip().upper()]
            return cls(int(value))
        except (KeyError, ValueError):
            raise ArgumentError(
                f"graph_optimization_level: expected one of {sorted(names)} or a GraphOptimizationLevel, got {value!r}"
            ) from None


@dataclass
class SessionOptions:
    """Options of an InferenceSession (onnxruntime's names where they exist)."""

    graph_optimization_level: GraphOptimizationLevel = GraphOptimizationLevel.ORT_ENABLE_ALL
    optimized_model_filepath: str = ""  # save the optimized graph as ONNX here
    enable_profiling: bool = False  # per-node times; end_profiling() writes a Chrome trace
    profile_file_prefix: str = "xrt_profile"
    enable_mem_reuse: bool = True  # share buffers between values whose lifetimes do not overlap
    enable_cuda_graph: bool = True  # capture and replay a CUDA graph per static input signature (GPU)
    max_tensor_bytes: int = 0  # a node output larger is refused before it is allocated; 0: the device's memory
    max_cached_plans: int = 64  # plans kept (one per input signature), least recently used dropped; 0: no bound
    max_cached_plan_bytes: int = 256 << 20  # memory they may hold besides the shared buffer arena; 0: no bound
