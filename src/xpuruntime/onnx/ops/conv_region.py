"""ConvRegion (graph/passes/conv_regions.py): consecutive Conv / FusedConv (Relu) / Relu / Add / MaxPool /
GlobalAveragePool nodes run on oneDNN's blocked layout through PyTorch's mkldnn tensors. The region's activation
inputs are reordered into that layout once, its outputs back into NCHW arrays once; each convolution's weights
are reordered once per weight array (kept while the same array comes back, run after run) for its padding,
strides, dilations and groups, as torch.utils.mkldnn's modules do. CPU only (the pass makes regions only there).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ...graph.ir import Node
from .record import F, Fn, op, torch

Step = Callable[[dict[str, Any], dict[str, np.ndarray]], None]


def conv_region(node: Node, opset: int) -> Fn:
    body = node.attrs["body"]
    constants = {n.inputs[i] for n in body.nodes if n.op in ("Conv", "FusedConv") for i in (1, 2)
                 if len(n.inputs) > i and n.inputs[i]}  # fmt: skip
    names, outputs = list(node.inputs), list(node.outputs)
    steps = [_step(n, _spare(body, outputs)) for n in body.nodes]

    def run(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
        env: dict[str, Any] = {}
        given: dict[str, np.ndarray] = {}
        with torch.no_grad():
            for name, array in zip(names, arrays):
                if name in constants:
                    given[name] = array
                else:
                    env[name] = torch.from_numpy(_writable(array)).to_mkldnn()
            for step in steps:
                step(env, given)
            return tuple(env[name].to_dense().numpy() for name in outputs)

    return run


def _writable(array: np.ndarray) -> np.ndarray:
    """A C-contiguous float32 array PyTorch may view (a copy of a read-only or strided one)."""
    if array.flags.writeable and array.flags.c_contiguous and array.dtype == np.float32:
        return array
    return np.array(array, np.float32)


def _spare(body: Any, outputs: list[str]) -> set[str]:
    """Values made inside the region that one node reads and the region does not return: that node may overwrite
    them (in-place Relu and Add save a fresh tensor each, whose first touch costs page faults: a tenth of
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
    if node.op == "Relu":
        relu = torch.relu_ if x in spare else torch.relu
        return lambda env, given: env.__setitem__(out, relu(env[x]))
    if node.op == "Add":
        a, b = node.inputs[:2]
        if a not in spare and b in spare:
            a, b = b, a
        add = _add_in_place if a in spare else _add
        return lambda env, given: env.__setitem__(out, add(env[a], env[b]))
    if node.op == "GlobalAveragePool":
        return lambda env, given: env.__setitem__(out, F.adaptive_avg_pool2d(env[x], 1))
    kernel = [int(k) for k in node.attrs["kernel_shape"]]
    strides = [int(s) for s in node.attrs.get("strides", (1, 1))]
    pads = [int(p) for p in node.attrs.get("pads", (0, 0, 0, 0))][:2]
    return lambda env, given: env.__setitem__(out, F.max_pool2d(env[x], kernel, strides, pads))  # MaxPool


def _add(a: Any, b: Any) -> Any:
    """a + b: oneDNN's sum for equal shapes (a residual connection), else ONNX's broadcast through NCHW."""
    if a.shape == b.shape:
        return torch.add(a, b)
    return torch.add(a.to_dense(), b.to_dense()).to_mkldnn()


def _add_in_place(a: Any, b: Any) -> Any:
    """a += b where the shapes are equal (a is spare), else `_add`."""
    return a.add_(b) if a.shape == b.shape else _add(a, b)


def _conv_step(node: Node) -> Step:
    x, w_name, out = node.inputs[0], node.inputs[1], node.outputs[0]
    b_name = node.inputs[2] if len(node.inputs) > 2 else ""
    strides = [int(s) for s in node.attrs.get("strides", (1, 1))]
    dilations = [int(d) for d in node.attrs.get("dilations", (1, 1))]
    pads = [int(p) for p in node.attrs.get("pads", (0, 0, 0, 0))][:2]
    group = int(node.attrs.get("group", 1))
    relu = node.attrs.get("activation") == "Relu"
    kept: list[Any] = [None, None, None, None]  # the weight and bias arrays, their oneDNN tensors

    def step(env: dict[str, Any], given: dict[str, np.ndarray]) -> None:
        w, b = given[w_name], given.get(b_name)
        if kept[0] is not w or kept[1] is not b:
            dense = torch.from_numpy(np.array(w, np.float32))  # a writable copy: initializers are read-only
            packed = torch._C._nn.mkldnn_reorder_conv2d_weight(dense.to_mkldnn(), pads, strides, dilations, group)
            bias = np.zeros(w.shape[0], np.float32) if b is None else np.array(b, np.float32)
            kept[:] = [w, b, packed, torch.from_numpy(bias).to_mkldnn()]
        y = torch.mkldnn_convolution(env[x], kept[2], kept[3], pads, strides, dilations, group)
        env[out] = torch.relu_(y) if relu else y

    return step


op("ConvRegion", conv_region, tuple_output=True)
