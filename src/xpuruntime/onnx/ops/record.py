"""The record of one ONNX op, and the helpers its builders share.

An `OpRecord` holds every fact the session needs about an op: how to compute it with NumPy (`numpy`, the
CPU path and constant folding) and with PyTorch (`torch`, the GPU path), which inputs are read on the host
(shapes, axes, bounds) and which of those set the output's shape, whether the functions return a tuple,
whether the NumPy function may return a view of its first input (`views`), how old-opset forms are rewritten
at load time (`upgrade`), which attribute values are declined (`check`), and which xrt op runs it through
the selector (`lower`).

A builder `(node, opset) -> function` parses a node's attributes once, when the step is made, and returns
a small function of the node's input arrays (tensors on the GPU path) that returns its output, or a tuple
of outputs when `tuple_output` is set.

`torch` and `F` here are lazy: the core imports without PyTorch, and the first attribute read on the GPU
path imports it.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import ArgumentError, ShapeError
from ...graph.ir import Graph, Node
from ..dtypes import SUPPORTED_DTYPES
from ..errors import UnsupportedModelError

if TYPE_CHECKING:
    import onnx

Fn = Callable[..., Any]
Builder = Callable[[Node, int], Fn]
Lowered = tuple[str, tuple[int | None, ...], dict[str, Any]]
Lowering = Callable[[Node, list, int], Lowered | None]


@dataclass
class LoadContext:
    """What load-time rewrites and checks may consult: the graph being imported, the model it came from,
    and the initializers a feed may replace (not fixed by the model)."""

    graph: Graph
    model: onnx.ModelProto | None = None
    overridable: set[str] = field(default_factory=set)
    _ranks: dict[str, int] | None = None

    def rank(self, name: str) -> int | None:
        """The rank of a value where the model makes it known (worked out once, on first use)."""
        if self._ranks is None:
            from ..ranks import known_ranks

            self._ranks = known_ranks(self.graph, self.model)
        return self._ranks.get(name)


Upgrade = Callable[[Node, LoadContext], None]
Check = Callable[[Node, LoadContext], None]
Size = Callable[[Node, list, int], tuple[tuple[int, ...], int]]  # (largest output's shape, its itemsize)


@dataclass(frozen=True)
class OpRecord:
    """Everything the session knows about one ONNX op (see the module docstring)."""

    name: str
    numpy: Builder
    torch: Builder | None = None  # None: the GPU path declines the op at load time
    shape_inputs: frozenset[int] = frozenset()  # inputs whose values set the output's shape
    host_inputs: frozenset[int] = frozenset()  # inputs the GPU path reads on the host (shape_inputs included)
    tuple_output: bool = False  # the functions return a tuple of outputs
    shape_only: bool = False  # the output depends only on the first input's shape (Shape, Size)
    views: bool = False  # the NumPy function may return a view of its first input (Reshape, Transpose, Split...)
    channels_last_inputs: frozenset[int] = frozenset()  # 4-D constants the GPU path may keep NHWC (Conv's weight)
    upgrade: Upgrade | None = None  # rewrites old-opset forms of a node, at load time
    check: Check | None = None  # raises UnsupportedModelError for attribute values the session declines
    lower: Lowering | None = None  # the xrt op that runs the node through the selector, if any
    size: Size | None = None  # its largest output, from the inputs, for ops whose outputs can outgrow them


OPS: dict[str, OpRecord] = {}


def op(
    name: str,
    numpy: Builder,
    torch: Builder | None = None,
    *,
    shape_inputs: tuple[int, ...] = (),
    host_inputs: tuple[int, ...] = (),
    **facts: Any,
) -> OpRecord:
    """Record an op (once); `host_inputs` adds to `shape_inputs` the host-read inputs that set no shape."""
    if name in OPS:
        raise ValueError(f"ONNX op {name} is recorded twice")
    shapes = frozenset(shape_inputs)
    record = OpRecord(name, numpy, torch, shapes, shapes | frozenset(host_inputs), **facts)
    OPS[name] = record
    return record


# -- helpers of the builders ------------------------------------------------------------------------------
class LazyModule:
    """A module imported on first attribute access; every access reads the module's attribute of now."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: Any = None

    def __getattr__(self, attr: str) -> Any:
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attr)


torch: Any = LazyModule("torch")
F: Any = LazyModule("torch.nn.functional")


def to_host(x: Any) -> Any:
    """A value read on the host: NumPy arrays as they are, a tensor copied to the host (a sync on a GPU)."""
    if x is None or isinstance(x, np.ndarray):
        return x
    if hasattr(x, "detach"):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def is_tensor(x: Any) -> bool:
    """A PyTorch tensor (without importing PyTorch). Not `hasattr(x, "device")`: since NumPy 2, NumPy arrays
    have a `.device` too ('cpu'), and taking one for a tensor sends device values to the host."""
    return hasattr(x, "detach") and hasattr(x, "device")


def tensor_device(values: Any) -> Any:
    """The device of the first PyTorch tensor among `values` (None when there is none)."""
    return next((v.device for v in values if is_tensor(v)), None)


def capturing(device: Any) -> bool:
    """Whether `device`'s current stream is capturing a CUDA graph (then nothing may be read on the host)."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def host_readable(x: Any) -> bool:
    """Whether a value may be read on the host now: always, except a tensor on a device whose stream is
    capturing a CUDA graph (a copy to the host there breaks the capture)."""
    return not is_tensor(x) or not capturing(x.device)


def ints(x: Any) -> list[int]:
    """A shape, axes or bounds operand as Python ints ([] for a left-out one)."""
    return [] if x is None else [int(v) for v in np.asarray(to_host(x)).reshape(-1)]


def scalar(x: Any) -> Any:
    """The first element of an operand, as a Python number."""
    return np.asarray(to_host(x)).reshape(-1)[0].item()


def axis_index(op: str, axis: int, ndim: int) -> int:
    """`axis` in [-ndim, ndim) as a non-negative index; ShapeError naming the op otherwise."""
    if not -ndim <= axis < ndim:
        raise ShapeError(f"{op}: axis {axis} is out of range for a {ndim}-d input")
    return axis % ndim


def check_indices(op: str, indices: Any, dim: int, axis: int, shape: tuple[int, ...]) -> None:
    """Gather-style indices must lie in [-dim, dim) of the gathered axis; ArgumentError naming the op."""
    if math.prod(indices.shape) and (int(indices.min()) < -dim or int(indices.max()) >= dim):
        raise ArgumentError(f"{op}: indices outside [-{dim}, {dim}) for axis {axis} of shape {tuple(shape)}")


def torch_dtype(name: str) -> Any:
    """The torch dtype of a NumPy dtype name."""
    return torch.bool if name == "bool" else getattr(torch, name)


KERNEL_FLOATS = frozenset({"float16", "bfloat16", "float32", "float64"})


def dtype_name(x: Any) -> str | None:
    """'float32' for a NumPy array or a torch tensor of that dtype; None for anything else."""
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        return None
    return dtype.name if isinstance(dtype, np.dtype) else str(dtype).removeprefix("torch.")


def itemsize(x: Any) -> int:
    """Bytes per element of an array or tensor (8 for anything else)."""
    dtype = getattr(x, "dtype", None)
    if isinstance(dtype, np.dtype):
        return dtype.itemsize
    return int(getattr(dtype, "itemsize", 8))


def broadcast_size(node: Node, args: list, opset: int) -> tuple[tuple[int, ...], int]:
    """The output of a broadcasting elementwise op: the inputs' shapes broadcast together."""
    arrays = [a for a in args if a is not None]
    try:
        shape = tuple(np.broadcast_shapes(*(tuple(a.shape) for a in arrays)))
    except ValueError:
        shape = ()  # not broadcastable: the op's own error says so
    return shape, max((itemsize(a) for a in arrays), default=8)


def is_float(x: Any) -> bool:
    """Whether `x` holds a float dtype the xrt kernels take."""
    return dtype_name(x) in KERNEL_FLOATS


def host_tensor(array: np.ndarray) -> Any:
    """A CPU tensor over a host array's memory. torch.from_numpy shares the memory and warns about a read-only
    array (initializers are), so that one, or a non-contiguous one, is copied first; a writable contiguous array
    is not (and a 0-d array stays 0-d)."""
    if not array.flags.writeable or not array.flags.c_contiguous:
        array = np.array(array, order="C")
    return torch.from_numpy(array)


def as_tensor(array: np.ndarray, device: Any, non_blocking: bool = False) -> Any:
    """A host array as a tensor on `device` (`host_tensor`, then moved)."""
    return host_tensor(array).to(device, non_blocking=non_blocking)


class DeviceCache(dict):
    """Host arrays (pad and resize indices and weights) moved to a device once per key, so a replayed
    CUDA graph never copies from the host; a few hundred keys at most."""

    def get_or_move(self, key: Any, make: Callable[[], tuple], device: Any) -> tuple:
        found = self.get((key, str(device)))
        if found is None:
            if len(self) > 256:
                self.clear()
            found = tuple(None if a is None else as_tensor(np.asarray(a), device) for a in make())
            self[(key, str(device))] = found
        return found


def elem_dtype(node: Node, attr: str, default: Any = None) -> np.dtype | None:
    """A dtype attribute (an ONNX element type, as EyeLike's `dtype` or BitCast's `to`) as a NumPy dtype;
    `default` when the node leaves it out."""
    value = node.attrs.get(attr)
    if value is None:
        return default
    import onnx

    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(int(value)))


def check_elem_dtype(attr: str) -> Callable[[Node, LoadContext], None]:
    """A load-time check that the dtype attribute `attr`, if set, names a dtype the session runs."""

    def check(node: Node, ctx: LoadContext) -> None:
        try:
            dtype = elem_dtype(node, attr)
            name = None if dtype is None else dtype.name
        except Exception:
            name = f"element type {node.attrs.get(attr)}"
        if name is not None and name not in SUPPORTED_DTYPES:
            raise UnsupportedModelError(f"{node.describe()}: {attr}={name} is not supported")

    return check


def on_host(numpy_builder: Builder, device: Any = None) -> Builder:
    """A PyTorch builder that runs the NumPy function on host copies of the inputs and moves the results to
    `device` (default: the first tensor input's): how the GPU path runs an op without a PyTorch function, as
    onnxruntime falls back to its CPU provider, and a few ops' forms PyTorch lacks. A sync per call: the plan
    still runs, but a CUDA graph cannot capture it."""

    def build(node: Node, opset: int) -> Fn:
        fn = numpy_builder(node, opset)

        def run(*args: Any) -> Any:
            where = device if device is not None else tensor_device(args) or "cpu"
            result = fn(*(to_host(a) for a in args))
            move = lambda r: as_tensor(np.asarray(r), where)  # noqa: E731
            return tuple(move(r) for r in result) if isinstance(result, tuple | list) else move(result)

        return run

    return build
