"""ConvRegion (graph/passes/conv_regions.py): consecutive convolutions, activations, residual adds, squeeze-excite
products and pools run as PyTorch tensors in channels-last layout, the convolutions through oneDNN with weights
reordered once per input shape (`torch.ops.mkldnn._reorder_convolution_weight`, as inductor's CPU code does) and the
FusedConv's activation applied by oneDNN as a post-op; a residual Add (and the Relu after it) is summed into the
convolution that feeds it (`_residuals`). A 1x1 convolution of a 1x1 image (squeeze-excite's) is a matrix product
instead (`torch.addmm`, 9-45 us on one core where oneDNN takes 50-70 us: oneDNN's cost there is mostly building
the primitive's descriptor, which it does on every call). The region's inputs are made channels-last once on the way
in and NCHW once on the way out; PyTorch's elementwise ops keep the layout in between.

The region runs as a list of steps, one call into PyTorch each with its arguments bound, made once per input
signature (the inputs' shapes and the identity of the weight arrays): the first run at a signature decides from
the live tensors what each node takes (reordered weights, in-place or not, layout conversions, the matrix-product
form) and later runs at that signature only call the steps. Values live in a list of slots; the last reader of a
value made in the region may overwrite it and drops it after, so the allocator hands its memory, still in cache
and mapped, to the next output (MobileNetV3 at batch 8: 22k page faults a run -> 1k).
CPU only (the pass makes regions only there).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from ...graph.ir import Node
from .conv import activate_in_place
from .record import F, Fn, host_tensor, op, torch

Step = Callable[[list], None]  # one node (or a folded group) at one input signature: reads and writes slots
Maker = Callable[[list, dict[str, np.ndarray]], Step]  # the step, decided from the first run's live values

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
BINARY = {"Add": ("add", "add_"), "Mul": ("mul", "mul_")}  # PyTorch's functions: (out of place, in place)
MAX_SHAPES = 8  # input signatures whose steps (and reordered weights) a region keeps, the oldest dropped past this


def conv_region(node: Node, opset: int) -> Fn:
    body = node.attrs["body"]
    constants = {n.inputs[i] for n in body.nodes if n.op in ("Conv", "FusedConv") for i in (1, 2)
                 if len(n.inputs) > i and n.inputs[i]}  # fmt: skip
    names, outputs = list(node.inputs), list(node.outputs)
    slots = _slots(body, [name for name in names if name not in constants])
    fed = [(i, slots[name]) for i, name in enumerate(names) if name not in constants]
    weights = [(i, name) for i, name in enumerate(names) if name in constants]
    makers = _makers(body, outputs, slots)
    out_slots = [slots[name] for name in outputs]
    plans: dict[tuple, tuple[list[np.ndarray], list[Step]]] = {}  # signature -> (its weight arrays, its steps)

    def run(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
        values: list[Any] = [None] * len(slots)
        with torch.no_grad():
            for i, slot in fed:
                values[slot] = _channels_last(host_tensor(arrays[i]))  # float32: the pass's regions are
            key = (*(arrays[i].shape for i, _ in fed), *(id(arrays[i]) for i, _ in weights))
            plan = plans.get(key)
            if plan is None:  # held with the plan, the weight arrays keep their ids from being reused
                given = {name: arrays[i] for i, name in weights}
                plan = _remember(plans, key, (list(given.values()), _first_run(makers, values, given)))
            else:
                for step in plan[1]:
                    step(values)
            return tuple(values[slot].contiguous().numpy() for slot in out_slots)

    return run


def _slots(body: Any, names: list[str]) -> dict[str, int]:
    """Each value's index in a run's list of values: the region's inputs, then what its nodes make."""
    made = (o for n in body.nodes for o in n.outputs if o)
    return {name: i for i, name in enumerate(dict.fromkeys([*names, *made]))}


def _first_run(makers: list[Maker], values: list, given: dict[str, np.ndarray]) -> list[Step]:
    """Make each step from the values of this run, the first at its signature, and run it."""
    steps = []
    for make in makers:
        step = make(values, given)
        step(values)
        steps.append(step)
    return steps


def _remember(plans: dict, key: tuple, plan: Any) -> Any:
    if len(plans) >= MAX_SHAPES:
        with contextlib.suppress(RuntimeError, StopIteration, KeyError):  # another thread's run evicted too
            del plans[next(iter(plans))]
    plans[key] = plan
    return plan


def _channels_last(t: Any) -> Any:
    return t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t


def _is_channels_last(t: Any) -> bool:
    return t.dim() != 4 or t.is_contiguous(memory_format=torch.channels_last)


def _makers(body: Any, outputs: list[str], slots: dict[str, int]) -> list[Maker]:
    """The body's nodes as step makers, residual adds folded into their convolutions. A step may overwrite the
    values made in the region that it reads last (not the region's outputs), and drops them after it: the
    allocator then hands that memory to the next output while it is still in cache."""
    spare = _spare(body, outputs)
    residuals = _residuals(body, spare)
    folded = {id(n) for conv, add, relu in residuals.values() for n in (conv, relu) if n is not None}
    groups = [residuals.get(id(n), (n,)) for n in body.nodes if id(n) not in folded]
    last = {name: k for k, group in enumerate(groups) for n in group if n is not None for name in n.inputs}
    made = {o for n in body.nodes for o in n.outputs}
    makers = []
    for k, group in enumerate(groups):
        dead = {name for name, at in last.items() if at == k and name in slots and name not in outputs}
        free = dead & made  # never the region's inputs: they may be the caller's arrays
        make = _residual_maker(*group, free, slots) if len(group) == 3 else _maker(group[0], free, slots)
        makers.append(_dropping(make, tuple(slots[name] for name in dead)) if dead else make)
    return makers


def _dropping(make: Maker, drop: tuple[int, ...]) -> Maker:
    """The maker of a step that also drops the values it read last, so their memory is the next to be reused."""

    def maker(values: list, given: dict[str, np.ndarray]) -> Step:
        step = make(values, given)

        def dropping(values: list) -> None:
            step(values)
            for slot in drop:
                values[slot] = None

        return dropping

    return maker


def _spare(body: Any, outputs: list[str]) -> set[str]:
    """Values made inside the region that one node reads and the region does not return: a convolution's output
    only a residual Add reads can be summed inside the convolution (`_residuals`)."""
    reads: dict[str, int] = {}
    for n in body.nodes:
        for name in n.inputs:
            reads[name] = reads.get(name, 0) + 1
    made = {o for n in body.nodes for o in n.outputs}
    return {name for name, count in reads.items() if count == 1 and name in made and name not in outputs}


def _maker(node: Node, free: set[str], slots: dict[str, int]) -> Maker:
    """A node's step maker; `free`: the values it may overwrite."""
    if node.op in ("Conv", "FusedConv"):
        return _conv_maker(node, slots)
    x, out = slots[node.inputs[0]], slots[node.outputs[0]]
    if node.op == "Relu" and node.inputs[0] in free:
        return _fixed(lambda values: values.__setitem__(out, torch.relu_(values[x])))
    if node.op in UNARY:
        fn = UNARY[node.op](node)
        return _fixed(lambda values: values.__setitem__(out, fn(values[x])))
    if node.op in BINARY:
        return _binary_maker(node, free, slots)
    kernel = [int(k) for k in node.attrs["kernel_shape"]]
    strides = [int(s) for s in node.attrs.get("strides", (1, 1))]
    pads = [int(p) for p in node.attrs.get("pads", (0, 0, 0, 0))][:2]
    return _fixed(lambda values: values.__setitem__(out, F.max_pool2d(values[x], kernel, strides, pads)))  # MaxPool


def _fixed(step: Step) -> Maker:
    """The maker of a step that is the same at every signature."""
    return lambda values, given: step


def _hard_sigmoid(alpha: float, beta: float) -> Callable[[Any], Any]:
    return lambda x: torch.clamp(x * alpha + beta, 0.0, 1.0)


def _binary_maker(node: Node, free: set[str], slots: dict[str, int]) -> Maker:
    """Add or Mul with ONNX's broadcasting; into an input that may be overwritten and has the result's shape."""
    a, b = node.inputs[:2]
    if a not in free and b in free:
        a, b = b, a
    sa, sb, out = slots[a], slots[b], slots[node.outputs[0]]
    name, in_place_name = BINARY[node.op]

    def make(values: list, given: dict[str, np.ndarray]) -> Step:
        if a in free and _covers(values[sa].shape, values[sb].shape):
            fn = getattr(torch.Tensor, in_place_name)
        else:
            fn = getattr(torch, name)
        return lambda values: values.__setitem__(out, fn(values[sa], values[sb]))

    return make


def _covers(big: tuple, small: tuple) -> bool:
    """Whether broadcasting `small` against `big` gives `big`'s shape (torch.broadcast_shapes costs 20 us)."""
    return len(small) <= len(big) and all(s in (1, b) for b, s in zip(big[len(big) - len(small) :], small))


class _Conv:
    """One convolution of a region: its geometry, and its weights as oneDNN or a matrix product takes them."""

    def __init__(self, node: Node, slots: dict[str, int]) -> None:
        self.x, self.out = slots[node.inputs[0]], slots[node.outputs[0]]
        self.w, self.b = node.inputs[1], node.inputs[2] if len(node.inputs) > 2 else ""
        self.strides = [int(s) for s in node.attrs.get("strides", (1, 1))]
        self.dilations = [int(d) for d in node.attrs.get("dilations", (1, 1))]
        self.pads = [int(p) for p in node.attrs.get("pads", (0, 0, 0, 0))][:2]
        self.group = int(node.attrs.get("group", 1))
        self.geometry = (self.pads, self.strides, self.dilations, self.group)

    def packed(self, xt: Any, given: dict[str, np.ndarray]) -> tuple[Any, Any]:
        """(weight reordered by oneDNN for inputs of xt's shape, bias tensor or None)."""
        dense = torch.from_numpy(np.array(given[self.w], np.float32))  # a writable copy: initializers are read-only
        return torch.ops.mkldnn._reorder_convolution_weight(dense, *self.geometry, list(xt.shape)), self.bias(given)

    def bias(self, given: dict[str, np.ndarray]) -> Any:
        b = given.get(self.b)
        return None if b is None else torch.from_numpy(np.array(b, np.float32))

    def is_product(self, xt: Any, given: dict[str, np.ndarray]) -> bool:
        """Whether it is a matrix product: a 1x1 kernel over a 1x1 image, one group, no padding."""
        w = given[self.w]
        return w.shape[2:] == (1, 1) and xt.shape[2:] == (1, 1) and self.group == 1 and self.pads == [0, 0]

    def out_shape(self, xt: Any, given: dict[str, np.ndarray]) -> tuple[int, ...]:
        w = given[self.w]
        spatial = (
            (n + 2 * p - d * (k - 1) - 1) // s + 1
            for n, p, d, k, s in zip(xt.shape[2:], self.pads, self.dilations, w.shape[2:], self.strides)
        )
        return (xt.shape[0], w.shape[0], *spatial)


def _conv_maker(node: Node, slots: dict[str, int]) -> Maker:
    conv = _Conv(node, slots)
    activation = node.attrs.get("activation")
    params = [float(p) for p in node.attrs.get("activation_params", ())]
    post = POST_OPS[activation](params) if activation else ("none", [])
    after = activation if post is None else None  # HardSigmoid with other constants than PyTorch's: applied after
    attr, scalars = post or ("none", [])

    def make(values: list, given: dict[str, np.ndarray]) -> Step:
        converted = _to_channels_last(values, (conv.x,))
        if conv.is_product(values[conv.x], given):
            step = _product_step(conv, values[conv.x], given, activation, params)
        else:
            step = _onednn_step(conv, values[conv.x], given, (attr, scalars), after, params)
        return _converting(step, converted) if converted else step

    return make


def _onednn_step(conv: _Conv, xt: Any, given: dict, post: tuple, after: str | None, params: list[float]) -> Step:
    """The convolution through oneDNN, its weights reordered for inputs of xt's shape, its activation the post-op
    (or applied after it: `after`)."""
    (w, b), fn = conv.packed(xt, given), torch.ops.mkldnn._convolution_pointwise
    x, out, (pads, strides, dilations, group), (attr, scalars) = conv.x, conv.out, conv.geometry, post
    if after is None:

        def step(values: list) -> None:
            values[out] = fn(values[x], w, b, pads, strides, dilations, group, attr, scalars, "")

    else:

        def step(values: list) -> None:
            y = fn(values[x], w, b, pads, strides, dilations, group, "none", [], "")
            values[out] = activate_in_place(y, after, params)

    return step


def _to_channels_last(values: list, slots: tuple[int, ...]) -> tuple[int, ...]:
    """Make the 4-D values of `slots` channels-last; the slots that were not."""
    converted = tuple(slot for slot in slots if not _is_channels_last(values[slot]))
    for slot in converted:
        values[slot] = _channels_last(values[slot])
    return converted


def _converting(step: Step, slots: tuple[int, ...]) -> Step:
    """The step, after making the values of `slots` channels-last (at its signature they come in another layout)."""

    def converting(values: list) -> None:
        for slot in slots:
            values[slot] = _channels_last(values[slot])
        step(values)

    return converting


def _product_step(conv: _Conv, xt: Any, given: dict[str, np.ndarray], activation: str | None, params: list) -> Step:
    """A 1x1 convolution of a 1x1 image as x @ W^T + b (torch.addmm), then its activation in place."""
    w = np.asarray(given[conv.w], np.float32)
    wt = torch.from_numpy(np.ascontiguousarray(w.reshape(w.shape[0], -1).T))
    b, x, out = conv.bias(given), conv.x, conv.out
    rows, shape = (xt.shape[0], w.shape[1]), (xt.shape[0], w.shape[0], 1, 1)
    product = torch.mm if b is None else functools.partial(torch.addmm, b)
    act = _in_place(activation, params)
    return lambda values: values.__setitem__(out, act(product(values[x].reshape(rows), wt)).view(shape))


def _in_place(activation: str | None, params: list[float]) -> Callable[[Any], Any]:
    """A FusedConv's activation as one in-place PyTorch call where there is one."""
    if activation is None:
        return lambda y: y
    if activation == "Relu":
        return torch.relu_
    if POST_OPS[activation](params) == ("hardsigmoid", []):
        return functools.partial(F.hardsigmoid, inplace=True)
    return lambda y: activate_in_place(y, activation, params)


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


def _residual_maker(conv_node: Node, add: Node, relu: Node | None, free: set[str], slots: dict[str, int]) -> Maker:
    """conv(x) + other (+ Relu) in one oneDNN call, into `other` when it may be overwritten and the convolution
    does not read it; other shapes (a broadcast) take the separate operations."""
    conv = _Conv(conv_node, slots)
    name = next(name for name in add.inputs[:2] if name != conv_node.outputs[0])
    x, other, out = conv.x, slots[name], slots[(add if relu is None else relu).outputs[0]]
    unary, in_place, (pads, strides, dilations, group) = ("relu" if relu else None), name in free, conv.geometry
    in_place = in_place and name not in conv_node.inputs

    def make(values: list, given: dict[str, np.ndarray]) -> Step:
        converted = _to_channels_last(values, (x, other))
        w, b = conv.packed(values[x], given)
        if tuple(values[other].shape) != conv.out_shape(values[x], given):
            fn, post = torch.ops.mkldnn._convolution_pointwise, torch.relu_ if relu else (lambda y: y)

            def step(values: list) -> None:
                y = fn(values[x], w, b, pads, strides, dilations, group, "none", [], "") + values[other]
                values[out] = post(y)

        elif in_place:  # into the summand (read only here)
            summed = torch.ops.mkldnn._convolution_pointwise_.binary

            def step(values: list) -> None:
                values[out] = summed(values[other], values[x], w, b, pads, strides, dilations, group, "add", 1.0,
                                     unary, [], None)  # fmt: skip

        else:
            summed = torch.ops.mkldnn._convolution_pointwise.binary

            def step(values: list) -> None:
                values[out] = summed(values[x], values[other], w, b, pads, strides, dilations, group, "add", 1.0,
                                     unary, [], None)  # fmt: skip

        return _converting(step, converted) if converted else step

    return make


op("ConvRegion", conv_region, tuple_output=True)
