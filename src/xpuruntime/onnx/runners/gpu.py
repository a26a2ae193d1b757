"""The GPU runner: PyTorch CUDA tensors through the same planner and dispatcher, and one CUDA graph
captured per static input signature and replayed afterwards.

Kernel steps launch the kernels the selector chose (Triton, cuBLASLt, PyTorch's) on the current stream;
the remaining nodes run as their op records' PyTorch functions. Constants move to the device once, when
the plan is made; the inputs an op record reads on the host (Reshape targets, axes, Slice bounds) stay
there.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ...graph.ir import Graph, Node
from ..errors import UnsupportedModelError
from ..executor import ExecutionPlan, Planner, Step
from ..feeds import check_arrays, check_tensors
from ..ops import OPS
from ..ops.conv import wants_channels_last
from ..ops.record import F, as_tensor, on_host, torch, torch_dtype
from .base import GraphVariant, Runner

try:
    import torch as _torch_module
except ImportError:  # the CPU path never imports this module
    _torch_module = None


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
    program, dtype = node.attrs["program"], torch_dtype(node.attrs["dtype"])
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
    """An xrt node (made by the fusion passes) with PyTorch ops, for when no kernel of ours can run it."""
    at = node.attrs
    if node.op == "fused_elementwise":
        return _fused_fallback(node)
    if node.op == "attention":

        def attention(q: Any, k: Any, v: Any, mask: Any = None) -> Any:
            if mask is not None and mask.dim() < 2:  # SDPA wants a mask with (L, S) dims
                mask = mask.reshape(*(1,) * (2 - mask.dim()), *mask.shape)
            grouped = {"enable_gqa": True} if at.get("enable_gqa") else {}
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=bool(at.get("is_causal")), scale=at.get("scale"), **grouped
            )

        return attention
    if node.op == "linear":
        act = {"relu": torch.relu, "gelu": lambda z: F.gelu(z, approximate="tanh")}.get(at.get("activation"))
        return lambda x, w, b=None: act(F.linear(x, w, b)) if act else F.linear(x, w, b)
    if node.op == "layer_norm":
        return lambda x, w=None, b=None: F.layer_norm(x, tuple(at["normalized_shape"]), w, b, at.get("eps", 1e-5))
    if node.op == "rms_norm":
        return lambda x, w=None: F.rms_norm(x, tuple(at["normalized_shape"]), w, at.get("eps"))
    if node.op == "add_layer_norm":
        return lambda x, r, w=None, b=None: _add_then(x, r, lambda h: F.layer_norm(h, h.shape[-1:], w, b, at["eps"]))
    if node.op == "add_rms_norm":
        return lambda x, r, w=None: _add_then(x, r, lambda h: F.rms_norm(h, h.shape[-1:], w, at.get("eps")))
    if node.op == "rotary_embedding" and not at.get("interleaved") and at.get("unsqueeze_dim", 1) == 1:
        return _rotary_packed
    raise UnsupportedModelError(f"{node.describe()}: no GPU fallback for xrt op '{node.op}'")


def _rotary_packed(q: Any, k: Any, cos: Any, sin: Any) -> Any:
    """rotary_embedding's packed [q_embed | k_embed] by Hugging Face's rotate-half formula."""
    from ...backends.torch.rotary import rotation

    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return torch.cat([rotation(x, cos, sin, False, False).reshape(-1) for x in (q, k)])


def _add_then(x: Any, residual: Any, norm: Callable[[Any], Any]) -> tuple[Any, Any]:
    """(norm(h), h) for h = x + residual: an add-norm node's two outputs."""
    h = x + residual
    return norm(h), h


class GpuPlanner(Planner):
    """The planner with device tensors: constants move to the device once, non-kernel steps use the op
    records' PyTorch functions."""

    wrap = staticmethod(lambda x: x)
    step_kind = "torch"
    transposed_outputs = True

    def __init__(self, *args: Any, device: Any, constants: dict, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.device = device
        self.constants = constants  # value name -> device tensor, shared by the runner's plans of one variant
        self._layouts: tuple | None = None  # (row-major slot, column-major slot), static: for the next _make_step

    def function(self, node: Node) -> Callable:
        record = OPS[node.op]
        if record.torch is None:  # as onnxruntime falls back to its CPU provider: correct, not fast
            return on_host(record.numpy, self.device)(node, self.graph.opset)
        fn = record.torch(node, self.graph.opset)
        if all(p in record.host_inputs for p in range(len(node.inputs))):
            return _on_device(fn, self.device)  # made from host values alone (Range, ConstantOfShape)
        return fn

    def _op_map_step(self, node: Node, ins: tuple, outs: tuple, note: str) -> Step:
        step = super()._op_map_step(node, ins, outs, note)
        if not node.domain and OPS[node.op].torch is None:
            step.note = "; ".join(filter(None, ["on the host: the op has no PyTorch function", step.note]))
        return step

    def _moved(self, node: Node, ins: tuple, values: list, static: set, slot: Callable) -> tuple:
        """The node's input slots with its constants moved to the device (once per runner for initializers)."""
        host = OPS[node.op].host_inputs if not node.domain else frozenset()
        moved = []
        for position, (name, index) in enumerate(zip(node.inputs, ins)):
            value = values[index]
            if index in static and isinstance(value, np.ndarray) and position not in host and name:
                nhwc = not node.domain and position in OPS[node.op].channels_last_inputs
                device_name = f"{name}@{self.device}" + ("/channels_last" if nhwc else "")
                index = slot(device_name)
                if values[index] is None:  # initializers move once per runner, shape-derived values per plan
                    tensor = self.constants.get(device_name)
                    if tensor is None:
                        tensor = as_tensor(value, self.device)
                        if nhwc and wants_channels_last(tensor):
                            tensor = tensor.contiguous(memory_format=torch.channels_last)
                        if name in self.graph.initializers:
                            self.constants[device_name] = tensor
                    values[index] = tensor
                    static.add(index)
            moved.append(index)
        return tuple(moved)

    def _make_step(self, node: Node, ins: tuple, outs: tuple, args: list, values: list) -> Step:
        """The kernel step; for a long `linear` (see _layout_matters) the faster of its constant weight row-major
        (N, K) and column-major, timed on the plan's own inputs, the other layout's tensor dropped."""
        step = super()._make_step(node, ins, outs, args, values)
        layouts, self._layouts = self._layouts, None
        if layouts is None or step.kind != "kernel":
            return step
        (row, column), static = layouts
        column_ins = tuple(column if i == row else i for i in ins)
        try:
            other = super()._make_step(node, column_ins, outs, [values[i] for i in column_ins], values)
            faster = other.kind == "kernel" and self._time(other, values) < self._time(step, values)
        except Exception:  # a launch that fails is the first run's to report and fall back from
            faster = False
        unused = row if faster else column
        if faster:
            self.constants[self._column_name(node)] = values[column]
            if any(n is not node for n in self._readers.get(node.inputs[1], [])):  # graph.consumers() of the build
                return other  # another node reads the weight row-major: kept
            self.constants.pop(f"{node.inputs[1]}@{self.device}", None)
        values[unused] = None  # the plan's template keeps one layout's tensor only
        static.discard(unused)
        return other if faster else step

    def _device_inputs(self, node: Node, ins: tuple, values: list, static: set, slot: Callable) -> tuple:
        """The moved inputs; for a long linear also its weight column-major in a slot of its own, both slots
        remembered for _make_step to time."""
        moved = self._moved(node, ins, values, static, slot)
        self._layouts = None
        if _layout_matters(node, moved, values):
            name = self._column_name(node)
            index = slot(name)
            if values[index] is None:
                cached = self.constants.get(name)
                values[index] = cached if cached is not None else values[moved[1]].t().contiguous().t()
                static.add(index)
            self._layouts = ((moved[1], index), static)
        return moved

    def _column_name(self, node: Node) -> str:
        return f"{node.inputs[1]}@{self.device}/column_major"

    def _time(self, step: Step, values: list) -> float:
        """A kernel step's time a run on the device, from LAYOUT_RUNS runs queued back to back after a warm-up
        (which builds the library's plan)."""
        step.run(values)
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        for _ in range(LAYOUT_RUNS):
            step.run(values)
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    def _fallback_step(self, node: Node, ins: tuple, outs: tuple, note: str) -> Step:
        fn = _xrt_fallback(node)
        (o,) = outs[:1]

        def run(env: list) -> None:
            result = fn(*[env[i] for i in ins])
            if isinstance(result, tuple):  # an add-norm's (y, h)
                for slot, value in zip(outs, result):
                    env[slot] = value
            else:
                env[o] = result

        step = Step(node, "torch", ins, outs, fn=fn, note=f"PyTorch fallback; {note}"[:300])
        step.run = run
        return step


LAYOUT_FLOPS = 4e9  # a linear of at least this many flops on CUDA tries its constant weight in both layouts
LAYOUT_RUNS = 5


def _layout_matters(node: Node, moved: tuple, values: list) -> bool:
    """Whether a `linear` node's constant (N, K) weight is worth timing column-major too: cuBLAS picks its kernel by
    the operands' layout, and neither layout wins at every shape (fp32 on an H200, device us a call at 4096 rows,
    benchmarks/probes/fp32_gemm_gpu.py: 768 -> 2304 380 row-major, 345 column-major through addmm; 768 -> 3072 391
    and 411). Chosen so, GPT-2 fp32 at B8 S512 went from 0.977x to 1.01x torch.compile.
    Only GEMMs long enough that back-to-back runs keep the GPU busy, so that their timing is the device's."""
    if node.op != "linear" or node.domain != "xrt" or len(moved) < 2:
        return False
    x, weight = values[moved[0]], values[moved[1]]
    if not (torch is not None and isinstance(weight, torch.Tensor) and weight.is_cuda and weight.dim() == 2):
        return False
    n, k = weight.shape
    return weight.is_contiguous() and 2 * (x.numel() // max(k, 1)) * n * k >= LAYOUT_FLOPS


def _on_device(fn: Callable, device: Any) -> Callable:
    def run(*args: Any) -> Any:
        result = fn(*args)
        return tuple(r.to(device) for r in result) if isinstance(result, tuple) else result.to(device)

    return run


class GpuRunner(Runner):
    """Runs on a CUDA device (or, for tests, any PyTorch device), one plan and CUDA graph per signature."""

    provider = "CUDAExecutionProvider"

    def __init__(self, *args: Any, device: str, graph: Graph, **kwargs: Any) -> None:
        """`graph`: the session's optimized graph, checked here for what the GPU path cannot run."""
        super().__init__(*args, **kwargs)
        if _torch_module is None:
            raise UnsupportedModelError("InferenceSession(device='cuda') needs PyTorch with CUDA")
        self.device = _torch_module.device(device)
        if self.device.type == "cuda" and not _torch_module.cuda.is_available():
            raise UnsupportedModelError(f"InferenceSession: device '{device}' requested but CUDA is not available")
        _check_graph(graph)
        self.constants: dict[frozenset, dict[str, Any]] = {}  # per graph variant: passes name constants per graph

    def run(self, variant: GraphVariant, feed: Mapping[str, Any]) -> list:
        tensors, numpy_out = self._tensors(variant, feed)
        key = self.key(variant, [(t.dtype, tuple(t.shape)) for t in tensors])
        entry = self.cache.get(key)
        if entry is None:
            entry = self._build(variant, tensors)
            self.cache.put(key, entry, entry.nbytes)
            outputs, entry.first = entry.first, None
        else:
            outputs = entry.run(tensors)
        return [o.cpu().numpy() if numpy_out and hasattr(o, "cpu") else o for o in outputs]

    def plan(self, variant: GraphVariant, feed: Mapping[str, Any]) -> ExecutionPlan:
        self.run(variant, feed)
        return self.last_plan()

    def plans(self) -> list[ExecutionPlan]:
        return [entry.plan for entry in self.cache.values()]

    def last_plan(self) -> ExecutionPlan | None:
        last = self.cache.last()
        return None if last is None else last.plan

    def status(self) -> str:
        last = self.cache.last()
        return "" if last is None else last.note

    def _tensors(self, variant: GraphVariant, feed: Mapping[str, Any]) -> tuple[list[Any], bool]:
        """Device tensors in the variant's input order, and whether the caller passed NumPy (then results go
        back as NumPy)."""
        values = list(feed.values())
        if values and all(isinstance(v, _torch_module.Tensor) for v in values):
            return [t.to(self.device).contiguous() for t in check_tensors(variant.inputs, feed)], False
        arrays = check_arrays(variant.inputs, feed)
        return [as_tensor(a, self.device, non_blocking=True) for a in arrays], True

    def _build(self, variant: GraphVariant, tensors: list[Any]) -> GpuPlanEntry:
        _check_graph(variant.graph)
        constants = self.constants.setdefault(variant.fed, {})
        before = self._allocated()
        with self.lock, self.policy_scope():
            planner = GpuPlanner(variant.graph, self.dispatcher, self.fns, False, self.tensor_limit(),
                                 device=self.device, constants=constants)  # fmt: skip
            plan, outputs = planner.build({v.name: t for v, t in zip(variant.inputs, tensors)})
        entry = GpuPlanEntry(plan, [o.clone() if hasattr(o, "clone") else o for o in outputs])
        if self.options.enable_cuda_graph and self.device.type == "cuda" and not plan.varying:
            entry.capture(tensors, self.dispatcher.workspaces)
        entry.nbytes = max(self._allocated() - before, 0)
        return entry

    def device_memory(self) -> int:
        if self.device.type != "cuda":
            return super().device_memory()
        return int(_torch_module.cuda.get_device_properties(self.device).total_memory)

    def _allocated(self) -> int:
        if self.device.type != "cuda":
            return 0
        return int(_torch_module.cuda.memory_allocated(self.device))


def _check_graph(graph: Graph) -> None:
    dtypes = {v.dtype for v in (*graph.inputs, *graph.outputs, *graph.values.values())}
    dtypes |= {a.dtype.name for a in graph.initializers.values()}
    wide_unsigned = sorted(d for d in dtypes if d in ("uint16", "uint32", "uint64"))
    if wide_unsigned:
        raise UnsupportedModelError(f"dtypes without GPU support in PyTorch: {', '.join(wide_unsigned)}")


class GpuPlanEntry:
    """One signature's plan, and its captured CUDA graph (None when capture failed or is off)."""

    def __init__(self, plan: ExecutionPlan, first: list) -> None:
        self.plan = plan
        self.first: list | None = first
        self.graph: Any = None
        self.note = "CUDA graph off"
        self.nbytes = 0
        self.static_inputs: list[Any] = []
        self.static_outputs: list[Any] = []
        self.lock = threading.Lock()  # one replay at a time: the graph's inputs and outputs are shared

    def capture(self, feeds: list[Any], workspaces: Any) -> None:
        """Capture the plan on copies of `feeds`. Workspaces lent while capturing are fresh buffers of the
        graph's own pool (`workspaces.per_call()`): a slice of the dispatcher's cached buffer would be freed
        when a later call grows that buffer, and every replay would write into memory no longer the graph's
        (an illegal address once the allocator gave it back to the driver)."""
        cuda = _torch_module.cuda
        try:
            self.static_inputs = [t.clone() for t in feeds]
            side = cuda.Stream()
            side.wait_stream(cuda.current_stream())
            with cuda.stream(side):
                for _ in range(2):  # warm-up outside capture: JIT compiles, library handles, workspaces
                    self.plan.run(self.static_inputs)
            cuda.current_stream().wait_stream(side)
            graph = cuda.CUDAGraph()
            with cuda.graph(graph), workspaces.per_call():
                self.static_outputs = self.plan.run(self.static_inputs)
            self.graph, self.note = graph, "CUDA graph captured"
        except Exception as exc:  # capture is an optimization: run eagerly and say why
            self.graph, self.note = None, f"CUDA graph capture failed ({type(exc).__name__}: {str(exc)[:200]}); eager"
            with contextlib.suppress(Exception):  # a broken capture may leave an error behind on the stream
                cuda.synchronize()

    def run(self, feeds: list[Any]) -> list:
        if self.graph is None:
            return self.plan.run(feeds)
        with self.lock:
            for static, new in zip(self.static_inputs, feeds):
                static.copy_(new, non_blocking=True)
            self.graph.replay()
            return [o.clone() if hasattr(o, "clone") else o for o in self.static_outputs]
