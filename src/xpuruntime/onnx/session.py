"""InferenceSession: ONNX model -> graph IR -> passes -> one execution plan per input signature -> run.

sess = xrt.InferenceSession("model.onnx", policy="matmul=numpy_blas")
(logits,) = sess.run(None, {"input_ids": ids, "attention_mask": mask})

Initializers a feed may replace (IR version 4 and later: those also listed among the graph's inputs, as
in onnxruntime; `get_overridable_initializers()`) are constants of the optimized graph while no run feeds
them. A run that feeds some of them uses a variant of the graph, optimized once per set of fed names, in
which those are inputs: nothing folded, fused or packed from their defaults is used for a fed value.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dispatch import Dispatcher, default_dispatcher
from ..errors import ArgumentError, DTypeError, ShapeError
from ..graph.ir import Graph, Value
from ..graph.passes import PassRecord, optimize
from ..policy import KernelPolicy, as_policy, current_policy, kernel_policy
from .errors import InputFeedError
from .executor import ExecutionPlan, Planner
from .importer import import_model, load_model, overridable_initializers
from .options import GraphOptimizationLevel, SessionOptions

_ONNX_TYPE = {
    "float32": "float", "float64": "double", "float16": "float16", "int64": "int64", "int32": "int32",
    "int16": "int16", "int8": "int8", "uint8": "uint8", "uint16": "uint16", "uint32": "uint32",
    "uint64": "uint64", "bool": "bool",
}  # fmt: skip


@dataclass(frozen=True)
class NodeArg:
    """An input or output as onnxruntime describes it: name, shape (ints, names or None), type."""

    name: str
    shape: list
    type: str


def _node_arg(v: Value) -> NodeArg:
    shape = [] if v.shape is None else list(v.shape)
    return NodeArg(v.name, shape, f"tensor({_ONNX_TYPE.get(v.dtype or '', v.dtype or 'unknown')})")


@dataclass(frozen=True)
class GraphVariant:
    """The optimized graph a run uses: `fed` names the overridable initializers the run feeds (inputs
    here, after the model's own inputs); `inputs` is the graph's inputs, in the order feeds are passed."""

    fed: frozenset[str]
    graph: Graph
    inputs: tuple[Value, ...]


class InferenceSession:
    """Runs an ONNX model with kernels chosen by the selector (onnxruntime-style API)."""

    def __init__(
        self,
        path_or_bytes: Any,
        sess_options: SessionOptions | None = None,
        providers: Sequence[str] | None = None,
        *,
        policy: KernelPolicy | str | Mapping | None = None,
        device: str = "cpu",
        dispatcher: Dispatcher | None = None,
    ) -> None:
        self.options = sess_options or SessionOptions()
        self.options.graph_optimization_level = GraphOptimizationLevel.parse(self.options.graph_optimization_level)
        self.policy = as_policy(policy)
        self.device = _check_device(device, providers)
        self.dispatcher = dispatcher or default_dispatcher()
        model = load_model(path_or_bytes)
        base_dir = os.path.dirname(os.fspath(path_or_bytes)) if isinstance(path_or_bytes, str | os.PathLike) else None
        self.original = import_model(model, base_dir)
        self._ir_version = int(model.ir_version)
        self._overridable = overridable_initializers(model, self.original)
        level = self.options.graph_optimization_level
        self.graph, self.pass_summary = optimize(self.original, level, self.dispatcher, self.device)
        self._inputs = list(self.original.inputs)
        self._outputs = list(self.original.outputs)
        self._variants = {frozenset(): GraphVariant(frozenset(), self.graph, tuple(self.graph.inputs))}
        self._fns: dict[int, Any] = {}
        self._plans: dict[tuple, ExecutionPlan] = {}
        self._lock = threading.Lock()
        self._profile_events: list[dict] = []
        self._backend = None
        if self.device != "cpu":
            from .gpu import GpuRunner

            self._backend = GpuRunner(self)
        if self.options.optimized_model_filepath:
            from .export import save_graph

            save_graph(self.graph, self.options.optimized_model_filepath)

    # -- onnxruntime API ---------------------------------------------------------------------
    def get_inputs(self) -> list[NodeArg]:
        return [_node_arg(v) for v in self._inputs]

    def get_outputs(self) -> list[NodeArg]:
        return [_node_arg(v) for v in self._outputs]

    def get_overridable_initializers(self) -> list[NodeArg]:
        """Initializers a feed may replace (listed among the graph's inputs, IR version 4 and later)."""
        return [_node_arg(v) for v in self._overridable]

    def get_providers(self) -> list[str]:
        return ["CUDAExecutionProvider"] if self.device != "cpu" else ["CPUExecutionProvider"]

    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any], run_options: Any = None) -> list:
        """Outputs named in `output_names` (all for None), as NumPy arrays (device tensors for device feeds)."""
        wanted = self._output_indices(output_names)
        if self._backend is not None:
            results = self._backend.run(input_feed)
        else:
            variant, feeds = self.variant_feeds(input_feed)
            plan, first = self._plan_for(variant, feeds)
            if first is not None:
                results = first
            else:
                start = time.perf_counter_ns()
                results = plan.run(feeds, self.options.enable_profiling)
                if self.options.enable_profiling:
                    self._record_profile(plan, start)
        return [results[i] for i in wanted]

    # -- planning ----------------------------------------------------------------------------
    def _policy_scope(self) -> Any:
        return kernel_policy(self.policy) if self.policy is not None else contextlib.nullcontext()

    def _plan_for(self, variant: GraphVariant, feeds: list[np.ndarray]) -> tuple[ExecutionPlan, list | None]:
        policy = self.policy or current_policy()
        key = (policy.fingerprint, variant.fed, *[(a.dtype, a.shape) for a in feeds])
        plan = self._plans.get(key)
        if plan is not None:
            return plan, None
        with self._lock, self._policy_scope():
            planner = Planner(variant.graph, self.dispatcher, self._fns, self.options.enable_mem_reuse)
            plan, outputs = planner.build({v.name: a for v, a in zip(variant.inputs, feeds)})
            self._plans[key] = plan
        return plan, outputs

    def plan(self, input_feed: Mapping[str, Any]) -> ExecutionPlan:
        """The execution plan for these inputs' signature (made and cached on first use)."""
        return self._plan_for(*self.variant_feeds(input_feed))[0]

    def check_feed(self, input_feed: Mapping[str, Any]) -> list[np.ndarray]:
        """Inputs in graph order as contiguous arrays (fed initializers after the model's inputs); errors
        name the input and what was expected."""
        return self.variant_feeds(input_feed)[1]

    def variant_feeds(self, input_feed: Mapping[str, Any]) -> tuple[GraphVariant, list[np.ndarray]]:
        """The graph variant for the names fed, and the feeds checked against it, in its input order."""
        variant = self.variant_for(input_feed)
        feeds, symbols = [], {}
        for v in variant.inputs:
            feeds.append(_check_input(v, input_feed[v.name], symbols))
        return variant, feeds

    def variant_for(self, input_feed: Mapping[str, Any]) -> GraphVariant:
        """Check the names fed (unknown, missing, constant initializers) and pick the graph variant."""
        if not isinstance(input_feed, Mapping):
            raise InputFeedError(f"run: input_feed expected a dict of name -> array, got {type(input_feed).__name__}")
        names = [v.name for v in self._inputs]
        overridable = [v for v in self._overridable if v.name in input_feed]
        unknown = sorted(set(input_feed) - set(names) - {v.name for v in overridable})
        constants = [n for n in unknown if n in self.original.initializers]
        if constants:
            which = ", ".join(f"'{n}'" for n in constants)
            what = "is an initializer" if len(constants) == 1 else "are initializers"
            raise InputFeedError(f"run: {which} {what} that a feed cannot override ({self._why_constant()}); "
                                 f"the model's inputs are {names}, and its overridable initializers "
                                 f"{[v.name for v in self._overridable]}")  # fmt: skip
        if unknown:
            raise InputFeedError(f"run: unknown input(s) {unknown}; the model's inputs are {names}")
        missing = [n for n in names if n not in input_feed]
        if missing:
            raise InputFeedError(f"run: missing input(s) {missing}; the model's inputs are {names}")
        fed = frozenset(v.name for v in overridable)
        variant = self._variants.get(fed)
        if variant is None:
            with self._lock:
                variant = self._variants.get(fed) or self._make_variant(overridable)
                self._variants[fed] = variant
        return variant

    def _why_constant(self) -> str:
        if self._ir_version < 4:
            return (
                f"the model's IR version {self._ir_version} makes every initializer a constant; from 4 on, "
                "those listed among the graph's inputs can be fed"
            )
        return "it is not listed among the graph's inputs"

    def _make_variant(self, fed: list[Value]) -> GraphVariant:
        """The graph with the `fed` initializers turned into inputs, optimized as the session's own."""
        graph = self.original.copy()
        for v in fed:
            del graph.initializers[v.name]
        graph.inputs = [*graph.inputs, *fed]
        level = self.options.graph_optimization_level
        optimized, _ = optimize(graph, level, self.dispatcher, self.device)
        return GraphVariant(frozenset(v.name for v in fed), optimized, tuple(optimized.inputs))

    def _output_indices(self, output_names: Sequence[str] | None) -> list[int]:
        names = [v.name for v in self._outputs]
        if output_names is None:
            return list(range(len(names)))
        if isinstance(output_names, str):
            raise ArgumentError("run: output_names expected a list of names or None, got a string")
        index = []
        for name in output_names:
            if name not in names:
                raise InputFeedError(f"run: unknown output '{name}'; the model's outputs are {names}")
            index.append(names.index(name))
        return index

    # -- introspection -----------------------------------------------------------------------
    def explain(self, input_feed: Mapping[str, Any] | None = None, verbose: bool = False) -> str:
        """Pass summary and, per step of the plan for `input_feed` (or the last plan), the kernel and why;
        `verbose` adds every other candidate kernel with its score or the reasons it was rejected."""
        lines = [f"InferenceSession on {self.device}, level {self.options.graph_optimization_level.name}"]
        lines += [
            f"  pass {r.name:<22} nodes {r.before:>4} -> {r.after:<4} ({r.changes} changes)" for r in self.pass_summary
        ]
        if self._backend is not None:
            if input_feed is not None:
                self.run(None, input_feed)
            entries = list(self._backend.entries.values())
            plan = entries[-1].plan if entries else None
            if entries:
                lines.append(f"  {entries[-1].note}")
        else:
            plan = self.plan(input_feed) if input_feed is not None else next(reversed(self._plans.values()), None)
        if plan is None:
            lines.append("  (no plan yet: run the model or pass input_feed)")
            return "\n".join(lines)
        lines.append(f"  plan: {len(plan.steps)} steps, {plan.folded} nodes folded for this signature, "
                     f"{plan.reused_buffers} buffers reused")  # fmt: skip
        for step in plan.steps:
            lines.append(f"  {step.node.name:<32} {step.node.op:<20} -> {step.describe()}")
            if verbose and step.plan is not None:
                lines += [f"      {line}" for line in _candidates(step.plan)]
        return "\n".join(lines)

    def plan_summary(self) -> dict[str, int]:
        """Steps per kernel (or 'numpy op map') over all plans made so far."""
        counts: dict[str, int] = {}
        plans = self._backend.plans() if self._backend is not None else self._plans.values()
        for plan in plans:
            for step in plan.steps:
                key = step.describe().split(" (")[0]
                counts[key] = counts.get(key, 0) + 1
        return counts

    # -- profiling ---------------------------------------------------------------------------
    def _record_profile(self, plan: ExecutionPlan, start: int) -> None:
        t = start / 1000.0
        for name, us in plan.profile:
            self._profile_events.append({"name": name, "ph": "X", "ts": t, "dur": us, "pid": 0, "tid": 0})
            t += us
        plan.profile.clear()

    def end_profiling(self) -> str:
        """Write the recorded node times as a Chrome trace; returns the file name ('' if not profiling)."""
        if not self.options.enable_profiling:
            return ""
        path = f"{self.options.profile_file_prefix}_{time.strftime('%Y%m%d_%H%M%S')}.json"
        with open(path, "w") as f:
            json.dump({"traceEvents": self._profile_events}, f)
        self._profile_events = []
        return path

    @property
    def pass_records(self) -> list[PassRecord]:
        return list(self.pass_summary)


def _candidates(plan: Any) -> list[str]:
    """The selector's verdict on every kernel it considered for a step (from the plan's decision)."""
    lines = []
    for candidate in plan.decision.candidates:
        name = f"{candidate.kernel.name} [{candidate.kernel.backend}]"
        if candidate.kernel is plan.kernel:
            continue
        if candidate.supported:
            lines.append(f"{name}: supported, score {candidate.score:g} (lower than the chosen kernel's)")
        else:
            lines.append(f"{name}: rejected: {'; '.join(candidate.reasons)}")
    return lines


def _check_device(device: str, providers: Sequence[str] | None) -> str:
    if providers and any("CUDA" in p for p in providers) and device == "cpu":
        device = "cuda"
    if not isinstance(device, str) or not (device == "cpu" or device.startswith("cuda")):
        raise ArgumentError(f"InferenceSession: argument 'device' expected 'cpu' or 'cuda[:N]', got {device!r}")
    return device


def _check_input(v: Value, value: Any, symbols: dict[str, tuple[str, int]]) -> np.ndarray:
    try:
        array = np.asarray(value)
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
    except Exception as exc:
        raise InputFeedError(f"run: input '{v.name}' cannot be converted to an array: {exc}") from None
    if v.dtype is not None and array.dtype.name != v.dtype:
        raise DTypeError(f"run: input '{v.name}' expected dtype {v.dtype}, got {array.dtype.name}")
    check_shape(v, array.shape, symbols)
    return array


def check_shape(v: Value, shape: tuple[int, ...], symbols: dict[str, tuple[str, int]]) -> None:
    """Rank, fixed dims and symbolic dims shared between inputs; errors name the input and the dim."""
    if v.shape is None:
        return
    if len(shape) != len(v.shape):
        raise ShapeError(
            f"run: input '{v.name}' expected rank {len(v.shape)} (shape {list(v.shape)}), got shape {list(shape)}"
        )
    for axis, (want, got) in enumerate(zip(v.shape, shape)):
        if isinstance(want, int) and want != got:
            raise ShapeError(
                f"run: input '{v.name}' expected size {want} on dim {axis} (shape {list(v.shape)}), "
                f"got shape {list(shape)}"
            )
        if isinstance(want, str):
            seen = symbols.setdefault(want, (v.name, got))
            if seen[1] != got:
                raise ShapeError(
                    f"run: input '{v.name}' dim {axis} ('{want}') is {got}, "
                    f"but input '{seen[0]}' has '{want}' = {seen[1]}"
                )
