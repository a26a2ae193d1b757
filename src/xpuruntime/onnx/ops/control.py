"""Control flow: If, Loop and Scan, whose subgraphs (graph IR, imported with their node) run as `Body`s.

A body runs its nodes one after the other through their op records' functions (NumPy on the CPU path,
PyTorch on the GPU path), with the values it reads from the graphs around it: its node takes those as its
last inputs (Node.implicit_inputs) and hands them over by position. Bodies are built once per node; they
do not go through the selector (their nodes run as their records' functions).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ...errors import ArgumentError, ShapeError, XpuRuntimeError
from ...graph.ir import Graph, GraphError, Node
from ..errors import NodeExecutionError, UnsupportedModelError
from .arrays import NUMPY, TORCH
from .record import OPS, LoadContext, is_tensor, on_host, op, scalar, to_host


class Body:
    """One subgraph, ready to run: each node's function built once (NumPy or PyTorch, as `xp` says)."""

    def __init__(self, xp: Any, graph: Graph, opset: int) -> None:
        self.xp, self.graph = xp, graph
        self.inputs = [v.name for v in graph.inputs]
        self.outputs = [v.name for v in graph.outputs]
        self.steps = []
        for node in graph.nodes:
            if node.domain:
                raise UnsupportedModelError(f"{node.describe()}: domain '{node.domain}' inside a subgraph")
            record = OPS[node.op]
            build = record.numpy if xp is NUMPY else record.torch or on_host(record.numpy)  # as the GPU runner
            self.steps.append((node, build(node, opset), record.tuple_output))
        self._constants: dict[Any, dict[str, Any]] = {}  # per device: the subgraph's initializers

    def __call__(self, outer: dict[str, Any], inputs: Sequence[Any], like: Any) -> list[Any]:
        """The subgraph's outputs for its formal inputs and the outer values; `like` is an array of the kind
        (and device) results are made as."""
        if len(inputs) != len(self.inputs):
            raise ArgumentError(f"subgraph '{self.graph.name}' takes {len(self.inputs)} inputs, got {len(inputs)}")
        env = {**self._constants_for(like), **outer, **dict(zip(self.inputs, inputs))}
        for node, fn, tuple_output in self.steps:
            args = [env[name] if name else None for name in node.inputs]
            try:
                result = fn(*args)
            except XpuRuntimeError as exc:
                raise NodeExecutionError(f"{node.describe()} in subgraph '{self.graph.name}': {exc}") from exc
            except Exception as exc:
                raise NodeExecutionError(
                    f"{node.describe()} in subgraph '{self.graph.name}': {type(exc).__name__}: {exc}"
                ) from exc
            results = result if tuple_output else (result,)
            for name, value in zip(node.outputs, results):
                if name:
                    env[name] = self._same_kind(value, like)
        return [env[name] for name in self.outputs]

    def _constants_for(self, like: Any) -> dict[str, Any]:
        device = getattr(like, "device", None)
        found = self._constants.get(device)
        if found is None:
            found = {name: self.xp.from_host(array, like) for name, array in self.graph.initializers.items()}
            self._constants[device] = found
        return found

    def _same_kind(self, value: Any, like: Any) -> Any:
        """A result as the kind of array the body runs on (a host function's NumPy result moved to the device)."""
        if self.xp is NUMPY:
            return np.asarray(value)
        if isinstance(value, np.ndarray):
            return self.xp.from_host(value, like)
        device = like.device if is_tensor(like) else value.device
        return value if value.device == device else value.to(device)


def _outer(node: Node, captured: Sequence[Any]) -> dict[str, Any]:
    """The implicit inputs' values by the names the subgraphs read them under."""
    return dict(zip(node.implicit_inputs(), captured))


def _declared(node: Node, args: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """A control-flow node's arguments split into its declared inputs and its implicit ones."""
    count = len(node.inputs) - len(node.implicit_inputs())
    return list(args[:count]), list(args[count:])


def _like(args: Sequence[Any]) -> Any:
    """An argument whose kind (and device) the body's results take: a tensor, if any (host inputs are NumPy)."""
    return next((a for a in args if is_tensor(a)), next((a for a in args if a is not None), None))


def _stack(xp: Any, values: list[Any], graph: Graph, index: int, like: Any) -> Any:
    """Per-iteration values stacked on a new axis 0; with no iteration, an empty array of the output's
    declared dtype and shape (unknown dims as 0)."""
    if values:
        return xp.stack(values, 0)
    declared = graph.outputs[index]
    dims = [d if isinstance(d, int) else 0 for d in (declared.shape or ())]
    return xp.from_host(np.zeros((0, *dims), declared.dtype or np.float32), like)


class Bodies:
    """A control-flow node's subgraphs as Bodies, each built on first use (an If's other branch may never run)."""

    def __init__(self, xp: Any, node: Node, opset: int) -> None:
        self.xp, self.node, self.opset = xp, node, opset
        self._built: dict[str, Body] = {}

    def __getitem__(self, attr: str) -> Body:
        body = self._built.get(attr)
        if body is None:
            body = self._built[attr] = Body(self.xp, self.node.attrs[attr], self.opset)
        return body


def control_builders(make: Any) -> tuple[Any, Any]:
    """The NumPy and PyTorch builders of a control-flow op: make(xp, node, bodies) -> the step function."""
    return (
        lambda node, opset: make(NUMPY, node, Bodies(NUMPY, node, opset)),
        lambda node, opset: make(TORCH, node, Bodies(TORCH, node, opset)),
    )


# -- If ----------------------------------------------------------------------------------------------------------
def if_(xp: Any, node: Node, bodies: Bodies) -> Any:
    """The then_branch's outputs if cond is true, else the else_branch's."""

    def run(*args: Any) -> tuple:
        (cond,), captured = _declared(node, args)
        branch = bodies["then_branch" if bool(scalar(cond)) else "else_branch"]
        return tuple(branch(_outer(node, captured), [], _like(args)))

    return run


op("If", *control_builders(if_), shape_inputs=(0,), tuple_output=True)


# -- Loop --------------------------------------------------------------------------------------------------------
def check_loop(node: Node, ctx: LoadContext) -> None:
    """A Loop must be able to end (a trip count, or a condition), and its body take the iteration number, the
    condition and the loop-carried values, and give the condition, those values and its scan outputs."""
    declared = len(node.inputs) - len(node.implicit_inputs())
    if not (node.inputs[0] or node.inputs[1]):
        raise UnsupportedModelError(f"{node.describe()}: a Loop with neither M nor cond never ends")
    body = node.attrs["body"]
    carried = declared - 2
    if len(body.inputs) != declared or len(body.outputs) < 1 + carried:
        raise GraphError(f"{node.describe()}: the body takes {len(body.inputs)} inputs and gives "
                         f"{len(body.outputs)} outputs; with {carried} loop-carried values it must take "
                         f"{declared} and give at least {1 + carried}")  # fmt: skip
    if len(node.outputs) > len(body.outputs) - 1:
        raise GraphError(f"{node.describe()}: {len(node.outputs)} outputs, the body gives {len(body.outputs) - 1}")


def loop(xp: Any, node: Node, bodies: Bodies) -> Any:
    """Runs the body while the iteration number is below M (if given) and the condition holds: cond (if given)
    for the first step, the body's condition output for each next one (also without a cond input, as
    onnxruntime does; the spec's table says it is then ignored). Gives the last loop-carried values and each
    scan output stacked over the iterations."""

    def run(*args: Any) -> tuple:
        (trip, cond, *carried), captured = _declared(node, args)
        body, like, outer = bodies["body"], _like(args), _outer(node, captured)
        most = None if trip is None else int(scalar(trip))
        going = True if cond is None else bool(scalar(cond))
        scans: list[list[Any]] = [[] for _ in range(len(body.outputs) - 1 - len(carried))]
        step = 0
        while going and (most is None or step < most):
            index, flag = xp.from_host(np.array(step, np.int64), like), xp.from_host(np.array(going), like)
            outs = body(outer, [index, flag, *carried], like)
            going = bool(scalar(outs[0]))
            carried = outs[1 : 1 + len(carried)]
            for values, value in zip(scans, outs[1 + len(carried) :]):
                values.append(value)
            step += 1
        stacked = [_stack(xp, values, body.graph, 1 + len(carried) + k, like) for k, values in enumerate(scans)]
        return tuple([*carried, *stacked][: len(node.outputs)])

    return run


op("Loop", *control_builders(loop), shape_inputs=(0, 1), tuple_output=True, check=check_loop)


# -- Scan --------------------------------------------------------------------------------------------------------
def _scan_layout(node: Node, opset: int, states: int, scans: int, outputs: int) -> tuple[list, list, list, list]:
    """Scan's input axes and directions, output axes and directions (Scan-8: axis 1 after the batch, forward
    outputs)."""
    at = node.attrs
    if opset < 9:
        return [0] * scans, list(at.get("directions") or [0] * scans), [0] * outputs, [0] * outputs
    return (
        list(at.get("scan_input_axes") or [0] * scans),
        list(at.get("scan_input_directions") or [0] * scans),
        list(at.get("scan_output_axes") or [0] * outputs),
        list(at.get("scan_output_directions") or [0] * outputs),
    )


def check_scan(node: Node, ctx: LoadContext) -> None:
    declared = len(node.inputs) - len(node.implicit_inputs()) - (1 if ctx.graph.opset < 9 else 0)
    scans = node.attrs["num_scan_inputs"]
    body = node.attrs["body"]
    states = declared - scans
    if scans < 1 or states < 0 or len(body.inputs) != declared or len(body.outputs) < states:
        raise GraphError(f"{node.describe()}: num_scan_inputs {scans} with {declared} inputs does not fit a body "
                         f"of {len(body.inputs)} inputs and {len(body.outputs)} outputs")  # fmt: skip


def _scan_once(xp: Any, body: Body, outer: dict, states: list, xs: list, layout: tuple, like: Any) -> list:
    """One Scan over the scan inputs' axis: the final states, then each scan output stacked along its axis."""
    in_axes, in_dirs, out_axes, out_dirs = layout
    axes = [a % max(x.ndim, 1) for a, x in zip(in_axes, xs)]
    lengths = {int(x.shape[a]) for a, x in zip(axes, xs)}
    if len(lengths) != 1:
        raise ShapeError(f"Scan: the scan inputs' scanned axes differ in length: {sorted(lengths)}")
    (steps,) = lengths
    scans: list[list[Any]] = [[] for _ in range(len(body.outputs) - len(states))]
    for t in range(steps):
        slices = [xp.select(x, steps - 1 - t if d else t, a) for x, a, d in zip(xs, axes, in_dirs)]
        outs = body(outer, [*states, *slices], like)
        states = outs[: len(states)]
        for values, value in zip(scans, outs[len(states) :]):
            values.append(value)
    stacked = []
    for k, values in enumerate(scans):
        y = _stack(xp, values, body.graph, len(states) + k, like)
        if out_dirs[k]:
            y = xp.flip(y, 0)
        stacked.append(xp.moveaxis(y, 0, out_axes[k] % y.ndim) if out_axes[k] else y)
    return [*states, *stacked]


def scan(xp: Any, node: Node, bodies: Bodies, opset: int) -> Any:
    """Scan-9 and later: the body runs once per slice of the scan inputs, carrying its states; Scan-8: the
    same per batch entry (axis 0 of every input), for sequence_lens[b] steps, shorter runs padded with 0."""
    scans_in = node.attrs["num_scan_inputs"]

    def run(*args: Any) -> tuple:
        declared, captured = _declared(node, args)
        lengths = declared.pop(0) if opset < 9 else None
        body, like, outer = bodies["body"], _like(args), _outer(node, captured)
        states, xs = declared[: len(declared) - scans_in], declared[len(declared) - scans_in :]
        layout = _scan_layout(node, opset, len(states), scans_in, len(body.outputs) - len(states))
        if opset >= 9:
            return tuple(_scan_once(xp, body, outer, states, xs, layout, like)[: len(node.outputs)])
        return tuple(_scan_batches(xp, body, outer, states, xs, lengths, layout, like)[: len(node.outputs)])

    return run


def _scan_batches(xp: Any, body: Body, outer: dict, states: list, xs: list, lengths: Any, layout: tuple,
                  like: Any) -> list:  # fmt: skip
    """Scan-8: each batch entry scanned on its own (its scan inputs' axis 0, after the batch, cut to its
    sequence length); the scan outputs padded with zeros to the longest."""
    batch = int(xs[0].shape[0])
    steps = int(xs[0].shape[1])
    cut = [steps] * batch if lengths is None else [int(v) for v in np.asarray(to_host(lengths)).reshape(-1)]
    if len(cut) != batch or any(not 0 <= n <= steps for n in cut):
        raise ShapeError(f"Scan: sequence_lens {cut} must hold {batch} lengths in [0, {steps}]")
    per_batch = []
    for b in range(batch):
        sliced = [xp.select(x, b, 0) for x in xs]
        sliced = [s[: cut[b]] if cut[b] < steps else s for s in sliced]
        per_batch.append(_scan_once(xp, body, outer, [xp.select(s, b, 0) for s in states], sliced, layout, like))
    results = []
    for k in range(len(per_batch[0]) if per_batch else 0):
        values = [outs[k] for outs in per_batch]
        if k >= len(states):  # scan outputs: pad the time axis to the full length
            values = [_pad_steps(xp, v, steps, like) for v in values]
        results.append(xp.stack(values, 0))
    return results


def _pad_steps(xp: Any, value: Any, steps: int, like: Any) -> Any:
    if value.shape[0] == steps:
        return value
    padding = xp.cast(xp.from_host(np.zeros((steps - value.shape[0], *value.shape[1:])), like), value.dtype)
    return xp.concat([value, padding], 0)


op("Scan", lambda node, opset: scan(NUMPY, node, Bodies(NUMPY, node, opset), opset),
   lambda node, opset: scan(TORCH, node, Bodies(TORCH, node, opset), opset), tuple_output=True,
   check=check_scan)  # fmt: skip
