"""Execution plans: one per input signature, made by running the graph once and recording each step.

While planning, values computed only from constants and input shapes (the Shape -> Gather -> Concat
chains exporters emit) are evaluated once and kept as constants of the plan; every other node becomes
a step. A step is either a kernel launch with a Plan from the dispatcher (chosen once, here, by the
selector under the session's policy) or a NumPy function of the op map. After the planning run, the
outputs of kernel steps whose lifetimes do not overlap share buffers (memory reuse), and those buffers
are kept from run to run. Graph outputs always get fresh memory.

A run with the shared buffers then needs no per-step lookups for what is fixed (constants, buffers and
views of them): those values sit in the bound template, view steps on them are done once, and a kernel
step whose arrays are all fixed launches an ArgPack built once (`_bind`).
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..abi import ArgPack
from ..dispatch import Dispatcher, checked_output
from ..errors import UnsupportedByPolicyError, XpuRuntimeError
from ..graph.ir import Graph, Node
from .errors import NodeExecutionError, OutputTooLargeError
from .lowering import (
    XRT_DOMAIN,
    buffer_positions,
    empty_like,
    flattens,
    from_nhwc,
    in_channels_last,
    lower,
    stored_order,
    to_nhwc,
)
from .ops import OPS
from .ops.record import broadcast_size


@dataclass
class Step:
    """One node's work in a plan: `run(env)` reads its input slots and writes its output slots."""

    node: Node
    kind: str  # "kernel" or "numpy"
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    plan: Any = None  # the dispatcher's Plan for kernel steps
    fn: Callable | None = None  # the op-map function for numpy steps
    note: str = ""  # why a node with an xrt lowering runs as NumPy
    buffer_slot: int = 0  # where a kernel step finds its reused output buffer (slot 0: None, allocate)
    flat: bool = False  # a kernel step's MatMul runs on (M, K) views (see lowering.flattens)
    nhwc: bool = False  # a kernel step's elementwise op runs on NHWC views (see lowering.in_channels_last)
    buffers: tuple[tuple[int, int], ...] = ()  # (op input, output slot): an xrt node's further outputs, new each run
    stored: tuple[int, ...] | None = None  # the kernel's output is stored in this order (lowering.stored_order)
    last_out: Any = None  # the array the kernel wrote on the planning run (the buffer's shape and dtype)
    run: Callable[[list], None] = field(default=lambda env: None, repr=False)

    def describe(self) -> str:
        if self.kind == "kernel":
            k = self.plan.kernel
            return f"{k.op}/{k.name} [{k.backend}] ({self.plan.reason})"
        return f"{self.kind} op map" + (f" ({self.note})" if self.note else "")


class Arena:
    """Host memory for the reused buffers of plans: every plan of a runner lays its buffers out in the same
    block, so that the plans of many input signatures hold the largest one's memory, not the sum. One
    shared-buffer run at a time uses it (`lock`); a run that finds it taken allocates its own arrays. A plan
    needing more than the block holds replaces it with a larger one; the others move to it on their next run."""

    def __init__(self) -> None:
        self.block: tuple[int, np.ndarray] = (0, np.empty(0, np.uint8))  # (generation, memory), replaced whole
        self.lock = threading.Lock()

    def fit(self, nbytes: int) -> None:
        generation, memory = self.block
        if nbytes > memory.nbytes:
            self.block = (generation + 1, np.empty(nbytes, np.uint8))

    @property
    def nbytes(self) -> int:
        return self.block[1].nbytes


ALIGN = 64  # bytes between buffers in an arena


@dataclass
class ExecutionPlan:
    """Steps, constant slots and buffer assignment for one input signature."""

    slots: dict[str, int]
    template: list
    steps: list[Step]
    input_slots: list[int]
    output_slots: list[int]
    folded: int = 0  # nodes evaluated once while planning (shape chains)
    varying: int = 0  # steps whose input shapes depend on input values (run by the op map, never captured)
    static_outputs: set[int] = field(default_factory=set)  # outputs that are plan constants: copied out
    reused_buffers: int = 0
    nbytes: int = 0  # host memory the plan keeps alive (see _held_bytes)
    profile: list[tuple[str, float]] = field(default_factory=list)
    plain_template: list | None = None  # the template without the reused buffers (for concurrent runs)
    bound_template: list | None = None  # the template plus every fixed value of a shared-buffer run
    bound_steps: list[Step] = field(default_factory=list)  # what is left to run with it (see _bind)
    layout: list[tuple[int, int, tuple, np.dtype]] = field(default_factory=list)  # (slot, offset, shape, dtype)
    arena_bytes: int = 0  # what the reused buffers and the kernels' workspace take in the arena
    workspace: tuple[int, int] = (0, 0)  # (offset, bytes) of the bound launches' workspace in the arena
    arena: Arena | None = None
    generation: int = -1  # of the arena block the bound template views

    def run(self, feeds: list[np.ndarray], profiling: bool = False) -> list[Any]:
        """Run the steps; a run that finds another one using the shared buffers allocates its own."""
        if self.arena is None:
            return self._run(self.template, self.steps, feeds, profiling)
        if not self.arena.lock.acquire(blocking=False):
            return self._run(self.plain_template, self.steps, feeds, profiling)
        try:
            if self.generation != self.arena.block[0]:
                _attach(self)
            return self._run(self.bound_template, self.bound_steps, feeds, profiling)
        finally:
            self.arena.lock.release()

    def _run(self, template: list, steps: list[Step], feeds: list[np.ndarray], profiling: bool) -> list[Any]:
        with np.errstate(all="ignore"):  # inf/NaN follow IEEE rules silently, as in onnxruntime
            return self._steps(template, steps, feeds, profiling)

    def _steps(self, template: list, steps: list[Step], feeds: list[np.ndarray], profiling: bool) -> list[Any]:
        env = template.copy()
        for slot, array in zip(self.input_slots, feeds):
            env[slot] = array
        index = 0
        try:
            if profiling:
                for index, step in enumerate(steps):  # noqa: B007 (index names the failing step)
                    start = time.perf_counter_ns()
                    step.run(env)
                    self.profile.append((step.node.name, (time.perf_counter_ns() - start) / 1000.0))
            else:
                for index, step in enumerate(steps):  # noqa: B007 (index names the failing step)
                    step.run(env)
        except OutputTooLargeError:
            raise
        except XpuRuntimeError as exc:
            raise NodeExecutionError(_failure(steps[index], env, exc)) from exc
        except Exception as exc:
            raise NodeExecutionError(_failure(steps[index], env, exc)) from exc
        return _results(env, self.output_slots, self.static_outputs, feeds)


def _results(values: list, slots: list[int], constants: set[int], feeds: Any) -> list[Any]:
    """The graph outputs as arrays the caller owns: plan constants and the caller's own inputs are copied
    (changing a result must change neither the next run nor the inputs)."""
    fed = {id(a) for a in feeds}
    return [_copy(values[s]) if s in constants or id(values[s]) in fed else _output(values[s]) for s in slots]


def _copy(value: Any) -> Any:
    return value.clone() if hasattr(value, "clone") else np.array(value)


def _output(value: Any) -> Any:
    if isinstance(value, np.ndarray) and (not value.flags.writeable or value.base is not None):
        return np.array(value)  # broadcast views, constants, views of internal buffers: the caller owns a copy
    if not isinstance(value, np.ndarray) and type(value).__module__ == "numpy":
        return np.asarray(value)
    return value


def _failure(step: Step, env: list, exc: BaseException) -> str:
    shapes = ", ".join(
        f"{getattr(env[i], 'dtype', '?')}{list(getattr(env[i], 'shape', ()))}" if env[i] is not None else "None"
        for i in step.inputs
    )
    return f"{step.node.describe()} failed on inputs ({shapes}): {type(exc).__name__}: {exc}"


class Planner:
    """Builds an ExecutionPlan for one input signature by running the graph once (NumPy arrays; the GPU
    planner overrides the hooks marked below for device tensors)."""

    step_kind = "numpy"  # hook: how explain() labels non-kernel steps
    transposed_outputs = False  # hook: kernel outputs may be stored in their reader's order (lowering.stored_order)
    wrap: Callable = staticmethod(np.asarray)  # hook: what a non-kernel step's result is turned into

    def function(self, node: Node) -> Callable:
        """Hook: a non-kernel step's function (built by the op record's NumPy builder here)."""
        return OPS[node.op].numpy(node, self.graph.opset)

    def __init__(
        self,
        graph: Graph,
        dispatcher: Dispatcher,
        fns: dict[int, Callable],
        reuse_memory: bool = True,
        max_tensor_bytes: int = 0,
        arena: Arena | None = None,
    ):
        self.graph = graph
        self.dispatcher = dispatcher
        self.fns = fns  # id(node) -> step function (built once per session)
        self.static_fns: dict[int, Callable] = {}
        self.reuse_memory = reuse_memory
        self.max_tensor_bytes = max_tensor_bytes  # 0: no bound (see check_output_size)
        self.arena = arena  # where reused buffers live (None: an arena of the plan's own)
        self._readers: dict[str, list[Node]] = {}  # value name -> its reader nodes (when transposed_outputs)

    def build(self, feeds: dict[str, np.ndarray]) -> tuple[ExecutionPlan, list[Any]]:
        with np.errstate(all="ignore"):
            return self._build(feeds)

    def _build(self, feeds: dict[str, np.ndarray]) -> tuple[ExecutionPlan, list[Any]]:
        graph = self.graph
        slots: dict[str, int] = {"": 0}
        values: list[Any] = [None]
        static: set[int] = {0}

        def slot(name: str) -> int:
            if name not in slots:
                slots[name] = len(values)
                values.append(None)
            return slots[name]

        def output_slot(name: str) -> int:
            """An output the model leaves out ('') gets a slot of its own: slot 0, read for optional inputs
            left out, must stay None."""
            if name:
                return slot(name)
            values.append(None)
            return len(values) - 1

        for name, array in graph.initializers.items():
            static.add(slot(name))
            values[slots[name]] = array
        input_slots = [slot(v.name) for v in graph.inputs]
        for v, s in zip(graph.inputs, input_slots):
            values[s] = feeds[v.name]
        steps: list[Step] = []
        folded = 0
        varying: set[int] = set()  # slots whose shape can differ between runs of this signature
        self._readers = graph.consumers() if self.transposed_outputs else {}
        for node in graph.nodes:
            ins = tuple(slot(n) for n in node.inputs)
            outs = tuple(output_slot(n) for n in node.outputs)
            args = [values[i] for i in ins]
            shape_only = not node.domain and OPS[node.op].shape_only and ins[0] not in varying
            is_static = shape_only or all(i in static for i in ins)
            if is_static and node.domain != XRT_DOMAIN:
                check_output_size(node, args, graph.opset, self.max_tensor_bytes)
                try:
                    results = self._call_numpy(node, args)
                except Exception as exc:
                    raise NodeExecutionError(_failure(Step(node, "numpy", ins, outs), values, exc)) from exc
                for s, r in zip(outs, results):
                    values[s] = r
                    static.add(s)
                folded += 1
                continue
            varies = _varies(node, ins, static, varying)
            if varies:
                varying.update(outs)
            check_output_size(node, args, graph.opset, self.max_tensor_bytes)
            try:
                ins = self._device_inputs(node, ins, values, static, slot)
                if varies:  # a kernel's plan, buffer and lowered attributes hold for one shape only
                    step = _checked(self._op_map_step(node, ins, outs, "input shapes depend on input values"),
                                    graph.opset, self.max_tensor_bytes)  # fmt: skip
                else:
                    step = self._make_step(node, ins, outs, [values[i] for i in ins], values)
                step = self._first_run(step, values, ins)
            except (UnsupportedByPolicyError, OutputTooLargeError):
                raise  # a strict policy's refusal, or a size refused before allocating: the answer as it is
            except Exception as exc:
                raise NodeExecutionError(_failure(Step(node, "numpy", ins, outs), values, exc)) from exc
            steps.append(step)
        output_slots = [slots[v.name] if v.name in slots else slot(v.name) for v in graph.outputs]
        template: list[Any] = [values[i] if i in static else None for i in range(len(values))]
        plan = ExecutionPlan(slots, template, steps, input_slots, output_slots, folded)
        plan.varying = sum(1 for step in steps if any(i in varying for i in step.outputs))
        plan.static_outputs = {s for s in output_slots if s in static}
        if self.reuse_memory:
            plan.plain_template = list(template)
            plan.reused_buffers = _assign_buffers(plan, values, set(output_slots) | set(input_slots))
            plan.plain_template += [None] * (len(plan.template) - len(plan.plain_template))
        for step in steps:
            step.last_out = None  # only buffer assignment needed it: the plan must not keep a result alive
        plan.nbytes = _held_bytes(plan.template, graph.initializers)  # the arena is counted by its owner
        if self.reuse_memory:
            plan.arena = self.arena or Arena()
            plan.arena.fit(plan.arena_bytes)
            with plan.arena.lock:
                _attach(plan)
        return plan, _results(values, output_slots, plan.static_outputs, feeds.values())

    # -- steps -------------------------------------------------------------------------------
    def _call_numpy(self, node: Node, args: list) -> tuple:
        fn = self.static_fns.get(id(node))
        if fn is None:
            fn = self.static_fns[id(node)] = OPS[node.op].numpy(node, self.graph.opset)
        result = fn(*args)
        return _as_outputs(node, result)

    def _first_run(self, step: Step, values: list, ins: tuple) -> Step:
        """Run a new step once; a kernel that fails on its first launch is replaced by the op map's
        function (or the xrt op's fallback), with the failure kept in the step's note for explain()."""
        try:
            step.run(values)
            if step.kind == "kernel":
                step.last_out = _written(step, values[step.outputs[0]])
            return step
        except Exception as exc:
            if step.kind != "kernel":
                raise
            note = f"kernel {step.plan.kernel.qualified_name} failed: {type(exc).__name__}: {str(exc)[:160]}"
        node = step.node
        if node.domain == XRT_DOMAIN:
            replacement = self._fallback_step(node, ins, step.outputs, note)
        else:
            replacement = self._op_map_step(node, ins, step.outputs, note)
        replacement.run(values)
        return replacement

    def _device_inputs(self, node: Node, ins: tuple, values: list, static: set, slot: Callable) -> tuple:
        """Hook: the slots a step reads (the GPU planner moves constants to the device here)."""
        return ins

    def _fallback_step(self, node: Node, ins: tuple, outs: tuple, note: str) -> Step:
        """Hook: an xrt node no kernel can run."""
        return _reference_step(node, ins, outs, self.dispatcher, note)

    def _make_step(self, node: Node, ins: tuple, outs: tuple, args: list, values: list) -> Step:
        note = ""
        lowered = None
        try:
            lowered = lower(node, args, self.graph.opset)
        except Exception as exc:  # a lowering that cannot read its arguments means "use the op map"
            note = f"no xrt lowering: {type(exc).__name__}: {exc}"
        if lowered is not None:
            op, positions, attrs = lowered
            op_args = [None if p is None else args[p] for p in positions]
            schema = self.dispatcher.registry.op(op)
            extra = buffer_positions(node, schema.inputs, schema.buffers)
            if extra:
                op_args += [None] * (len(schema.inputs) - len(op_args))
                for position in extra:
                    op_args[position] = empty_like(op_args[0])
            flat, nhwc = flattens(node, op_args), in_channels_last(node, op_args)
            if flat:
                op_args[0] = op_args[0].reshape(-1, op_args[0].shape[-1])
            if nhwc:
                op_args = [None if a is None else to_nhwc(a) for a in op_args]
            try:
                plan = self.dispatcher.plan(op, *op_args, **attrs)
                kernel_ins = [0 if p is None else ins[p] for p in positions]
                buffers = tuple(zip(extra, outs[1:]))
                readers = self._readers.get(node.outputs[0], [])
                stored = stored_order(node, readers, self.graph.output_names()) if self.transposed_outputs else None
                return _kernel_step(node, kernel_ins, outs, plan, len(schema.inputs), self.dispatcher, flat, nhwc,
                                    buffers, stored)  # fmt: skip
            except UnsupportedByPolicyError:
                raise  # strict: the policy's kernel or an error, never a quiet fallback to the op map
            except XpuRuntimeError as exc:
                if node.domain == XRT_DOMAIN:
                    return self._fallback_step(node, ins, outs, f"no kernel: {exc}")
                note = f"{op} cannot run it: {type(exc).__name__}: {str(exc)[:200]}"
        return self._op_map_step(node, ins, outs, note)

    def _op_map_step(self, node: Node, ins: tuple, outs: tuple, note: str) -> Step:
        """The node as a function of the op map (an xrt node: the op's fallback), right for any shapes."""
        if node.domain == XRT_DOMAIN:
            return self._fallback_step(node, ins, outs, note or "no lowering")
        fn = self.fns.get(id(node))
        if fn is None:
            fn = self.fns[id(node)] = self.function(node)
        step = _numpy_step(node, ins, outs, fn, note, self.wrap)
        step.kind = self.step_kind
        return step


def check_output_size(node: Node, args: list, opset: int, limit: int) -> None:
    """Refuse, before anything is allocated, a node whose largest output (estimated by its op record from the
    input shapes and host values) would take more than `limit` bytes (0: no limit)."""
    if not limit:
        return
    size = XRT_SIZES.get(node.op) if node.domain == XRT_DOMAIN else None if node.domain else OPS[node.op].size
    if size is None:
        return
    try:
        shape, itemsize = size(node, args, opset)
    except Exception:  # inputs the op itself refuses: its own error names what is wrong
        return
    nbytes = math.prod(int(d) for d in shape) * itemsize
    if nbytes > limit:
        raise OutputTooLargeError(
            f"{node.describe()}: its output of shape {tuple(int(d) for d in shape)} would take {_gib(nbytes)} "
            f"({nbytes} bytes), more than the {_gib(limit)} a tensor may take (SessionOptions.max_tensor_bytes)"
        )


XRT_SIZES = {"fused_elementwise": broadcast_size}  # xrt ops (made by the passes) whose outputs can outgrow inputs


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.3g} GiB"


def _checked(step: Step, opset: int, limit: int) -> Step:
    """A step whose input shapes change from run to run checks its output size on every run."""
    if not limit or (step.node.domain and step.node.op not in XRT_SIZES):
        return step
    if not step.node.domain and OPS[step.node.op].size is None:
        return step
    inner, node, ins = step.run, step.node, step.inputs

    def run(env: list) -> None:
        check_output_size(node, [env[i] for i in ins], opset, limit)
        inner(env)

    step.run = run
    return step


def _written(step: Step, value: Any) -> Any:
    """The array a kernel step wrote: its output, or for a flattened MatMul the (M, N) array it views."""
    if step.flat and isinstance(value, np.ndarray):
        return value.reshape(-1, value.shape[-1])
    return value


def _varies(node: Node, ins: tuple, static: set[int], varying: set[int]) -> bool:
    """Whether the node's output shapes can change between runs of one signature: an input's shape can, or
    a shape-setting input (a Reshape's target, a Slice's bounds, a Reduce's axes) is not a constant."""
    if any(i in varying for i in ins):
        return True
    positions = OPS[node.op].shape_inputs if not node.domain else ()
    return any(p < len(ins) and ins[p] not in static for p in positions)


def _as_outputs(node: Node, result: Any) -> tuple:
    results = tuple(result) if isinstance(result, tuple | list) else (result,)
    return tuple(r if isinstance(r, np.ndarray) else np.asarray(r) for r in results)[: len(node.outputs)]


def _numpy_step(node: Node, ins: tuple, outs: tuple, fn: Callable, note: str, wrap: Callable) -> Step:
    step = Step(node, "numpy", ins, outs, fn=fn, note=note)
    if len(outs) == 1 and not OPS[node.op].tuple_output:
        (o,) = outs

        if len(ins) == 1:
            (a,) = ins

            def run(env: list) -> None:
                env[o] = wrap(fn(env[a]))

        elif len(ins) == 2:
            a, b = ins

            def run(env: list) -> None:
                env[o] = wrap(fn(env[a], env[b]))

        else:

            def run(env: list) -> None:
                env[o] = wrap(fn(*[env[i] for i in ins]))

    else:

        def run(env: list) -> None:
            result = fn(*[env[i] for i in ins])
            for s, r in zip(outs, result if isinstance(result, tuple | list) else (result,)):
                env[s] = wrap(r)

    step.run = run
    return step


def _kernel_step(
    node: Node, ins: list[int], outs: tuple, plan: Any, arity: int, dispatcher: Dispatcher, flat: bool = False,
    nhwc: bool = False, buffers: tuple[tuple[int, int], ...] = (), stored: tuple[int, ...] | None = None,
) -> Step:  # fmt: skip
    """A launch of the planned kernel; with `flat`, a MatMul's (..., K) input is viewed as (M, K) and the
    (M, N) result as (..., N); with `nhwc`, the inputs as NHWC and the NHWC result as NCHW; `buffers` pairs the
    op's buffer inputs with the output slots they fill (new arrays each run); with `stored`, the output is a
    view of a new array in that order. A `returns_output` kernel (PyTorch's SDPA backends) without a reused
    buffer gives its own result, in its own layout, instead of a copy of it into a new array: the memory-
    efficient kernel's output is already stored (B, L, H, D), the order `stored` asks for."""
    returning = plan.returns_output and not (flat or nhwc)
    step = Step(node, "kernel", tuple(ins), outs, plan=plan, flat=flat, nhwc=nhwc, buffers=buffers,
                stored=None if returning else stored)  # fmt: skip
    padded = (*ins, *(0,) * (arity - len(ins)))  # slot 0 always holds None: optional inputs left out
    (o,) = outs[:1]
    launch, attrs, config = plan.launch, plan.attrs, plan.config
    allocate, finish, current_stream = plan.allocate, plan.finish, plan.current_stream
    if returning:
        allocate = lambda stream: None  # noqa: E731 (out=None: the kernel allocates and returns its output)
    elif stored is not None:
        allocate = _stored_allocator(plan, stored)
    workspace_bytes, lend = plan.workspace_bytes, dispatcher.workspaces.lend
    output = _output_taker(plan)

    def run(env: list) -> None:
        stream = None if current_stream is None else current_stream(plan.device)
        out = env[step.buffer_slot]
        if out is None:
            out = allocate(stream)
        workspace = None
        if workspace_bytes:
            workspace = lend(workspace_bytes, plan.device, plan.empty, stream)
        inputs = [env[i] for i in padded]
        for position, slot in buffers:
            inputs[position] = env[slot] = empty_like(inputs[0])
        if flat:
            a = inputs[0]
            inputs[0] = a.reshape(-1, a.shape[-1])
            launch(ArgPack(tuple(inputs), out, attrs, config, workspace, stream))
            env[o] = out.reshape(*a.shape[:-1], out.shape[-1])
        elif nhwc:
            launch(ArgPack(tuple(None if x is None else to_nhwc(x) for x in inputs), out, attrs, config, workspace,
                           stream))  # fmt: skip
            env[o] = from_nhwc(out)
        else:
            returned = launch(ArgPack(tuple(inputs), out, attrs, config, workspace, stream))
            env[o] = out if out is not None else output(returned)
        if finish is not None:
            finish(stream)

    step.run = run
    return step


def _output_taker(plan: Any) -> Callable[[Any], Any]:
    """returned -> the output, for a returns_output kernel launched with out=None: checked against the op's
    schema on the first launch (dispatch.checked_output), taken as it is after."""
    checked = False

    def take(returned: Any) -> Any:
        nonlocal checked
        if checked:
            return returned
        result = checked_output(plan, returned)
        checked = True
        return result

    return take


def _stored_allocator(plan: Any, order: tuple[int, ...]) -> Callable[[Any], Any]:
    """(stream) -> the kernel's output as a view of a new array whose dims are stored in `order`."""
    shape, dtype, device = plan.allocate.args
    stored = tuple(shape[i] for i in order)
    back = tuple(order.index(i) for i in range(len(order)))

    def allocate(stream: Any) -> Any:
        return plan.empty(stored, dtype, device, stream).permute(*back)

    return allocate


def _reference_step(node: Node, ins: tuple, outs: tuple, dispatcher: Dispatcher, note: str) -> Step:
    """An xrt node no kernel can run: the op's float64 reference, rounded to the input's dtype."""
    schema = dispatcher.registry.op(node.op)
    attrs = dict(node.attrs)
    (o,) = outs[:1]
    buffers = tuple(zip(buffer_positions(node, schema.inputs, schema.buffers), outs[1:]))

    def run(env: list) -> None:
        args = [env[i] for i in ins]
        first = next(a for a in args if a is not None)
        dtype = attrs.get("dtype", first.dtype)
        if buffers:  # the reference writes them (add_layer_norm's h)
            args += [None] * (len(schema.inputs) - len(args))
            for position, slot in buffers:
                args[position] = env[slot] = empty_like(np.asarray(first))
        env[o] = np.asarray(schema.reference(*args, **attrs)).astype(dtype)

    step = Step(node, "numpy", ins, outs, note=f"float64 reference; {note}"[:300])
    step.run = run
    return step


def _held_bytes(template: list, initializers: dict[str, Any]) -> int:
    """Bytes of host memory a plan's template keeps alive besides the graph's initializers: values folded for
    the signature and reused buffers (a view counts as the array it views, once)."""
    shared = {id(a) for a in initializers.values()}
    counted: set[int] = set()
    total = 0
    for value in template:
        while isinstance(value, np.ndarray) and value.base is not None:
            value = value.base
        if isinstance(value, np.ndarray) and id(value) not in shared and id(value) not in counted:
            counted.add(id(value))
            total += value.nbytes
    return total


def _assign_buffers(plan: ExecutionPlan, values: list, pinned: set[int]) -> int:
    """Share output buffers between kernel steps whose values (and every view of them) are dead; each buffer
    gets a region of the plan's arena layout (`plan.layout`, `plan.arena_bytes`), as does the workspace.

    Views are found by memory overlap on the planning run: a NumPy step's output that overlaps a kernel
    output keeps that buffer alive. Buffers feeding graph outputs are never shared."""
    steps = plan.steps
    last_use: dict[int, int] = {}
    for index, step in enumerate(steps):
        for i in step.inputs:
            last_use[i] = index
    kernel_outs = {step.outputs[0]: (index, step) for index, step in enumerate(steps) if step.kind == "kernel"}
    produced_by_numpy = [s for step in steps if step.kind != "kernel" for s in step.outputs]
    end: dict[int, float] = {}
    for slot, (index, step) in kernel_outs.items():
        array = step.last_out  # what the kernel wrote (a MatMul's flattened result, say)
        if not isinstance(array, np.ndarray) or slot in pinned:
            continue
        aliases = [
            s for s in produced_by_numpy if isinstance(values[s], np.ndarray) and np.may_share_memory(values[s], array)
        ]
        if any(s in pinned for s in aliases):
            continue
        end[slot] = max([last_use.get(slot, index), *(last_use.get(s, float("inf")) for s in aliases)])
    free: dict[tuple, list[int]] = {}  # (shape, dtype) -> offsets of dead buffers
    releasing: list[tuple[float, int, tuple, int]] = []
    reused = 0
    for index, step in enumerate(steps):
        still = []
        for item in releasing:
            if item[0] < index:
                free.setdefault(item[2], []).append(item[3])
            else:
                still.append(item)
        releasing = still
        slot = step.outputs[0] if step.kind == "kernel" else None
        if slot not in end:
            continue
        key = (step.last_out.shape, step.last_out.dtype)
        pool = free.get(key)
        if pool:
            offset = pool.pop()
            reused += 1
        else:
            offset = plan.arena_bytes
            plan.arena_bytes += -(-step.last_out.nbytes // ALIGN) * ALIGN
        step.buffer_slot = len(plan.template)
        plan.template.append(None)  # a view of the arena, set by _attach
        plan.layout.append((step.buffer_slot, offset, *key))
        releasing.append((end[slot], slot, key, offset))
    sizes = [s.plan.workspace_bytes for s in steps if s.kind == "kernel"]
    plan.workspace = (plan.arena_bytes, max(sizes, default=0))
    plan.arena_bytes += plan.workspace[1]
    return reused


def _attach(plan: ExecutionPlan) -> None:
    """Point the plan's reused buffers (and workspace) at the arena's block of now, and rebind."""
    generation, memory = plan.arena.block
    for slot, offset, shape, dtype in plan.layout:
        size = math.prod(shape) * dtype.itemsize
        plan.template[slot] = memory[offset : offset + size].view(dtype).reshape(shape)
    offset, size = plan.workspace
    _bind(plan, memory[offset : offset + size])
    plan.generation = generation


def _bind(plan: ExecutionPlan, workspace: np.ndarray) -> None:
    """Make the shared-buffer run's bound template and steps. A value is fixed (set in the bound template)
    when it is the same array in every such run: a constant, a kernel step's reused buffer, a view of one.
    Views of fixed values are taken once, here, and kernel steps reading and writing only fixed arrays get
    a prebuilt launch."""
    template = list(plan.template)
    constants = {i for i, v in enumerate(plan.plain_template) if v is not None}
    steps = []
    for step in plan.steps:
        if step.kind == "kernel":
            steps.append(_bind_kernel(step, template, workspace))
        elif not _take_fixed_view(step, template, constants):
            steps.append(step)
    plan.bound_template, plan.bound_steps = template, steps


def _bind_kernel(step: Step, template: list, workspace: np.ndarray) -> Step:
    """A kernel step with a reused buffer has a fixed output; if its inputs are fixed too (and it needs no
    stream or sync), a copy of the step that launches one ArgPack built now."""
    plan = step.plan
    if not step.buffer_slot or step.buffers:  # further outputs are new arrays each run
        return step
    out = template[step.buffer_slot]
    padded = (*step.inputs, *(0,) * (len(plan.schema.inputs) - len(step.inputs)))
    inputs = [template[i] for i in padded]
    if step.flat:
        a = inputs[0]
        if a is None:  # not fixed: the output's shape is known only at run time
            return step
        inputs[0] = np.reshape(a, (-1, a.shape[-1]), copy=False)  # a fixed array keeps the planned layout
        template[step.outputs[0]] = out.reshape(*a.shape[:-1], out.shape[-1])
    else:
        template[step.outputs[0]] = out
    if any(i and template[i] is None for i in padded) or plan.current_stream is not None or plan.finish is not None:
        return step
    scratch = workspace[: plan.workspace_bytes] if plan.workspace_bytes else None
    pack = ArgPack(tuple(inputs), out, plan.attrs, plan.config, scratch)
    launch = plan.launch
    return dataclasses.replace(step, run=lambda env: launch(pack))


def _take_fixed_view(step: Step, template: list, constants: set[int]) -> bool:
    """Run once, now, a NumPy step that only takes views of a fixed array (a Reshape or Transpose of a
    reused buffer, a Split of one): True, with its outputs stored in the template as fixed values. Only ops
    whose record says they may return views are tried: any other step would be computed once more for
    nothing (BERT's Gemms at every new input signature: 70 of 234 ms of planning)."""
    record = OPS.get(step.node.op)
    if step.fn is None or not step.inputs or template[step.inputs[0]] is None or record is None or not record.views:
        return False
    if any(i not in constants for i in step.inputs[1:]):  # e.g. a Reshape's target shape
        return False
    x = template[step.inputs[0]]
    result = step.fn(*[template[i] for i in step.inputs])
    results = tuple(result) if isinstance(result, tuple | list) else (result,)
    if len(results) < len(step.outputs):
        return False
    if not all(isinstance(r, np.ndarray) and np.may_share_memory(r, x) for r in results[: len(step.outputs)]):
        return False  # a copy: its contents would be this moment's
    for slot, r in zip(step.outputs, results):
        template[slot] = r
    return True


def run_graph(graph: Graph, feeds: dict[str, np.ndarray], dispatcher: Dispatcher | None = None) -> list[Any]:
    """Run a graph once (planning included): for tests and tools that hold a Graph, not a model."""
    from ..dispatch import default_dispatcher

    return Planner(graph, dispatcher or default_dispatcher(), {}).build(feeds)[1]
