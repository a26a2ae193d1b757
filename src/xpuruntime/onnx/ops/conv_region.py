"""ConvRegion (graph/passes/conv_regions.py): consecutive convolutions, activations, residual adds, squeeze-excite
products and pools run as PyTorch tensors in channels-last layout, the convolutions through oneDNN with weights
reordered once per input shape (`torch.ops.mkldnn._reorder_convolution_weight`, as inductor's CPU code does) and the
FusedConv's activation applied by oneDNN as a post-op. The region's inputs are made channels-last once on the way
in and NCHW once on the way out; PyTorch's elementwise ops keep the layout in between. CPU only (the pass makes
regions only there).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np

from ...graph.ir import Node
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
UNARY: dict[str, Callable[[Any, Node], Any]] = {
    "Relu": lambda x, node: torch.relu(x),
    "Sigmoid": lambda x, node: torch.sigmoid(x),
    "Tanh": lambda x, node: torch.tanh(x),
    "HardSwish": lambda x, node: F.hardswish(x),
    "HardSigmoid": lambda x, node: torch.clamp(
        x * float(node.attrs.get("alpha", 0.2)) + float(node.attrs.get("beta", 0.5)), 0.0, 1.0
    ),
    "GlobalAveragePool": lambda x, node: x.mean((2, 3), keepdim=True),
}
BINARY = {"Add": "add", "Mul": "mul"}  # PyTorch's functions by name: torch is imported on first use
MAX_SHAPES = 8  # reordered weights kept per convolution (one per input shape, the oldest dropped past this)


def conv_region(node: Node, opset: int) -> Fn:
    body = node.attrs["body"]
    constants = {n.inputs[i] for n in body.nodes if n.op in ("Conv", "FusedConv") for i in (1, 2)
                 if len(n.inputs) > i and n.inputs[i]}  # fmt: skip
    names, outputs = list(node.inputs), list(node.outputs)
    spare = _spare(body, outputs)
    steps = [_step(n, spare) for n in body.nodes]

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
        fn = UNARY[node.op]
        return lambda env, given: env.__setitem__(out, fn(env[x], node))
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


def _binary(fn: Any, a: Any, b: Any, in_place: bool) -> Any:
    """fn(a, b) with ONNX's broadcasting; into `a` when it may be overwritten and already has the result's shape."""
    if in_place and _covers(a.shape, b.shape):
        return fn(a, b, out=a)
    return fn(a, b)


def _covers(big: tuple, small: tuple) -> bool:
    """Whether broadcasting `small` against `big` gives `big`'s shape (torch.broadcast_shapes costs 20 us)."""
    return len(small) <= len(big) and all(s in (1, b) for b, s in zip(big[len(big) - len(small) :], small))


def _conv_step(node: Node) -> Step:
    x, w_name, out = node.inputs[0], node.inputs[1], node.outputs[0]
    b_name = node.inputs[2] if len(node.inputs) > 2 else ""
    strides = [int(s) for s in node.attrs.get("strides", (1, 1))]
    dilations = [int(d) for d in node.attrs.get("dilations", (1, 1))]
    pads = [int(p) for p in node.attrs.get("pads", (0, 0, 0, 0))][:2]
    group = int(node.attrs.get("group", 1))
    activation = node.attrs.get("activation")
    params = [float(p) for p in node.attrs.get("activation_params", ())]
    post = POST_OPS[activation](params) if activation else ("none", [])
    after = None if post is not None else UNARY[activation]  # HardSigmoid with other constants than PyTorch's
    attr, scalars = post or ("none", [])
    kept: dict[tuple, Any] = {}  # (weight array id, bias array id, input shape) -> (arrays, reordered weight, bias)

    def step(env: dict[str, Any], given: dict[str, np.ndarray]) -> None:
        w, b, xt = given[w_name], given.get(b_name), _channels_last(env[x])
        key = (id(w), id(b), tuple(xt.shape))
        entry = kept.get(key)
        if entry is None or entry[0][0] is not w or entry[0][1] is not b:
            dense = torch.from_numpy(np.array(w, np.float32))  # a writable copy: initializers are read-only
            packed = torch.ops.mkldnn._reorder_convolution_weight(dense, pads, strides, dilations, group,
                                                                  list(xt.shape))  # fmt: skip
            bias = None if b is None else torch.from_numpy(np.array(b, np.float32))
            if len(kept) >= MAX_SHAPES:
                with contextlib.suppress(RuntimeError, StopIteration, KeyError):  # another thread's run evicted too
                    del kept[next(iter(kept))]
            entry = kept[key] = ((w, b), packed, bias)
        y = torch.ops.mkldnn._convolution_pointwise(xt, entry[1], entry[2], pads, strides, dilations, group, attr,
                                                    scalars, "")  # fmt: skip
        env[out] = y if after is None else after(y, _hard_sigmoid_node(params))

    return step


def _hard_sigmoid_node(params: list[float]) -> Node:
    return Node("HardSigmoid", [], [], {"alpha": params[0], "beta": params[1]})


op("ConvRegion", conv_region, tuple_output=True)
