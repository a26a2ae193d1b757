"""SessionOptions, RunOptions and GraphOptimizationLevel, named as in onnxruntime. Setting an attribute neither
class has is an error naming the closest one (onnxruntime's Python objects refuse unknown attributes too)."""

from __future__ import annotations

import difflib
import enum
from dataclasses import dataclass, fields
from typing import Any

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


class _Strict:
    """Refuses attributes the dataclass does not declare, suggesting the closest name."""

    def __setattr__(self, name: str, value: Any) -> None:
        known = [f.name for f in fields(self)]  # type: ignore[arg-type]
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f"; known: {', '.join(known)}"
            raise ArgumentError(f"{type(self).__name__} has no option '{name}'{hint}")
        super().__setattr__(name, value)


def _threads(owner: str, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ArgumentError(f"{owner}: '{name}' expected an int >= 0 (0: the library's default), got {value!r}")
    return value


@dataclass
class SessionOptions(_Strict):
    """Options of an InferenceSession (onnxruntime's names where they exist).

    `intra_op_num_threads` sizes the thread pools one op may use while the session runs (the BLAS library's, through
    threadpoolctl, and PyTorch's intra-op pool); `inter_op_num_threads` sizes PyTorch's inter-op pool (set once per
    process, as PyTorch allows). 0 keeps the libraries' defaults. `log_severity_level` 3 or more silences the
    session's warnings (provider fallback), as onnxruntime's errors-only level does."""

    graph_optimization_level: GraphOptimizationLevel = GraphOptimizationLevel.ORT_ENABLE_ALL
    optimized_model_filepath: str = ""  # save the optimized graph as ONNX here
    enable_profiling: bool = False  # per-node times; end_profiling() writes a Chrome trace
    profile_file_prefix: str = "xrt_profile"
    enable_mem_reuse: bool = True  # share buffers between values whose lifetimes do not overlap
    enable_cuda_graph: bool = True  # capture and replay a CUDA graph per static input signature (GPU)
    max_tensor_bytes: int = 0  # a node output larger is refused before it is allocated; 0: the device's memory
    max_cached_plans: int = 64  # plans kept (one per input signature), least recently used dropped; 0: no bound
    max_cached_plan_bytes: int = 256 << 20  # memory they may hold besides the shared buffer arena; 0: no bound
    intra_op_num_threads: int = 0
    inter_op_num_threads: int = 0
    log_severity_level: int = 2  # 0 verbose, 1 info, 2 warning, 3 error, 4 fatal
    logid: str = ""

    def check(self) -> None:
        """Raise ArgumentError for option values the session cannot use."""
        self.graph_optimization_level = GraphOptimizationLevel.parse(self.graph_optimization_level)
        for name in ("intra_op_num_threads", "inter_op_num_threads", "max_cached_plans", "max_cached_plan_bytes",
                     "max_tensor_bytes"):  # fmt: skip
            _threads("SessionOptions", name, getattr(self, name))
        if not isinstance(self.log_severity_level, int) or not 0 <= self.log_severity_level <= 4:
            raise ArgumentError(f"SessionOptions: 'log_severity_level' expected 0..4, got {self.log_severity_level!r}")


@dataclass
class RunOptions(_Strict):
    """Options of one run (onnxruntime's RunOptions): `terminate` set makes runs fail at once (another thread can
    set it to stop runs about to start); the log fields are kept for callers that set them."""

    log_severity_level: int = 2
    log_verbosity_level: int = 0
    logid: str = ""
    terminate: bool = False
    only_execute_path_to_fetches: bool = False
