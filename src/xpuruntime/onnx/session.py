"""InferenceSession: ONNX model -> graph IR -> passes -> one execution plan per input signature -> run.

sess = xrt.InferenceSession("model.onnx", policy="matmul=numpy_blas")
(logits,) = sess.run(None, {"input_ids": ids, "attention_mask": mask})

Initializers a feed may replace (IR version 4 and later: those also listed among the graph's inputs, as
in onnxruntime; `get_overridable_initializers()`) are constants of the optimized graph while no run feeds
them. A run that feeds some of them uses a variant of the graph, optimized once per set of fed names, in
which those are inputs: nothing folded, fused or packed from their defaults is used for a fed value.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..dispatch import Dispatcher, default_dispatcher
from ..errors import ArgumentError
from ..graph.ir import Graph, Value
from ..graph.passes import PassRecord, optimize
from ..policy import KernelPolicy, as_policy
from .errors import InputFeedError, RunTerminatedError
from .executor import ExecutionPlan
from .importer import import_model, load_model, overridable_initializers
from .iobinding import IOBinding
from .options import RunOptions, SessionOptions
from .providers import resolve
from .runners import GraphVariant, Runner, make_runner
from .semantics import ONNX_SEMANTICS
from .threads import ThreadLimits

_ONNX_TYPE = {
    "float32": "float", "float64": "double", "float16": "float16", "int64": "int64", "int32": "int32",
    "int16": "int16", "int8": "int8", "uint8": "uint8", "uint16": "uint16", "uint32": "uint32",
    "uint64": "uint64", "bool": "bool",
}  # fmt: skip


@dataclass(frozen=True)
class ModelMetadata:
    """What the model says about itself (onnxruntime's ModelMetadata)."""

    producer_name: str
    graph_name: str
    domain: str
    description: str
    graph_description: str
    version: int
    custom_metadata_map: dict[str, str]


@dataclass(frozen=True)
class NodeArg:
    """An input or output as onnxruntime describes it: name, shape (ints, names or None), type."""

    name: str
    shape: list
    type: str


def _node_arg(v: Value) -> NodeArg:
    shape = [] if v.shape is None else list(v.shape)
    return NodeArg(v.name, shape, f"tensor({_ONNX_TYPE.get(v.dtype or '', v.dtype or 'unknown')})")


RunnerFactory = Callable[[Dispatcher, "KernelPolicy | None", SessionOptions, Graph], Runner]


class InferenceSession:
    """Runs an ONNX model with kernels chosen by the selector (onnxruntime-style API)."""

    def __init__(
        self,
        path_or_bytes: Any,
        sess_options: SessionOptions | None = None,
        providers: Sequence[Any] | None = None,
        provider_options: Sequence[Mapping] | None = None,
        *,
        policy: KernelPolicy | str | Mapping | None = None,
        device: str | None = None,
        dispatcher: Dispatcher | None = None,
        runner: RunnerFactory | None = None,
    ) -> None:
        """`providers` as onnxruntime takes them (names or (name, options), best first; see providers.py), or
        `device` ('cpu', 'cuda[:N]'), which wins when given. `runner` replaces the runner the device would get (a
        factory; see runners.gpu_runner_factory)."""
        if sess_options is not None and not isinstance(sess_options, SessionOptions):
            what = type(sess_options).__name__
            raise ArgumentError(f"InferenceSession: sess_options expected SessionOptions, got {what}")
        self.options = sess_options or SessionOptions()
        self.options.check()
        self.policy = as_policy(policy)
        device, self._providers = resolve(providers, provider_options, device, self.options.log_severity_level >= 3)
        self.device = _check_device(device)
        self.dispatcher = dispatcher or default_dispatcher()
        self._threads = ThreadLimits(self.options.intra_op_num_threads, self.options.inter_op_num_threads)
        model = load_model(path_or_bytes)
        base_dir = os.path.dirname(os.fspath(path_or_bytes)) if isinstance(path_or_bytes, str | os.PathLike) else None
        self.original = import_model(model, base_dir)
        self._meta = _metadata(model)
        self._ir_version = int(model.ir_version)
        self._overridable = overridable_initializers(model, self.original)
        with self._threads():
            self.graph, self.pass_summary = self._optimize(self.original)
        self._inputs = list(self.original.inputs)
        self._outputs = list(self.original.outputs)
        self._variants = {frozenset(): GraphVariant(frozenset(), self.graph, tuple(self.graph.inputs))}
        self._lock = threading.Lock()
        make = runner or (lambda *args: make_runner(self.device, *args))
        self.runner: Runner = make(self.dispatcher, self.policy, self.options, self.graph)
        if self.options.optimized_model_filepath:
            from .export import save_graph

            save_graph(self.graph, self.options.optimized_model_filepath)

    def _optimize(self, graph: Graph) -> tuple[Graph, list[PassRecord]]:
        level = self.options.graph_optimization_level
        return optimize(graph, level, self.dispatcher, self.device, ONNX_SEMANTICS)

    # -- onnxruntime API ---------------------------------------------------------------------
    def get_inputs(self) -> list[NodeArg]:
        """The model's inputs (initializers excluded): name, shape (ints, symbols or None), type."""
        return [_node_arg(v) for v in self._inputs]

    def get_outputs(self) -> list[NodeArg]:
        """The model's outputs: name, shape, type."""
        return [_node_arg(v) for v in self._outputs]

    def get_overridable_initializers(self) -> list[NodeArg]:
        """Initializers a feed may replace (listed among the graph's inputs, IR version 4 and later)."""
        return [_node_arg(v) for v in self._overridable]

    def get_providers(self) -> list[str]:
        """The providers in use, best first (the CPU provider always last, as the fallback)."""
        first = self.runner.provider
        return [first, *(name for name, _ in self._providers if name != first)]

    def get_provider_options(self) -> dict[str, dict[str, str]]:
        """Each provider's options as given (values as strings, as onnxruntime reports them)."""
        options = dict(self._providers)
        return {name: dict(options.get(name, {})) for name in self.get_providers()}

    def get_session_options(self) -> SessionOptions:
        """The options the session was made with (checked, the optimization level as the enum)."""
        return self.options

    def get_modelmeta(self) -> ModelMetadata:
        """What the model says about itself: producer, graph name, domain, description, version, metadata."""
        return self._meta

    def run(
        self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any], run_options: RunOptions | None = None
    ) -> list:
        """Outputs named in `output_names` (all for None), as NumPy arrays (device tensors for device feeds)."""
        _check_run_options(run_options)
        wanted = self._output_indices(output_names)
        with self._threads():
            results = self.runner.run(self.variant_for(input_feed), input_feed)
        return [results[i] for i in wanted]

    def io_binding(self) -> IOBinding:
        """An IOBinding: inputs and outputs bound once (device buffers on the GPU), runs without host copies."""
        return IOBinding(self)

    def run_with_iobinding(self, binding: IOBinding, run_options: RunOptions | None = None) -> None:
        """Run with the binding's inputs; results land in its bound outputs (see IOBinding)."""
        _check_run_options(run_options)
        binding.run(run_options)

    # -- planning ----------------------------------------------------------------------------
    def plan(self, input_feed: Mapping[str, Any]) -> ExecutionPlan:
        """The execution plan for these inputs' signature (made and cached on first use)."""
        with self._threads():
            return self.runner.plan(self.variant_for(input_feed), input_feed)

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
        optimized, _ = self._optimize(graph)
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
        plan = self.plan(input_feed) if input_feed is not None else self.runner.last_plan()
        if self.runner.status():
            lines.append(f"  {self.runner.status()}")
        if plan is None:
            lines.append("  (no plan yet: run the model or pass input_feed)")
            return "\n".join(lines)
        lines.append(f"  plan: {len(plan.steps)} steps, {plan.folded} nodes folded for this signature, "
                     f"{plan.reused_buffers} buffers reused")  # fmt: skip
        said: set[str] = set()  # a candidate's verdict is printed once, at the first step it applies to
        for step in plan.steps:
            lines.append(f"  {step.node.name:<32} {step.node.op:<20} -> {step.describe()}")
            if verbose and step.plan is not None:
                verdicts = _candidates(step.plan)
                lines += [f"      {line}" for line in verdicts if line not in said]
                repeated = sum(line in said for line in verdicts)
                if repeated:
                    lines.append(f"      ({repeated} other candidate(s): as for an earlier step)")
                said.update(verdicts)
        return "\n".join(lines)

    def plan_summary(self) -> dict[str, int]:
        """Steps per kernel (or 'numpy op map') over all plans made so far."""
        counts: dict[str, int] = {}
        for plan in self.runner.plans():
            for step in plan.steps:
                key = step.describe().split(" (")[0]
                counts[key] = counts.get(key, 0) + 1
        return counts

    # -- profiling ---------------------------------------------------------------------------
    def end_profiling(self) -> str:
        """Write the recorded node times as a Chrome trace; returns the file name ('' if not profiling)."""
        if not self.options.enable_profiling:
            return ""
        path = f"{self.options.profile_file_prefix}_{time.strftime('%Y%m%d_%H%M%S')}.json"
        with open(path, "w") as f:
            json.dump({"traceEvents": self.runner.take_profile()}, f)
        return path

    @property
    def pass_records(self) -> list[PassRecord]:
        """What each graph pass did: nodes before and after, and its number of changes."""
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


def _check_device(device: str) -> str:
    if not isinstance(device, str) or not (device == "cpu" or device.startswith("cuda")):
        raise ArgumentError(f"InferenceSession: argument 'device' expected 'cpu' or 'cuda[:N]', got {device!r}")
    return device


def _check_run_options(run_options: Any) -> None:
    if run_options is not None and not isinstance(run_options, RunOptions):
        raise ArgumentError(f"run: run_options expected RunOptions or None, got {type(run_options).__name__}")
    if run_options is not None and run_options.terminate:
        raise RunTerminatedError("run: refused, RunOptions.terminate is set")


def _metadata(model: Any) -> ModelMetadata:
    return ModelMetadata(
        producer_name=model.producer_name, graph_name=model.graph.name, domain=model.domain,
        description=model.doc_string, graph_description=model.graph.doc_string, version=int(model.model_version),
        custom_metadata_map={p.key: p.value for p in model.metadata_props},
    )  # fmt: skip
