"""ConvRegion (graph/passes/conv_regions.py): consecutive convolutions, activations, residual adds, squeeze-excite
products and pools run as PyTorch tensors in channels-last layout, the convolutions through oneDNN with weights
reordered once per input shape (`torch.ops.mkldnn._reorder_convolution_weight`, as inductor's CPU code does) and the
FusedConv's activation applied by oneDNN as a post-op; a residual Add (and the Relu after it) is summed into the
convolution that feeds it (`_residuals`). The region's inputs are made channels-last once on the way in and NCHW
once on the way out; PyTorch's elementwise ops keep the layout in between, writing in place into values that only
they read. CPU only (the pass makes regions only there).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np

from ...graph.ir import Node
from .conv import activate_in_place
from .record import F, Fn, op, torch

Step = Callable[[dict[str, Any], dict[str, np.ndarray]], None]

# FusedConv activations oneDNN applies as a post-op: ONNX name -> (oneDNN's name, its scalars from the params)
POST_OPS: dict[str, Callable[[list[float]], tuple[str, list[float]] | None]] = {
    "Relu": lambda p: ("relu", []),
    "Sigmoid": lambda p: ("sigmoid", []),
    "Tanh": lambda p: ("tanh", []),
    "HardSwish": lambda p: ("hardswish", []),
    "LeakyRelu": lambda p: ("leaky_relu", [p[0]]),
    "Clip": lambda p: ("hardtanh", [p[0], p[1]]),
    "HardSigmoid": lambda p: ("hardsigmoid", []) if abs(p[0] - 1 / 6) < 1e-6 and p[1] == 0.5 else None,
}
UNARY: dict[str, Callable[[Node], Callable[[Any], Any]]] = {  # op -> (node -> its function of one tensor)
    "Relu": lambda node: torch.relu,
    "Sigmoid": lambda node: torch.sigmoid,
    "Tanh": lambda node: torch.tanh,
    "HardSwish": lambda node: F.hardswish,
    "HardSigmoid": lambda node: _hard_sigmoid(float(node.attrs.get("alpha", 0.2)), float(node.attrs.get("beta", 0.5))),
    "GlobalAveragePool": lambda node: lambda x: x.mean((2, 3), keepdim=True),
}
BINARY = {"Add": "add", "Mul": "mul"}  # PyTorch's functions by name: torch is imported on first use
MAX_SHAPES = 8  # reordered weights kept per convolution (one per input shape, the oldest dropped past this)


def conv_region(node: Node, opset: int) -> Fn:
    body = node.attrs["body"]
    constants = {n.inputs[i] for n in body.nodes if n.op in ("Conv", "FusedConv") for i in (1, 2)
                 if len(n.inputs) > i and n.inputs[i]}  # fmt: skip
    names, outputs = list(node.inputs), list(node.outputs)
    spare = _spare(body, outputs)
    residuals = _residuals(body, spare)
    folded = {id(n) for conv, add, relu in residuals.values() for n in (conv, relu) if n is not None}
    steps = [_residual_step(*residuals[id(n)], spare) if id(n) in residuals else _step(n, spare)
             for n in body.nodes if id(n) not in folded]  # fmt: skip

    def run(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
        env: dict[str, Any] = {}
        given: dict[str, np.ndarray] = {}
        with torch.no_grad():
            for name, array in zip(names, arrays):
                if name in constants:
                    given[name] = array
                else:
                    env[name] = _channels_last(torch.from_numpy(_writable(array)))
            for step in steps:
                step(env, given)
            return tuple(env[name].contiguous().numpy() for name in outputs)

    return run


def _writable(array: np.ndarray) -> np.ndarray:
    """A float32 array PyTorch may view (a copy of a read-only or other-typed one)."""
    if array.flags.writeable and array.dtype == np.float32:
        return array
    return np.array(array, np.float32)


def _channels_last(t: Any) -> Any:
    return t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t


def _spare(body: Any, outputs: list[str]) -> set[str]:
    """Values made inside the region that one node reads and the region does not return: that node may overwrite
    them (an in-place Relu or Add saves a fresh tensor, whose first touch costs page faults: a tenth of
    ResNet-50's time at batch 8)."""
    reads: dict[str, int] = {}
    for n in body.nodes:
        for name in n.inputs:
            reads[name] = reads.get(name, 0) + 1
    made = {o for n in body.nodes for o in n.outputs}
    return {name for name, count in reads.items() if count == 1 and name in made and name not in outputs}


def _step(node: Node, spare: set[str]) -> Step:
    if node.op in ("Conv", "FusedConv"):
        return _conv_step(node)
    x, out = node.inputs[0], node.outputs[0]
    if node.op == "Relu" and x in spare:
        return lambda env, given: env.__setitem__(out, torch.relu_(env[x]))
    if node.op in UNARY:
        fn = UNARY[node.op](node)
        return lambda env, given: env.__setitem__(out, fn(env[x]))
    if node.op in BINARY:
        a, b = node.inputs[:2]
        if a not in spare and b in spare:
            a, b = b, a
        in_place, fn = a in spare, getattr(torch, BINARY[node.op])
        return lambda env, given: env.__setitem__(out, _binary(fn, env[a], env[b], in_place))
    kernel = [int(k) for k in node.attrs["kernel_shape"]]
    strides = [int(s) for s in node.attrs.get("strides", (1, 1))]
    pads = [int(p) for p in node.attrs.get("pads", (0, 0, 0, 0))][:2]
    return lambda env, given: env.__setitem__(out, F.max_pool2d(env[x], kernel, strides, pads))  # MaxPool


def _hard_sigmoid(alpha: float, beta: float) -> Callable[[Any], Any]:
    return lambda x: torch.clamp(x * alpha + beta, 0.0, 1.0)


def _binary(fn: Any, a: Any, b: Any, in_place: bool) -> Any:
    """fn(a, b) with ONNX's broadcasting; into `a` when it may be overwritten and already has the result's shape."""
    if in_place and _covers(a.shape, b.shape):
        return fn(a, b, out=a)
    return fn(a, b)


def _covers(big: tuple, small: tuple) -> bool:
    """Whether broadcasting `small` against `big` gives `big`'s shape (torch.broadcast_shapes costs 20 us)."""
    return len(small) <= len(big) and all(s in (1, b) for b, s in zip(big[len(big) - len(small) :], small))


class _Conv:
    """One convolution of a region: its geometry and its weights reordered per input shape."""

    def __init__(self, node: Node) -> None:
        self.x, self.w, self.out = node.inputs[0], node.inputs[1], node.outputs[0]
        self.b = node.inputs[2] if len(node.inputs) > 2 else ""
        self.strides = [int(s) for s in node.attrs.get("strides", (1, 1))]
        self.dilations = [int(d) for d in node.attrs.get("dilations", (1, 1))]
        self.pads = [int(p) for p in node.attrs.get("pads", (0, 0, 0, 0))][:2]
        self.group = int(node.attrs.get("group", 1))
        self.geometry = (self.pads, self.strides, self.dilations, self.group)
        self.kept: dict[tuple, Any] = {}  # (weight id, bias id, input shape) -> (arrays, reordered weight, bias)

    def operands(self, env: dict[str, Any], given: dict[str, np.ndarray]) -> tuple[Any, Any, Any]:
        """(channels-last input, reordered weight, bias tensor or None) for this run."""
        w, b, xt = given[self.w], given.get(self.b), _channels_last(env[self.x])
        key = (id(w), id(b), tuple(xt.shape))
        entry = self.kept.get(key)
        if entry is None or entry[0][0] is not w or entry[0][1] is not b:
            dense = torch.from_numpy(np.array(w, np.float32))  # a writable copy: initializers are read-only
            packed = torch.ops.mkldnn._reorder_convolution_weight(dense, *self.geometry, list(xt.shape))
            bias = None if b is None else torch.from_numpy(np.array(b, np.float32))
            if len(self.kept) >= MAX_SHAPES:
                with contextlib.suppress(RuntimeError, StopIteration, KeyError):  # another thread's run evicted too
                    del self.kept[next(iter(self.kept))]
            entry = self.kept[key] = ((w, b), packed, bias)
        return xt, entry[1], entry[2]

    def out_shape(self, xt: Any, w: np.ndarray) -> tuple[int, ...]:
        spatial = (
            (n + 2 * p - d * (k - 1) - 1) // s + 1
            for n, p, d, k, s in zip(xt.shape[2:], self.pads, self.dilations, w.shape[2:], self.strides)
        )
        return (xt.shape[0], w.shape[0], *spatial)


def _conv_step(node: Node) -> Step:
    conv = _Conv(node)
    activation = node.attrs.get("activation")
    params = [float(p) for p in node.attrs.get("activation_params", ())]
    post = POST_OPS[activation](params) if activation else ("none", [])
    after = activation if post is None else None  # HardSigmoid with other constants than PyTorch's: applied after
    attr, scalars = post or ("none", [])

    def step(env: dict[str, Any], given: dict[str, np.ndarray]) -> None:
        y = torch.ops.mkldnn._convolution_pointwise(*conv.operands(env, given), *conv.geometry, attr, scalars, "")
        env[conv.out] = activate_in_place(y, after, params)

    return step


def _residuals(body: Any, spare: set[str]) -> dict[int, tuple[Node, Node, Node | None]]:
    """Residual connections oneDNN sums into a convolution (a "sum" post-op, then Relu as its unary post-op):
    {id(Add): (Conv, Add, Relu or None)} for an Add one of whose inputs only it reads, made by a Conv with no
    activation of its own, and a Relu where only it reads the Add's output."""
    producer = {o: n for n in body.nodes for o in n.outputs}
    reader = {name: n for n in body.nodes for name in n.inputs if name in spare}
    found = {}
    for add in (n for n in body.nodes if n.op == "Add"):
        for mine in add.inputs[:2]:
            conv = producer.get(mine)
            if (
                mine in spare
                and conv is not None
                and conv.op in ("Conv", "FusedConv")
                and not conv.attrs.get("activation")
            ):
                relu = reader.get(add.outputs[0])
                found[id(add)] = (conv, add, relu if relu is not None and relu.op == "Relu" else None)
                break
    return found


def _residual_step(conv_node: Node, add: Node, relu: Node | None, spare: set[str]) -> Step:
    """conv(x) + other (+ Relu) in one oneDNN call, into `other` when it is spare; other shapes (a broadcast)
    take the separate operations."""
    conv = _Conv(conv_node)
    other = next(name for name in add.inputs[:2] if name != conv.out)
    out = add.outputs[0] if relu is None else relu.outputs[0]
    unary, in_place = ("relu" if relu is not None else None), other in spare

    def step(env: dict[str, Any], given: dict[str, np.ndarray]) -> None:
        xt, w, b = conv.operands(env, given)
        summand = env[other]
        if tuple(summand.shape) != conv.out_shape(xt, given[conv.w]):
            y = torch.ops.mkldnn._convolution_pointwise(xt, w, b, *conv.geometry, "none", [], "") + summand
            env[out] = y if relu is None else torch.relu_(y)
            return
        summand = _channels_last(summand)
        if in_place:  # into the summand (read only here)
            y = torch.ops.mkldnn._convolution_pointwise_.binary(summand, xt, w, b, *conv.geometry, "add", 1.0,
                                                                unary, [], None)  # fmt: skip
        else:
            y = torch.ops.mkldnn._convolution_pointwise.binary(xt, summand, w, b, *conv.geometry, "add", 1.0, unary,
                                                               [], None)  # fmt: skip
        env[out] = y

    return step


op("ConvRegion", conv_region, tuple_output=True)
