"""ConvRegion (graph/passes/conv_regions.py): consecutive convolutions, activations, residual adds, squeeze-excite
products and pools run as PyTorch tensors in channels-last layout, the convolutions through oneDNN with weights
reordered once per input shape (`torch.ops.mkldnn._reorder_convolution_weight`, as inductor's CPU code does) and the
FusedConv's activation applied by oneDNN as a post-op; a residual Add (and the Relu after it) is summed into the
convolution that feeds it (`_residuals`). A 1x1 convolution over at most PRODUCT_ROWS output pixels (squeeze-excite's
over the pooled 1x1 image; MobileNetV3's pointwise ones at batch 1 from 28x28 down, at batch 8 at 7x7) is a matrix
product of the channels-last pixels instead, (N*H*W, C) @ W^T (`torch.addmm`; a residual summed in by `addmm_`):
oneDNN builds the primitive's descriptor on every call, 30-45 us of host time on one core (a 64-channel 1x1
convolution of a 4x4 image: 48 us, addmm 18 us); over more pixels its fused bias and activation win (one pass over an
output that outgrows the cache: at batch 8, addmm and the activation after it took 2-9% longer at 14x14 and 8-87%
from 28x28 up). With the region run in inference mode (no autograd dispatch: about 2 us less a call), the zoo's
MobileNetV3 on one core went from 0.57-0.59x onnxruntime's speed to 0.62-0.64x at batch 1, 0.77-0.81x to
0.80-0.83x at batch 8 (runs interleaved with onnxruntime's and the old form's, 3 processes, a loaded 2-core host).
The region's inputs are made channels-last once on the way in and NCHW once on the way out; PyTorch's elementwise ops
keep the layout in between.

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
import math
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
PRODUCT_ROWS = 1024  # a 1x1 convolution over at most this many output pixels is a matrix product (module docstring)
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
        with torch.inference_mode():  # no autograd dispatch (under no_grad its boxed fallback ran for each mkldnn op)
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
        """Whether it runs as a matrix product: a 1x1 kernel, one group, no padding, stride 1 (or a 1x1 image), and
        at most PRODUCT_ROWS output pixels (module docstring)."""
        w, spatial = given[self.w], tuple(xt.shape[2:])
        if w.shape[2:] != (1, 1) or self.group != 1 or self.pads != [0, 0]:
            return False
        return spatial == (1, 1) or (self.strides == [1, 1] and xt.shape[0] * math.prod(spatial) <= PRODUCT_ROWS)

    def matrix(self, given: dict[str, np.ndarray]) -> Any:
        """A 1x1 convolution's weight as the (C, M) matrix W^T (contiguous) that the pixels multiply."""
        w = np.asarray(given[self.w], np.float32)
        return torch.from_numpy(np.ascontiguousarray(w.reshape(w.shape[0], -1).T))

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


def _pixels(t: Any) -> Any:
    """A channels-last (N, C, H, W) tensor as its (N*H*W, C) matrix of pixels (a view; a copy in another layout)."""
    return t.permute(0, 2, 3, 1).reshape(-1, t.shape[1])


def _matrix_views(out_shape: tuple[int, ...]) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    """(an input tensor -> its pixel matrix, the product's (N*H*W, M) matrix -> the channels-last output of
    `out_shape`); over 1x1 images both are one reshape (squeeze-excite's products run at every block)."""
    n, m, *spatial = out_shape
    if spatial == [1, 1]:
        return (lambda t: t.reshape(n, -1)), (lambda y: y.view(n, m, 1, 1))
    pixels = (n, *spatial, m)
    return _pixels, (lambda y: y.view(pixels).permute(0, 3, 1, 2))


def _product_step(conv: _Conv, xt: Any, given: dict[str, np.ndarray], activation: str | None, params: list) -> Step:
    """A 1x1 convolution as a matrix product of the channels-last pixels, (N*H*W, C) @ W^T + b (torch.addmm), then
    its activation in place; the (N*H*W, M) result viewed back as a channels-last (N, M, H, W) tensor."""
    wt, b, x, out = conv.matrix(given), conv.bias(given), conv.x, conv.out
    rows, image = _matrix_views(conv.out_shape(xt, given))
    product = torch.mm if b is None else functools.partial(torch.addmm, b)
    act = _in_place(activation, params)
    return lambda values: values.__setitem__(out, image(act(product(rows(values[x]), wt))))


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
    """conv(x) + other (+ Relu) in one step (a matrix product where `_Conv.is_product`, else one oneDNN call), into
    `other` when it may be overwritten and the convolution does not read it; other shapes (a broadcast) take the
    separate operations."""
    conv = _Conv(conv_node, slots)
    name = next(name for name in add.inputs[:2] if name != conv_node.outputs[0])
    other, out = slots[name], slots[(add if relu is None else relu).outputs[0]]
    in_place = name in free and name not in conv_node.inputs

    def make(values: list, given: dict[str, np.ndarray]) -> Step:
        converted = _to_channels_last(values, (conv.x, other))
        xt = values[conv.x]
        if tuple(values[other].shape) == conv.out_shape(xt, given) and conv.is_product(xt, given):
            step = _product_residual_step(conv, xt, given, (other, out), in_place, relu is not None)
        else:
            step = _onednn_residual_step(conv, values, given, (other, out), in_place, relu is not None)
        return _converting(step, converted) if converted else step

    return make


def _product_residual_step(conv: _Conv, xt: Any, given: dict, slots: tuple[int, int], in_place: bool,
                           relu: bool) -> Step:  # fmt: skip
    """other + b + x @ W^T (+ Relu) on the pixel matrices: the summand plus the bias (in place when it may be
    overwritten), then the product added into it (torch.Tensor.addmm_)."""
    wt, b, x, (other, out) = conv.matrix(given), conv.bias(given), conv.x, slots
    rows, image = _matrix_views(conv.out_shape(xt, given))
    if b is None:
        start = (lambda z: z) if in_place else torch.clone
    else:
        start = functools.partial(torch.Tensor.add_, other=b) if in_place else functools.partial(torch.add, other=b)
    post = torch.relu_ if relu else (lambda y: y)

    def step(values: list) -> None:
        values[out] = image(post(start(rows(values[other])).addmm_(rows(values[x]), wt)))

    return step


def _onednn_residual_step(conv: _Conv, values: list, given: dict, slots: tuple[int, int], in_place: bool,
                          relu: bool) -> Step:  # fmt: skip
    """conv(x) + other (+ Relu) through oneDNN: its "sum" post-op, into `other` itself when `in_place`; an `other`
    of another shape than the output is added after the convolution (ONNX's broadcasting)."""
    x, (other, out) = conv.x, slots
    (w, b), (pads, strides, dilations, group) = conv.packed(values[x], given), conv.geometry
    unary = "relu" if relu else None
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

    return step


op("ConvRegion", conv_region, tuple_output=True)
