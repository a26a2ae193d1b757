"""GPU execution of an InferenceSession: PyTorch CUDA tensors through the same planner and dispatcher,
and one CUDA graph captured per static input signature and replayed afterwards.

Kernel steps launch the kernels the selector chose (Triton, cuBLASLt, PyTorch's) on the current stream;
the remaining nodes run as small PyTorch functions (`TORCH_OPS`). Constants move to the device once, when
the plan is made; shape parameters (Reshape targets, axes, Slice bounds) stay on the host.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import DTypeError, XpuRuntimeError
from ..graph.ir import Node
from .errors import UnsupportedModelError
from .executor import ExecutionPlan, Planner, Step
from .lowering import XRT_DOMAIN, dtype_name
from .opmap import check_dropout_inference, crop_widths, pad_source, pad_widths, prelu_channel_shape, topk_axis_and_k
from .resize import axis_taps, outside_mask, resize_spec, saturation, split_inputs, taps_key, working_dtype
from .session import check_shape

if TYPE_CHECKING:
    from .session import GraphVariant, InferenceSession

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # the CPU path never imports this module
    torch = None

# inputs read as host values (shapes, axes, bounds): op -> input indices
HOST_INPUTS = {
    "Reshape": {1}, "Expand": {1}, "Slice": {1, 2, 3, 4}, "Squeeze": {1}, "Unsqueeze": {1}, "Split": {1},
    "Tile": {1, 2}, "ReduceSum": {1}, "ReduceMean": {1}, "ReduceMax": {1}, "ReduceMin": {1}, "ReduceProd": {1},
    "ConstantOfShape": {0}, "Range": {0, 1, 2}, "Pad": {1, 2, 3}, "TopK": {1}, "Resize": {1, 2, 3},
    "Upsample": {1}, "Dropout": {1, 2},
}  # fmt: skip


def _ints(x: Any) -> list[int]:
    """A shape/axes operand as Python ints (host arrays normally; a device tensor costs a sync)."""
    if x is None:
        return []
    if torch is not None and isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return [int(v) for v in np.asarray(x).reshape(-1)]


def _ints_or_float(x: Any) -> float:
    if torch is not None and isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return float(np.asarray(x).reshape(-1)[0])


def _host(x: Any) -> Any:
    """An operand read on the host (scales, sizes, roi) as NumPy; a device tensor costs a sync."""
    return x.detach().cpu().numpy() if torch is not None and isinstance(x, torch.Tensor) else x


def _scalar(x: Any) -> Any:
    """The first element of a host array or tensor, as a Python number."""
    return np.asarray(_host(x)).reshape(-1)[0].item()


def _as_tensor(array: np.ndarray, device: Any, non_blocking: bool = False) -> Any:
    """A host array as a tensor on `device`. torch.from_numpy shares the array's memory and warns about a
    read-only one (initializers are), so that one, or a non-contiguous one, is copied first; a writable
    contiguous array is not (and a 0-d array stays 0-d)."""
    if not array.flags.writeable or not array.flags.c_contiguous:
        array = np.array(array, order="C")
    return torch.from_numpy(array).to(device, non_blocking=non_blocking)


class _DeviceCache(dict):
    """Host arrays (pad and resize indices and weights) moved to a device once per key, so a replayed
    CUDA graph never copies from the host; a few hundred keys at most."""

    def get_or_move(self, key: Any, make: Callable[[], tuple], device: Any) -> tuple:
        found = self.get((key, str(device)))
        if found is None:
            if len(self) > 256:
                self.clear()
            found = tuple(None if a is None else _as_tensor(np.asarray(a), device) for a in make())
            self[(key, str(device))] = found
        return found


def _extreme(dtype: Any, low: bool) -> Any:
    """The identity of max (low=True) or min over `dtype`."""
    if dtype == torch.bool:
        return not low
    if dtype.is_floating_point:
        return float("-inf") if low else float("inf")
    return torch.iinfo(dtype).min if low else torch.iinfo(dtype).max


def _torch_dtype(name: str) -> Any:
    return getattr(torch, name) if name != "bool" else torch.bool


def _builders() -> dict[str, Callable[[Node, int], Callable]]:
    """PyTorch versions of the op map (built lazily: torch is imported only for GPU sessions)."""
    ops: dict[str, Callable[[Node, int], Callable]] = {}

    def simple(fn: Callable) -> Callable[[Node, int], Callable]:
        return lambda node, opset: fn

    for name, fn in {
        "Sqrt": torch.sqrt, "Reciprocal": torch.reciprocal, "Tanh": torch.tanh, "Exp": torch.exp, "Log": torch.log,
        "Neg": torch.neg, "Abs": torch.abs, "Sigmoid": torch.sigmoid, "Floor": torch.floor, "Ceil": torch.ceil,
        "Sin": torch.sin, "Cos": torch.cos, "Sign": torch.sign, "Erf": torch.erf, "Relu": torch.relu,
        "Identity": lambda x: x, "Not": torch.logical_not, "IsNaN": torch.isnan, "Add": torch.add,
        "Sub": torch.sub, "Mul": torch.mul, "Equal": torch.eq, "Greater": torch.gt, "Less": torch.lt,
        "GreaterOrEqual": torch.ge, "LessOrEqual": torch.le, "And": torch.logical_and, "Or": torch.logical_or,
        "Xor": torch.logical_xor, "Where": torch.where, "MatMul": torch.matmul,
        "CastLike": lambda x, like: x.to(like.dtype),
    }.items():  # fmt: skip
        ops[name] = simple(fn)

    def div(node: Node, opset: int) -> Callable:
        return lambda a, b: torch.div(a, b, rounding_mode="trunc") if not a.is_floating_point() else a / b

    def power(node: Node, opset: int) -> Callable:
        return lambda a, b: torch.pow(a, b).to(a.dtype)

    def max_min(node: Node, opset: int) -> Callable:
        fn = torch.maximum if node.op == "Max" else torch.minimum

        def run(*xs: Any) -> Any:
            result = xs[0]
            for x in xs[1:]:
                result = fn(result, x)
            return result

        return run

    def gelu(node: Node, opset: int) -> Callable:
        approximate = node.attrs.get("approximate", "none")
        return lambda x: F.gelu(x, approximate=approximate)

    def cast(node: Node, opset: int) -> Callable:
        target = _torch_dtype(node.attrs["to"])
        return lambda x: x.to(target)

    def clip(node: Node, opset: int) -> Callable:
        lo_attr, hi_attr = node.attrs.get("min"), node.attrs.get("max")

        def run(x: Any, lo: Any = None, hi: Any = None) -> Any:
            lo, hi = (lo_attr if lo is None else lo), (hi_attr if hi is None else hi)
            return x.clone() if lo is None and hi is None else torch.clamp(x, lo, hi)

        return run

    def gemm(node: Node, opset: int) -> Callable:
        at = node.attrs
        alpha, beta, ta, tb = at.get("alpha", 1.0), at.get("beta", 1.0), at.get("transA", 0), at.get("transB", 0)

        def run(a: Any, b: Any, c: Any = None) -> Any:
            y = torch.matmul(a.T if ta else a, b.T if tb else b) * alpha
            return y if c is None else y + beta * c

        return run

    def softmax(node: Node, opset: int) -> Callable:
        axis = node.attrs.get("axis", -1 if opset >= 13 else 1)
        log = node.op == "LogSoftmax"
        if opset < 13:

            def flat(x: Any) -> Any:
                ax = axis % x.dim()
                y = x.reshape(math.prod(x.shape[:ax]), -1)
                return (torch.log_softmax if log else torch.softmax)(y, 1).reshape(x.shape)

            return flat
        return lambda x: (torch.log_softmax if log else torch.softmax)(x, axis)

    def layer_norm(node: Node, opset: int) -> Callable:
        axis, eps = node.attrs.get("axis", -1), node.attrs.get("epsilon", 1e-5)

        def run(x: Any, scale: Any, bias: Any = None) -> tuple:
            axes = tuple(range(axis % x.dim(), x.dim()))
            xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
            mean = xf.mean(dim=axes, keepdim=True)
            centered = xf - mean
            inv = torch.rsqrt((centered * centered).mean(dim=axes, keepdim=True) + eps)
            y = centered * inv * scale
            y = y if bias is None else y + bias
            return y.to(x.dtype), mean.float(), inv.float()

        return run

    def reduce(node: Node, opset: int) -> Callable:
        keepdims, noop = bool(node.attrs.get("keepdims", 1)), bool(node.attrs.get("noop_with_empty_axes", 0))
        attr_axes = node.attrs.get("axes")
        as_input = opset >= (13 if node.op == "ReduceSum" else 18)
        fn = {
            "ReduceSum": torch.sum, "ReduceMean": torch.mean, "ReduceProd": torch.prod,
            "ReduceL1": lambda x, dim, keepdim: torch.sum(x.abs(), dim=dim, keepdim=keepdim),
            "ReduceL2": lambda x, dim, keepdim: torch.sqrt(torch.sum(x * x, dim=dim, keepdim=keepdim).double()),
            "ReduceSumSquare": lambda x, dim, keepdim: torch.sum(x * x, dim=dim, keepdim=keepdim),
            "ReduceLogSum": lambda x, dim, keepdim: torch.log(torch.sum(x, dim=dim, keepdim=keepdim).double()),
            "ReduceLogSumExp": lambda x, dim, keepdim: torch.logsumexp(x.double(), dim=dim, keepdim=keepdim),
        }.get(node.op)  # fmt: skip

        def run(x: Any, axes: Any = None) -> Any:
            raw = _ints(axes) if as_input else list(attr_axes or [])
            if not raw:
                if noop:
                    return x
                raw = list(range(x.dim()))
            dims = tuple(sorted(a % x.dim() for a in raw))
            if node.op == "ReduceProd":
                for d in reversed(dims):
                    x = torch.prod(x, dim=d, keepdim=keepdims)
                return x
            if fn is not None:
                return fn(x, dim=dims, keepdim=keepdims).to(x.dtype)
            if any(x.shape[d] == 0 for d in dims):  # the empty max/min is the lowest/highest value
                shape = [1 if i in dims else n for i, n in enumerate(x.shape) if keepdims or i not in dims]
                return torch.full(shape, _extreme(x.dtype, low=node.op == "ReduceMax"), dtype=x.dtype, device=x.device)
            return (torch.amax if node.op == "ReduceMax" else torch.amin)(x, dim=dims, keepdim=keepdims)

        return run

    def reshape(node: Node, opset: int) -> Callable:
        allowzero = bool(node.attrs.get("allowzero", 0))

        def run(x: Any, shape: Any) -> Any:
            dims = _ints(shape)
            if not allowzero:
                dims = [x.shape[i] if d == 0 and i < x.dim() else d for i, d in enumerate(dims)]
            return x.reshape(dims)

        return run

    def flatten(node: Node, opset: int) -> Callable:
        axis = node.attrs.get("axis", 1)
        return lambda x: x.reshape(math.prod(x.shape[: axis % x.dim() if axis < 0 else axis]), -1)

    def transpose(node: Node, opset: int) -> Callable:
        perm = node.attrs.get("perm")
        return lambda x: x.permute(*(perm if perm is not None else reversed(range(x.dim()))))

    def squeeze(node: Node, opset: int) -> Callable:
        attr_axes = node.attrs.get("axes")

        def run(x: Any, axes: Any = None) -> Any:
            raw = _ints(axes) if opset >= 13 else list(attr_axes or [])
            if not raw:
                return x.squeeze()
            return x.squeeze(tuple(a % x.dim() for a in raw))

        return run

    def unsqueeze(node: Node, opset: int) -> Callable:
        attr_axes = node.attrs.get("axes")

        def run(x: Any, axes: Any = None) -> Any:
            raw = _ints(axes) if opset >= 13 else list(attr_axes or [])
            rank = x.dim() + len(raw)
            for a in sorted(a % rank for a in raw):
                x = x.unsqueeze(a)
            return x

        return run

    def concat(node: Node, opset: int) -> Callable:
        axis = node.attrs["axis"]
        return lambda *xs: torch.cat(xs, dim=axis)

    def split(node: Node, opset: int) -> Callable:
        axis, count, num = node.attrs.get("axis", 0), len(node.outputs), node.attrs.get("num_outputs")
        attr_split = node.attrs.get("split")

        def run(x: Any, sizes: Any = None) -> tuple:
            parts = _ints(sizes) if sizes is not None else list(attr_split or [])  # Split-1 takes either
            n = x.shape[axis]
            if not parts:
                chunk = -(-n // (num or count))
                parts = [min(chunk, max(n - i * chunk, 0)) for i in range(num or count)]
            return tuple(torch.split(x, parts, dim=axis))

        return run

    def slice_(node: Node, opset: int) -> Callable:
        def run(x: Any, starts: Any, ends: Any, axes: Any = None, steps: Any = None) -> Any:
            starts, ends = _ints(starts), _ints(ends)
            axes = _ints(axes) if axes is not None else list(range(len(starts)))
            steps = _ints(steps) if steps is not None else [1] * len(starts)
            for start, end, axis, step in zip(starts, ends, axes, steps):
                ax, dim = axis % x.dim(), x.shape[axis]
                start, end = start + dim if start < 0 else start, end + dim if end < 0 else end
                if step > 0:
                    start, end = min(max(start, 0), dim), min(max(end, 0), dim)
                    x = x.narrow(ax, start, max(end - start, 0))[(slice(None),) * ax + (slice(None, None, step),)]
                else:  # negative steps: gather the indices Python's slicing picks
                    start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
                    picked = list(range(dim))[slice(start, None if end < 0 else end, step)]
                    x = torch.index_select(x, ax, torch.tensor(picked, dtype=torch.long, device=x.device))
            return x

        if opset < 10:  # Slice-1: starts, ends and axes are attributes
            bounds = (node.attrs["starts"], node.attrs["ends"], node.attrs.get("axes"))
            return lambda x: run(x, *bounds)
        return run

    def gather(node: Node, opset: int) -> Callable:
        axis = node.attrs.get("axis", 0)

        def run(x: Any, indices: Any) -> Any:
            ax = axis % x.dim()
            idx = indices.long()
            idx = torch.where(idx < 0, idx + x.shape[ax], idx)
            flat = torch.index_select(x, ax, idx.reshape(-1))
            return flat.reshape(*x.shape[:ax], *indices.shape, *x.shape[ax + 1 :])

        return run

    def expand(node: Node, opset: int) -> Callable:
        return lambda x, shape: x.expand(torch.broadcast_shapes(tuple(x.shape), tuple(_ints(shape))))

    def tile(node: Node, opset: int) -> Callable:
        if opset < 6:  # Tile-1: `tiles` copies along one `axis`, both inputs

            def along(x: Any, tiles: Any, axis: Any) -> Any:
                repeats = [1] * x.dim()
                repeats[_ints(axis)[0] % x.dim()] = _ints(tiles)[0]
                return x.repeat(*repeats)

            return along
        return lambda x, repeats: x.repeat(*_ints(repeats))

    def range_(node: Node, opset: int) -> Callable:
        def run(start: Any, limit: Any, delta: Any) -> Any:
            s, lim, d = (float(_ints_or_float(v)) for v in (start, limit, delta))
            n = max(math.ceil((lim - s) / d), 0)
            dtype = start.dtype if isinstance(start, torch.Tensor) else _torch_dtype(start.dtype.name)
            device = next((v.device for v in (start, limit, delta) if isinstance(v, torch.Tensor)), None)
            return (s + d * torch.arange(n, dtype=torch.float64, device=device)).to(dtype)

        return run

    def constant_of_shape(node: Node, opset: int) -> Callable:
        value = node.attrs.get("value")
        fill = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
        return lambda shape: torch.full(_ints(shape), fill[0].item(), dtype=_torch_dtype(fill.dtype.name))

    def activation(fn: Callable) -> Callable[[Node, int], Callable]:
        return lambda node, opset: lambda x, a=node.attrs: fn(x, a)

    for name, fn in {
        "LeakyRelu": lambda x, a: F.leaky_relu(x, a.get("alpha", 0.01)),
        "Elu": lambda x, a: F.elu(x, a.get("alpha", 1.0)),
        "Celu": lambda x, a: F.celu(x, a.get("alpha", 1.0)),
        "Selu": lambda x, a: a.get("gamma", 1.0507009873554805) * torch.where(
            x > 0, x, a.get("alpha", 1.6732632423543772) * torch.expm1(x)),
        "Softplus": lambda x, a: F.softplus(x), "Softsign": lambda x, a: F.softsign(x),
        "HardSigmoid": lambda x, a: torch.clamp(a.get("alpha", 0.2) * x + a.get("beta", 0.5), 0, 1),
        "HardSwish": lambda x, a: x * torch.clamp(x / 6 + 0.5, 0, 1),
        "ThresholdedRelu": lambda x, a: torch.where(x > a.get("alpha", 1.0), x, torch.zeros_like(x)),
        "Round": lambda x, a: torch.round(x),
    }.items():  # fmt: skip
        ops[name] = activation(fn)

    def prelu(node: Node, opset: int) -> Callable:
        def run(x: Any, slope: Any) -> Any:
            channels = prelu_channel_shape(opset, tuple(x.shape), tuple(slope.shape))
            slope = slope if channels is None else slope.reshape(channels)
            return torch.where(x < 0, x * slope, x)

        return run

    def mod(node: Node, opset: int) -> Callable:
        return lambda a, b: torch.fmod(a, b) if node.attrs.get("fmod", 0) else torch.remainder(a, b)

    def sum_mean(node: Node, opset: int) -> Callable:
        def run(*xs: Any) -> Any:
            total = xs[0]
            for x in xs[1:]:
                total = total + x
            return (total / len(xs)).to(xs[0].dtype) if node.op == "Mean" else total

        return run

    def arg(node: Node, opset: int) -> Callable:
        axis, keepdims = node.attrs.get("axis", 0), bool(node.attrs.get("keepdims", 1))
        last, fn = bool(node.attrs.get("select_last_index", 0)), torch.argmax if node.op == "ArgMax" else torch.argmin

        def run(x: Any) -> Any:
            ax = axis % x.dim()
            if last:
                return x.shape[ax] - 1 - fn(torch.flip(x, (ax,)), dim=ax, keepdim=keepdims)
            return fn(x, dim=ax, keepdim=keepdims)

        return run

    def cumsum(node: Node, opset: int) -> Callable:
        exclusive, reverse = bool(node.attrs.get("exclusive", 0)), bool(node.attrs.get("reverse", 0))

        def run(x: Any, axis: Any) -> Any:
            ax = _ints(axis)[0] % x.dim()
            y = torch.flip(x, (ax,)) if reverse else x
            out = torch.cumsum(y, dim=ax).to(x.dtype)
            if exclusive and out.shape[ax]:
                out = torch.cat([torch.zeros_like(out.narrow(ax, 0, 1)), out.narrow(ax, 0, out.shape[ax] - 1)], dim=ax)
            return torch.flip(out, (ax,)) if reverse else out

        return run

    def trilu(node: Node, opset: int) -> Callable:
        upper = bool(node.attrs.get("upper", 1))

        def run(x: Any, k: Any = None) -> Any:
            diagonal = 0 if k is None else _ints(k)[0]
            return torch.triu(x, diagonal) if upper else torch.tril(x, diagonal)

        return run

    def gather_elements(node: Node, opset: int) -> Callable:
        axis = node.attrs.get("axis", 0)

        def run(x: Any, indices: Any) -> Any:
            ax = axis % x.dim()
            idx = indices.long()
            return torch.gather(x, ax, torch.where(idx < 0, idx + x.shape[ax], idx))

        return run

    def einsum(node: Node, opset: int) -> Callable:
        equation = node.attrs["equation"].replace(" ", "")
        return lambda *xs: torch.einsum(equation, *xs)

    def shape(node: Node, opset: int) -> Callable:  # folded while planning unless the shape varies per run
        start, end = node.attrs.get("start", 0), node.attrs.get("end")
        return lambda x: torch.tensor(tuple(x.shape)[start:end], dtype=torch.int64, device=x.device)

    def size(node: Node, opset: int) -> Callable:
        return lambda x: torch.tensor(x.numel(), dtype=torch.int64, device=x.device)

    def pad(node: Node, opset: int) -> Callable:
        mode, cache = node.attrs.get("mode", "constant"), _DeviceCache()

        def run(x: Any, pads: Any, value: Any = None, axes: Any = None) -> Any:
            widths = pad_widths("Pad", tuple(x.shape), _ints(pads), None if axes is None else _ints(axes))
            crop, widths = crop_widths(tuple(x.shape), widths)
            x = x[crop]
            if mode == "constant":
                fill = 0 if value is None or np.size(_host(value)) == 0 else _scalar(value)
                out = x.new_full([n + b + e for n, (b, e) in zip(x.shape, widths)], fill)
                out[tuple(slice(b, b + n) for n, (b, _) in zip(x.shape, widths))] = x
                return out
            for axis, (begin, end) in enumerate(widths):
                if begin or end:
                    key = (x.shape[axis], begin, end)
                    (index,) = cache.get_or_move(key, lambda key=key: (pad_source(*key, mode),), x.device)
                    x = x.index_select(axis, index)
            return x

        return run

    def resize(node: Node, opset: int) -> Callable:
        spec, cache = resize_spec(node, opset), _DeviceCache()

        def run(x: Any, *rest: Any) -> Any:
            key = taps_key(tuple(x.shape), *(_host(r) for r in split_inputs(spec, rest)))
            _, taps = axis_taps(spec, key)
            moved = cache.get_or_move(
                key, lambda: (outside_mask(taps, x.dim()), *(a for t in taps for a in (t.index, t.weight))), x.device
            )
            mask, *arrays = moved
            y = x.to(_torch_dtype(working_dtype(taps, dtype_name(x))))
            for tap, index, weight in zip(taps, arrays[::2], arrays[1::2]):
                y = _interpolate(y, tap.axis, index, weight)
            if mask is not None:
                y = torch.where(mask, torch.tensor(spec.extrapolation, dtype=y.dtype, device=y.device), y)
            if y.dtype == x.dtype:
                return y
            bounds = saturation(dtype_name(x))
            return (y if bounds is None else torch.clamp(torch.round(y), *bounds)).to(x.dtype)

        return run

    def topk(node: Node, opset: int) -> Callable:
        axis, largest = node.attrs.get("axis", -1), bool(node.attrs.get("largest", 1))

        def run(x: Any, k: Any) -> tuple:
            ax, count = topk_axis_and_k(axis, _ints(k), tuple(x.shape))
            values, index = torch.sort(x, dim=ax, descending=largest, stable=True)  # ties: lower index first
            return values.narrow(ax, 0, count), index.narrow(ax, 0, count)

        return run

    def dropout(node: Node, opset: int) -> Callable:
        mask = len(node.outputs) > 1 and bool(node.outputs[1])

        def run(x: Any, ratio: Any = None, training: Any = None) -> tuple:
            check_dropout_inference(_host(ratio), _host(training))
            if not mask:
                return (x,)
            dtype = torch.bool if opset >= 10 else x.dtype
            return x, torch.ones(x.shape, dtype=dtype, device=x.device)

        return run

    ops.update(Pad=pad, Resize=resize, Upsample=resize, TopK=topk, Dropout=dropout)
    ops.update(
        PRelu=prelu, Mod=mod, Sum=sum_mean, Mean=sum_mean, ArgMax=arg, ArgMin=arg, CumSum=cumsum, Trilu=trilu,
        GatherElements=gather_elements, Einsum=einsum, Shape=shape, Size=size,
    )  # fmt: skip
    ops.update(
        Div=div, Pow=power, Max=max_min, Min=max_min, Gelu=gelu, Cast=cast, Clip=clip, Gemm=gemm, Softmax=softmax,
        LogSoftmax=softmax, LayerNormalization=layer_norm, ReduceSum=reduce, ReduceMean=reduce, ReduceMax=reduce,
        ReduceL1=reduce, ReduceL2=reduce, ReduceSumSquare=reduce, ReduceLogSum=reduce, ReduceLogSumExp=reduce,
        ReduceMin=reduce, ReduceProd=reduce, Reshape=reshape, Flatten=flatten, Transpose=transpose, Squeeze=squeeze,
        Unsqueeze=unsqueeze, Concat=concat, Split=split, Slice=slice_, Gather=gather, Expand=expand, Tile=tile,
        Range=range_, ConstantOfShape=constant_of_shape,
    )  # fmt: skip
    return ops


def _interpolate(y: Any, axis: int, index: Any, weight: Any) -> Any:
    """One axis of a resize: output i is the sum over taps j of y[index[i, j]] * weight[i, j] (one tap
    and no weights: nearest)."""
    if weight is None:
        return y.index_select(axis, index[:, 0])
    along = (-1,) + (1,) * (y.dim() - axis - 1)
    weight = weight.to(y.dtype)
    total = None
    for j in range(index.shape[1]):
        term = y.index_select(axis, index[:, j]) * weight[:, j].reshape(along)
        total = term if total is None else total.add_(term)
    return total


def _fused_fallback(node: Node) -> Callable:
    """A fused_elementwise program evaluated with PyTorch ops (when no kernel can run it)."""
    table = {
        "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
        "rsqrt": torch.rsqrt, "reciprocal": torch.reciprocal, "tanh": torch.tanh, "erf": torch.erf,
        "sigmoid": torch.sigmoid, "relu": torch.relu, "gelu": F.gelu,
        "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "sin": torch.sin, "cos": torch.cos,
        "copy": lambda x: x, "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
        "pow": torch.pow, "max": torch.maximum, "min": torch.minimum,
    }  # fmt: skip
    program, dtype = node.attrs["program"], _torch_dtype(node.attrs["dtype"])
    compute = torch.float64 if dtype == torch.float64 else torch.float32

    def run(*inputs: Any) -> Any:
        xs = [x.to(compute) for x in inputs if x is not None]
        values: list[Any] = []
        for op, *refs in program:
            args = [
                xs[r[1]] if r[0] == "in" else values[r[1]] if r[0] == "t" else torch.full((), r[1], dtype=compute,
                                                                                          device=xs[0].device)
                for r in refs
            ]  # fmt: skip
            values.append(table[op](*args))
        shape = torch.broadcast_shapes(*(tuple(x.shape) for x in xs))
        return values[-1].to(dtype).expand(shape).contiguous()

    return run


def _xrt_fallback(node: Node) -> Callable:
    at = node.attrs
    if node.op == "fused_elementwise":
        return _fused_fallback(node)
    if node.op == "attention":

        def attention(q: Any, k: Any, v: Any, mask: Any = None) -> Any:
            if mask is not None and mask.dim() < 2:  # SDPA wants a mask with (L, S) dims
                mask = mask.reshape(*(1,) * (2 - mask.dim()), *mask.shape)
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=bool(at.get("is_causal")), scale=at.get("scale")
            )

        return attention
    if node.op == "linear":
        act = {"relu": torch.relu, "gelu": lambda z: F.gelu(z, approximate="tanh")}.get(at.get("activation"))
        return lambda x, w, b=None: act(F.linear(x, w, b)) if act else F.linear(x, w, b)
    if node.op == "layer_norm":
        return lambda x, w=None, b=None: F.layer_norm(x, tuple(at["normalized_shape"]), w, b, at.get("eps", 1e-5))
    raise UnsupportedModelError(f"{node.describe()}: no GPU fallback for xrt op '{node.op}'")


class GpuPlanner(Planner):
    """The planner with device tensors: constants move to the device once, non-kernel steps use PyTorch."""

    wrap = staticmethod(lambda x: x)
    step_kind = "torch"

    def __init__(self, *args: Any, device: Any, constants: dict, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.device = device
        self.constants = constants  # value name -> device tensor, shared by the session's plans
        self.op_table = TORCH_OPS

    def _device_inputs(self, node: Node, ins: tuple, values: list, static: set, slot: Callable) -> tuple:
        host = HOST_INPUTS.get(node.op, set()) if not node.domain else set()
        moved = []
        for position, (name, index) in enumerate(zip(node.inputs, ins)):
            value = values[index]
            if index in static and isinstance(value, np.ndarray) and position not in host and name:
                device_name = f"{name}@{self.device}"
                index = slot(device_name)
                if values[index] is None:  # initializers move once per session, shape-derived values per plan
                    tensor = self.constants.get(device_name)
                    if tensor is None:
                        tensor = _as_tensor(value, self.device)
                        if name in self.graph.initializers:
                            self.constants[device_name] = tensor
                    values[index] = tensor
                    static.add(index)
            moved.append(index)
        return tuple(moved)

    def _fallback_step(self, node: Node, ins: tuple, outs: tuple, note: str) -> Step:
        fn = _xrt_fallback(node)
        (o,) = outs[:1]

        def run(env: list) -> None:
            env[o] = fn(*[env[i] for i in ins])

        step = Step(node, "torch", ins, outs, fn=fn, note=f"PyTorch fallback; {note}"[:300])
        step.run = run
        return step


TORCH_OPS: dict = {}


class GpuRunner:
    """Runs a session's optimized graph on a CUDA device, one plan (and CUDA graph) per input signature."""

    def __init__(self, session: InferenceSession, torch_device: str | None = None) -> None:
        """`torch_device` overrides the session's device (tests run this path with CPU tensors)."""
        if torch is None:
            raise UnsupportedModelError("InferenceSession(device='cuda') needs PyTorch with CUDA")
        self.device = torch.device(torch_device or session.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise UnsupportedModelError(
                f"InferenceSession: device '{session.device}' requested but CUDA is not available"
            )
        if not TORCH_OPS:
            TORCH_OPS.update(_builders())
        self.session = session
        missing = sorted({n.op for n in session.graph.nodes if n.domain != XRT_DOMAIN and n.op not in TORCH_OPS})
        if missing:
            raise UnsupportedModelError(f"ops without a GPU implementation: {', '.join(missing)}")
        graph = session.graph
        dtypes = {v.dtype for v in (*graph.inputs, *graph.outputs, *graph.values.values())}
        dtypes |= {a.dtype.name for a in graph.initializers.values()}
        wide_unsigned = sorted(d for d in dtypes if d in ("uint16", "uint32", "uint64"))
        if wide_unsigned:
            raise UnsupportedModelError(f"dtypes without GPU support in PyTorch: {', '.join(wide_unsigned)}")
        self.constants: dict[frozenset, dict[str, Any]] = {}  # per graph variant: passes name constants per graph
        self.fns: dict[int, Callable] = {}
        self.entries: dict[tuple, _Entry] = {}

    def feeds(self, input_feed: Any) -> tuple[GraphVariant, list[Any], bool]:
        """The graph variant for the names fed, device tensors in its input order, and whether the caller
        passed NumPy (then results go back as NumPy)."""
        session = self.session
        values = list(input_feed.values()) if hasattr(input_feed, "values") else []
        if values and all(isinstance(v, torch.Tensor) for v in values):
            variant = session.variant_for(input_feed)
            feeds, symbols = [], {}
            for v in variant.inputs:
                t = input_feed[v.name]
                if v.dtype is not None and dtype_name(t) != v.dtype:
                    raise DTypeError(f"run: input '{v.name}' expected dtype {v.dtype}, got {dtype_name(t)}")
                check_shape(v, tuple(t.shape), symbols)
                feeds.append(t.to(self.device).contiguous())
            return variant, feeds, False
        variant, arrays = session.variant_feeds(input_feed)
        return variant, [_as_tensor(a, self.device, non_blocking=True) for a in arrays], True

    def run(self, input_feed: Any) -> list:
        variant, feeds, numpy_out = self.feeds(input_feed)
        policy = self.session.policy
        from ..policy import current_policy

        key = ((policy or current_policy()).fingerprint, variant.fed, *[(t.dtype, tuple(t.shape)) for t in feeds])
        entry = self.entries.get(key)
        if entry is None:
            entry = self.entries[key] = self._build(variant, feeds)
            outputs = entry.first
            entry.first = None
        else:
            outputs = entry.run(feeds)
        return [o.cpu().numpy() if numpy_out and hasattr(o, "cpu") else o for o in outputs]

    def _build(self, variant: GraphVariant, feeds: list[Any]) -> _Entry:
        session = self.session
        missing = sorted({n.op for n in variant.graph.nodes if n.domain != XRT_DOMAIN and n.op not in TORCH_OPS})
        if missing:
            raise UnsupportedModelError(f"ops without a GPU implementation: {', '.join(missing)}")
        constants = self.constants.setdefault(variant.fed, {})
        with session._policy_scope():
            planner = GpuPlanner(variant.graph, session.dispatcher, self.fns, False, device=self.device,
                                 constants=constants)  # fmt: skip
            plan, outputs = planner.build({v.name: t for v, t in zip(variant.inputs, feeds)})
        entry = _Entry(plan, [o.clone() if hasattr(o, "clone") else o for o in outputs])
        if session.options.enable_cuda_graph and self.device.type == "cuda" and not plan.varying:
            entry.capture(feeds)
        return entry

    def plans(self) -> list[ExecutionPlan]:
        return [e.plan for e in self.entries.values()]


class _Entry:
    """One signature's plan, and its captured CUDA graph (None when capture failed or is off)."""

    def __init__(self, plan: ExecutionPlan, first: list) -> None:
        self.plan = plan
        self.first: list | None = first
        self.graph: Any = None
        self.note = "CUDA graph off"
        self.static_inputs: list[Any] = []
        self.static_outputs: list[Any] = []
        self.lock = threading.Lock()  # one replay at a time: the graph's inputs and outputs are shared

    def capture(self, feeds: list[Any]) -> None:
        try:
            self.static_inputs = [t.clone() for t in feeds]
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):  # warm-up outside capture: JIT compiles, library handles, workspaces
                    self.plan.run(self.static_inputs)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self.static_outputs = self.plan.run(self.static_inputs)
            self.graph, self.note = graph, "CUDA graph captured"
        except Exception as exc:  # capture is an optimization: run eagerly and say why
            self.graph, self.note = None, f"CUDA graph capture failed ({type(exc).__name__}: {str(exc)[:200]}); eager"
            with contextlib.suppress(Exception):  # a broken capture may leave an error behind on the stream
                torch.cuda.synchronize()

    def run(self, feeds: list[Any]) -> list:
        if self.graph is None:
            return self.plan.run(feeds)
        with self.lock:
            for static, new in zip(self.static_inputs, feeds):
                static.copy_(new, non_blocking=True)
            self.graph.replay()
            return [o.clone() if hasattr(o, "clone") else o for o in self.static_outputs]


__all__ = ["GpuRunner", "XpuRuntimeError"]
