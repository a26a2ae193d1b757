"""Graph IR: values (name, dtype, shape with symbolic dims), nodes, initializers; printable and verifiable.

A `Graph` is a list of nodes in topological order. Values are referenced by name; an empty input name
means "optional input left out" (as in ONNX). `verify()` raises a `GraphError` naming the node that
breaks the graph (a dangling input, a value produced twice, a cycle, an unknown graph output).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import XpuRuntimeError

Dim = int | str | None  # a fixed size, a symbolic name, or unknown


class GraphError(XpuRuntimeError, ValueError):
    """The graph is malformed: the message names the node and the value that are wrong."""


@dataclass
class Value:
    """A value's type: dtype name (NumPy's, e.g. 'float32') and shape; None where unknown."""

    name: str
    dtype: str | None = None
    shape: tuple[Dim, ...] | None = None

    def static_shape(self) -> tuple[int, ...] | None:
        """The shape if every dim is a fixed int, else None."""
        if self.shape is None or not all(isinstance(d, int) for d in self.shape):
            return None
        return self.shape  # type: ignore[return-value]

    def __str__(self) -> str:
        dims = "?" if self.shape is None else "x".join("?" if d is None else str(d) for d in self.shape) or "scalar"
        return f"{self.name}: {self.dtype or '?'}[{dims}]"


@dataclass
class Node:
    """One operation: op type (ONNX name, or an xpuruntime op in domain 'xrt'), inputs, outputs, attributes."""

    op: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    name: str = ""
    domain: str = ""

    def __str__(self) -> str:
        attrs = ", ".join(f"{k}={_short(v)}" for k, v in sorted(self.attrs.items()))
        op = f"{self.domain}.{self.op}" if self.domain else self.op
        label = f" [{self.name}]" if self.name else ""
        args = ", ".join(i or "<none>" for i in self.inputs) + ("; " + attrs if attrs else "")
        return f"{', '.join(self.outputs)} = {op}({args}){label}"

    def describe(self) -> str:
        label = self.name or (self.outputs[0] if self.outputs else "?")
        return f"node '{label}' ({self.op})"

    def subgraphs(self) -> list[Graph]:
        """The graphs among the node's attributes (the bodies of If, Loop, Scan)."""
        return [v for v in self.attrs.values() if isinstance(v, Graph)]

    def implicit_inputs(self) -> list[str]:
        """The names its subgraphs read from the graphs around them, in order: the node's last inputs
        (onnxruntime's implicit inputs), bound to the subgraphs by position, so passes may rename them."""
        names: list[str] = []
        for graph in self.subgraphs():
            names += [n for n in graph.outer if n not in names]
        return names


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(repr=False)
class Graph:
    """Nodes in topological order plus the graph's inputs, outputs, initializers and value types.

    A subgraph (the attribute of a control-flow node) also reads values of the graphs around it: `outer`
    names them, in the order its node takes them as its last inputs (see Node.implicit_inputs)."""

    nodes: list[Node]
    inputs: list[Value]
    outputs: list[Value]
    initializers: dict[str, np.ndarray] = field(default_factory=dict)
    values: dict[str, Value] = field(default_factory=dict)  # known types of intermediate values
    opset: int = 17
    name: str = "graph"
    outer: tuple[str, ...] = ()
    _counter: itertools.count = field(default_factory=itertools.count)

    def __repr__(self) -> str:
        return f"<Graph {self.name}: {len(self.nodes)} nodes>"

    # -- queries -----------------------------------------------------------------------------
    def value(self, name: str) -> Value:
        """The known type of `name` (a new, unknown Value if nothing is known)."""
        known = self.values.get(name)
        if known is not None:
            return known
        for v in (*self.inputs, *self.outputs):
            if v.name == name:
                return v
        if name in self.initializers:
            array = self.initializers[name]
            return Value(name, array.dtype.name, array.shape)
        return Value(name)

    def set_value(self, value: Value) -> None:
        self.values[value.name] = value

    def producers(self) -> dict[str, Node]:
        return {out: node for node in self.nodes for out in node.outputs if out}

    def consumers(self) -> dict[str, list[Node]]:
        result: dict[str, list[Node]] = {}
        for node in self.nodes:
            for name in node.inputs:
                if name:
                    result.setdefault(name, []).append(node)
        return result

    def output_names(self) -> set[str]:
        return {v.name for v in self.outputs}

    def constant(self, name: str) -> np.ndarray | None:
        """The initializer's array, or None if `name` is not a constant."""
        return self.initializers.get(name)

    def fresh_name(self, hint: str, taken: set[str] | None = None) -> str:
        """A value or node name not used anywhere in the graph yet. A pass that makes many names passes the set
        of `taken_names()` it got once (the new name is added to it), so that each name costs O(1)."""
        taken = self.taken_names() if taken is None else taken
        while True:
            candidate = f"{hint}__{next(self._counter)}"
            if candidate not in taken:
                taken.add(candidate)
                return candidate

    def taken_names(self) -> set[str]:
        """Every value and node name in the graph, now."""
        return self._names()

    def _names(self) -> set[str]:
        names = set(self.initializers) | {v.name for v in (*self.inputs, *self.outputs)}
        for node in self.nodes:
            names.update(node.outputs)
            names.add(node.name)
        return names

    def add_constant(self, hint: str, array: np.ndarray) -> str:
        """A new initializer holding `array`, as a read-only view (constants are never written; the CPU GEMM
        packs only read-only weights, `onnx/ops/linalg`)."""
        name = self.fresh_name(hint)
        view = np.asarray(array).view()
        view.flags.writeable = False
        self.initializers[name] = view
        return name

    # -- checks ------------------------------------------------------------------------------
    def verify(self) -> None:
        """Raise GraphError unless every input is defined before use, each value is produced once, the
        graph outputs exist, and the nodes have no cycle."""
        defined = set(self.initializers) | {v.name for v in self.inputs} | set(self.outer)
        producer: dict[str, Node] = {}
        for node in self.nodes:
            for out in node.outputs:
                if not out:
                    continue
                if out in producer or out in defined:
                    raise GraphError(f"{node.describe()}: output '{out}' is already defined elsewhere")
                producer[out] = node
        order = self.toposort(producer)
        for node in order:
            for name in node.inputs:
                if name and name not in defined and name not in producer:
                    raise GraphError(f"{node.describe()}: input '{name}' is not produced by any node (dangling)")
        for v in self.outputs:
            if v.name not in defined and v.name not in producer:
                raise GraphError(f"graph output '{v.name}' is not produced by any node")
        self.nodes = order

    def toposort(self, producer: dict[str, Node] | None = None) -> list[Node]:
        """Nodes in a valid execution order (stable); GraphError naming a node on a cycle."""
        producer = self.producers() if producer is None else producer
        index = {id(n): i for i, n in enumerate(self.nodes)}
        state: dict[int, int] = {}  # 1 = visiting, 2 = done
        order: list[Node] = []
        for root in self.nodes:
            if state.get(id(root)) == 2:
                continue
            stack: list[tuple[Node, Iterable[str]]] = [(root, iter(root.inputs))]
            state[id(root)] = 1
            while stack:
                node, pending = stack[-1]
                for name in pending:
                    dep = producer.get(name) if name else None
                    if dep is None or id(dep) not in index:
                        continue
                    mark = state.get(id(dep))
                    if mark == 1:
                        raise GraphError(f"{dep.describe()}: the graph has a cycle through value '{name}'")
                    if mark is None:
                        state[id(dep)] = 1
                        stack.append((dep, iter(dep.inputs)))
                        break
                else:
                    stack.pop()
                    state[id(node)] = 2
                    order.append(node)
        return order

    # -- printing ----------------------------------------------------------------------------
    def __str__(self) -> str:
        lines = [f"graph {self.name} (opset {self.opset}, {len(self.nodes)} nodes)"]
        lines += [f"  input  {v}" for v in self.inputs]
        lines += [f"  const  {Value(k, a.dtype.name, a.shape)}" for k, a in self.initializers.items() if a.size <= 1]
        big = sum(1 for a in self.initializers.values() if a.size > 1)
        if big:
            lines.append(f"  ({big} larger initializers)")
        lines += [f"  {node}" for node in self.nodes]
        lines += [f"  output {v}" for v in self.outputs]
        return "\n".join(lines)

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for node in self.nodes:
            counts[node.op] = counts.get(node.op, 0) + 1
        return counts

    def copy(self) -> Graph:
        """A copy whose node list, nodes and dicts can be changed without touching this graph."""
        nodes = [Node(n.op, list(n.inputs), list(n.outputs), dict(n.attrs), n.name, n.domain) for n in self.nodes]
        return Graph(
            nodes, list(self.inputs), list(self.outputs), dict(self.initializers), dict(self.values),
            self.opset, self.name, self.outer,
        )  # fmt: skip
