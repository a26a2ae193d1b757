"""cuBLASLt plans through nvmath-python, cached per problem signature, and the conditions they need.

A `GemmPlan` wraps one planned `nvmath.linalg.advanced.Matmul` (heuristic search once), computing
D = A @ B (+ epilogue) into C = the output (beta = 0). Each call only swaps pointers: the fast path
calls cuBLASLt's matmul with the plan's descriptors, the runtime's workspace and the caller's stream
directly (measured on the H100 host: ~17 µs per call, like torch.matmul's ~17-18 µs); where that is
not possible it falls back to nvmath's `reset_operands_unchecked` + `execute` (~51 µs there).

Plans are shared by every stream and thread, so scratch memory never belongs to a plan: a raw launch
uses the workspace the dispatcher lent for its stream, or (lent none, or too small a one) a buffer of
`FALLBACK_WORKSPACES`, also one per (thread, device, stream). nvmath's execute() keeps one workspace per
Matmul object, so a plan orders an execute on one stream after its previous execute on another.

Plans are keyed by everything cuBLASLt's heuristic saw: the call signature (shapes, strides, dtypes,
device, epilogue, compute type: one token per dispatcher plan, made by the launch-config function)
and each pointer's alignment class (nvmath tells the heuristic how aligned the planning call's
pointers were, so a later, less aligned pointer needs its own plan).
"""

from __future__ import annotations

import itertools
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

from ...abi import LaunchConfig, MathMode, TensorSpec
from ...context import DispatchContext
from ...install import pip_hint
from ...runtime.workspace import WorkspaceManager

DTYPES = frozenset({"float16", "bfloat16", "float32"})
ALIGNMENT = 16  # bytes: cuBLASLt's vectorized kernels need 16-byte aligned pointers and leading dims
WORKSPACE_LIMIT = 32 << 20  # what the heuristic may ask for (cuBLAS' own choice on Hopper)
WORKSPACE_BYTES = WORKSPACE_LIMIT + 256  # nvmath adds 16 bytes for epilogues
# Below this estimated GPU time a call is host-bound (~17 µs of host time per call on the fast path,
# ~51 µs through nvmath's execute()), so the kernel declines and cheaper-to-launch kernels run it.
MIN_GPU_US = 8.0
PEAK_TFLOPS = {"float16": 700.0, "bfloat16": 700.0, "float32": 50.0}  # rough H100 rates for the estimate
PEAK_TBPS = 3.0
TILE, SM_COUNT = 64, 132  # a GEMM's output tile side and the H100's SMs, for the estimate's occupancy
MAX_PLANS = 256


def probe() -> str | None:
    """Why cuBLASLt through nvmath-python cannot run here, or None."""
    import torch

    try:
        import nvmath  # noqa: F401
    except ImportError as exc:
        return f"nvmath-python is not installed ({exc}); {pip_hint('cuda')}"
    except Exception as exc:  # present but its CUDA libraries fail to load
        return f"nvmath-python failed to import: {exc!r}"
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    try:
        from nvmath.linalg.advanced import Matmul  # noqa: F401
    except Exception as exc:
        return f"nvmath.linalg.advanced failed to import: {exc!r}"
    return None


# -- conditions ---------------------------------------------------------------------------------------
def pointer_alignment(ptr: int) -> int:
    """The largest power of two (capped at 256) dividing `ptr`: the alignment class in plan keys."""
    return 256 if ptr % 256 == 0 else ptr & -ptr


def matrix_layout(shape: tuple[int, int], strides: tuple[int, int]) -> str | None:
    """'row' or 'col' for a 2-D view cuBLASLt can read with a leading dimension, else None."""
    rows, cols = shape
    if (strides[1] == 1 or cols == 1) and (strides[0] >= max(cols, 1) or rows == 1):
        return "row"
    if (strides[0] == 1 or rows == 1) and (strides[1] >= max(rows, 1) or cols == 1):
        return "col"
    return None


def folded_stride(shape: tuple[int, ...], strides: tuple[int, ...]) -> int | None:
    """The one stride of dims that fold into a single dim (size-1 dims ignored; 0 if none left), else None."""
    dims = [(n, s) for n, s in zip(shape, strides) if n != 1]
    for (_, s_outer), (n_inner, s_inner) in itertools.pairwise(dims):
        if s_outer != s_inner * n_inner:
            return None
    return dims[-1][1] if dims else 0


def collapsed_rows(spec: TensorSpec) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """(M, C) shape and strides of a (..., C) tensor whose leading dims collapse into one, else None."""
    shape, strides = spec.shape, spec.strides
    if len(shape) == 1:
        return (1, shape[0]), (shape[0] * strides[0] if shape[0] else 1, strides[0])
    row_stride = folded_stride(shape[:-1], strides[:-1])
    if row_stride is None:
        return None
    row_stride = row_stride or max(shape[-1], 1)
    m = 1
    for n in shape[:-1]:
        m *= n
    return (m, shape[-1]), (row_stride, strides[-1])


def check_matrix(name: str, spec: TensorSpec, shape: tuple[int, int], strides: tuple[int, int]) -> list[str]:
    """Reasons a 2-D operand view cannot feed cuBLASLt: layout, leading dimension, pointer alignment."""
    layout = matrix_layout(shape, strides)
    if layout is None:
        return [f"'{name}' {spec.shape} with strides {spec.strides} has no unit stride in its last two dims"]
    reasons = []
    ld = strides[0] if layout == "row" else strides[1]
    if shape[0] > 1 and shape[1] > 1 and (ld * spec.itemsize) % ALIGNMENT:
        reasons.append(f"'{name}' leading dimension {ld} is not a multiple of {ALIGNMENT} bytes")
    if spec.ptr % ALIGNMENT:
        reasons.append(f"'{name}' data pointer is not {ALIGNMENT}-byte aligned (offset view?)")
    return reasons


def check_common(ctx: DispatchContext) -> list[str]:
    """dtype and math mode: fp16/bf16 (fp32 accumulation) and fp32 (full, or TF32 under math_mode tf32)."""
    if ctx.dtype == "float32" and ctx.math_mode not in (MathMode.FP32, MathMode.TF32):
        return [f"float32 runs as fp32 or tf32, policy asks math_mode {ctx.math_mode.value}"]
    return []


def estimated_gpu_us(dtype: str, m: int, n: int, k: int, nbytes: int) -> float:
    """Roofline estimate of a GEMM's device time (µs), the peak rate scaled by the share of the SMs that its
    output tiles can keep busy: a (128, 768) fp32 output is 24 tiles of 64x64 on 132 SMs, and runs for
    ~12-25 µs on an H100 where the unscaled roofline said 3 (cuBLAS at BERT's and GPT-2's B1 shapes,
    benchmarks/probes/fp32_gemm_gpu.py)."""
    busy = min(1.0, math.ceil(m / TILE) * math.ceil(n / TILE) / SM_COUNT)
    return max(2.0 * m * n * k / (PEAK_TFLOPS.get(dtype, 50.0) * 1e6 * busy), nbytes / (PEAK_TBPS * 1e6))


def check_size(ctx: DispatchContext, m: int, n: int, k: int) -> list[str]:
    """Reject problems so small that the library's host cost would dominate (and empty ones)."""
    if min(m, n, k) == 0:
        return [f"empty problem (M={m}, N={n}, K={k}); nothing for cuBLASLt to do"]
    nbytes = sum(t.nbytes for t in ctx.tensors)
    est = estimated_gpu_us(ctx.dtype, m, n, k, nbytes)
    if est < MIN_GPU_US:
        return [f"problem too small: ~{est:.1f} µs on the GPU < {MIN_GPU_US:g} µs of cuBLASLt host cost per call"]
    return []


def compute_type_name(dtype: str, math_mode: MathMode) -> str | None:
    """nvmath compute type name: TF32 tensor cores for fp32 only when the policy allows it."""
    if dtype == "float32":
        return "COMPUTE_32F_FAST_TF32" if math_mode is MathMode.TF32 else "COMPUTE_32F"
    return None  # nvmath's default for fp16/bf16: fp32 accumulation


def gemm_launch_config(ctx: DispatchContext) -> LaunchConfig:
    """cuBLASLt picks grid and tiles itself. The config carries the compute type and a token naming this
    call signature (shapes, strides, dtypes, device, attributes), so that a launch finds its cuBLASLt
    plan from the token and the pointers' alignment classes alone, without building views or keys."""
    return LaunchConfig(params={"compute_type": compute_type_name(ctx.dtype, ctx.math_mode), "token": object()})


# -- plans --------------------------------------------------------------------------------------------
def fast_key(args: Any, *ptrs: int) -> tuple:
    """Hot-path plan key: the call signature's token and each pointer's alignment class."""
    return (args.config.params["token"], *map(pointer_alignment, ptrs))


def launch_cached(args: Any, ptrs: tuple) -> tuple[tuple, bool]:
    """(plan key, launched?): the hot path, a launch straight from pointers when a raw plan exists for
    this call signature and these alignment classes."""
    key = fast_key(args, *ptrs)
    plan = PLANS.peek(key)
    if plan is not None and plan.raw:
        plan.launch(*ptrs, workspace=args.workspace, stream=args.stream)
        return key, True
    return key, False


class PlanCache:
    """LRU of GemmPlans keyed by problem signature; evicted plans free their cuBLASLt resources."""

    def __init__(self, capacity: int = MAX_PLANS) -> None:
        self.capacity = capacity
        self._plans: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def peek(self, key: Hashable) -> Any:
        """The plan for `key`, or None (the launch hot path: one dict lookup)."""
        plan = self._plans.get(key)
        if plan is not None:
            self.hits += 1
            try:  # noqa: SIM105 (contextlib.suppress costs ~0.3 µs more, on every launch)
                self._plans.move_to_end(key)
            except KeyError:  # evicted by another thread meanwhile
                pass
        return plan

    def get(self, key: Hashable, build: Callable[[], Any]) -> Any:
        plan = self.peek(key)
        if plan is not None:
            return plan
        with self._lock:
            plan = self._plans.get(key)
            if plan is None:
                self.misses += 1
                plan = self._plans[key] = build()
                while len(self._plans) > self.capacity:
                    _, old = self._plans.popitem(last=False)
                    old.free()
            return plan

    def __len__(self) -> int:
        return len(self._plans)

    def clear(self) -> None:
        with self._lock:
            for plan in self._plans.values():
                plan.free()
            self._plans.clear()


PLANS = PlanCache()


def resolve_stream(stream: Any) -> Any:
    """`stream`, or the current torch stream for None."""
    if stream is None:
        import torch

        stream = torch.cuda.current_stream()
    return stream


def stream_handle(stream: Any) -> int:
    """A raw cudaStream_t from a torch stream (or the current one)."""
    return int(resolve_stream(stream).cuda_stream)


# Scratch for raw launches the dispatcher lent no workspace, or too small a one: one buffer per (thread,
# device, stream), grown on demand and shared by every plan, never by two streams.
FALLBACK_WORKSPACES = WorkspaceManager()


def empty_on_stream(shape: tuple[int, ...], dtype: str, device: str, stream: Any) -> Any:
    """A uint8 buffer allocated on `stream` itself: when a grown buffer replaces it, the caching allocator
    hands its memory out again only in that stream's order (the only stream that used it)."""
    import torch

    with torch.cuda.stream(stream):
        return torch.empty(shape, dtype=torch.uint8, device=device)


def fallback_workspace(nbytes: int, device: str, stream: Any) -> Any:
    """`nbytes` of scratch for work queued on `stream` (a resolved stream, not None)."""
    return FALLBACK_WORKSPACES.lend(nbytes, device, empty_on_stream, stream)


class GemmPlan:
    """One planned cuBLASLt matmul: D = A @ B (+ epilogue) written into C (the output, beta = 0).

    Preferred form: planned on A and B alone (what nvmath plans best), launched directly with D = C
    when nvmath's result layout is C's. Else planned in place on C; raw launches where this nvmath
    exposes its descriptors, its own execute() otherwise.
    """

    def __init__(self, a: Any, b: Any, c: Any, epilog: str | None, epilog_inputs: dict | None,
                 compute_type: str | None, stream: Any, raw: bool = True, ab_only: bool = True) -> None:  # fmt: skip
        self.epilog = epilog
        self.device = str(c.device)  # where a fallback workspace goes, if a launch is lent none
        self._lock = threading.Lock()
        self._pointers: dict[str, int] = {}
        # streams of nvmath's own workspace (execute() path): where it was allocated, where it was last used
        self._alloc_stream: Any = None
        self._exec_stream: Any = None
        self.mm, self.raw, self.inplace = None, False, False
        if raw and ab_only:
            mm = self._make(a, b, None, epilog, epilog_inputs, compute_type, stream)
            traits = mm.result_traits
            if (tuple(traits.result_shape), tuple(traits.result_strides)) == (tuple(c.shape), c.stride()) and (
                self._prepare_raw(mm, a, b)
            ):
                self.mm, self.raw = mm, True
            else:
                mm.free()
        if self.mm is None:
            self.mm = self._make(a, b, c, epilog, epilog_inputs, compute_type, stream)
            self.inplace = True
            self.raw = raw and self._prepare_raw(self.mm, a, b)
        self.workspace_size = int(self.mm.workspace.size)
        self.mm.release_operands()  # hold no caller tensors; every call passes all operands again

    @staticmethod
    def _make(a: Any, b: Any, c: Any, epilog: str | None, epilog_inputs: dict | None, compute_type: str | None,
              stream: Any) -> Any:  # fmt: skip
        import nvmath.linalg.advanced
        from nvmath.linalg.advanced import Matmul, MatmulEpilog

        options: dict[str, Any] = {"memory_limit": WORKSPACE_LIMIT, "inplace": c is not None}
        if compute_type is not None:
            options["compute_type"] = getattr(nvmath.linalg.advanced.MatmulComputeType, compute_type)
        mm = Matmul(a, b, c=c, beta=None if c is None else 0.0, options=options, stream=stream)
        mm.plan(epilog=getattr(MatmulEpilog, epilog) if epilog else None, epilog_inputs=epilog_inputs, stream=stream)
        return mm

    def _prepare_raw(self, mm: Any, a: Any, b: Any) -> bool:
        """Keep what cuBLASLt's matmul needs, if this nvmath exposes it and kept the operand order."""
        try:
            from nvmath.bindings import cublasLt

            ops = mm.operands
            if ops[0].data_ptr != a.data_ptr() or ops[1].data_ptr != b.data_ptr():
                return False
            self._matmul = cublasLt.matmul
            self._args = (
                mm.handle, mm.mm_desc, mm.alpha.ctypes.data, mm.a_layout_ptr, mm.b_layout_ptr, mm.beta.ctypes.data,
                mm.c_layout_ptr, mm.d_layout_ptr, mm.cached_best_algorithm_struct.ctypes.data,
            )  # fmt: skip
            self._desc = mm.mm_desc_ifc
        except (AttributeError, ImportError, TypeError):
            return False
        return True

    def entry_args(self) -> tuple[int, ...] | None:
        """What C++ needs to launch this raw in-place plan itself: (cublasLtMatmul, its descriptor's
        SetAttribute, the BIAS_POINTER attribute, handle, descriptor, alpha, A layout, B layout, beta, C layout,
        D layout, algorithm, workspace bytes) as integers; None where this nvmath hides its entry points."""
        if not (self.raw and self.inplace):
            return None
        try:
            from nvmath.bindings import cublasLt
            from nvmath.bindings._internal import cublasLt as loaded

            entry = {name.lstrip("_"): int(ptr) for name, ptr in loaded._inspect_function_pointers().items()}
            functions = (entry["cublasLtMatmul"], entry["cublasLtMatmulDescSetAttribute"])
        except (ImportError, AttributeError, KeyError, TypeError, ValueError):
            return None
        if not all(functions):
            return None
        attribute = int(cublasLt.MatmulDescAttribute.BIAS_POINTER)
        return (*functions, attribute, *(int(arg) for arg in self._args), self.workspace_size)

    def _set_pointer(self, attribute: str, ptr: int) -> None:
        if self._pointers.get(attribute) != ptr:
            setattr(self._desc, attribute, ptr)
            self._pointers[attribute] = ptr

    def run(self, a: Any, b: Any, c: Any, *, bias: Any = None, aux: Any = None, bgrad: Any = None,
            workspace: Any = None, stream: Any = None) -> None:  # fmt: skip
        """Compute into `c` with new operands; `bias`/`aux` are epilogue inputs, `bgrad` an epilogue output."""
        if not self.raw:
            self._execute(a, b, c, bias, aux, bgrad, stream)
            return
        epilogue = (bias if bias is not None else bgrad, aux)
        bias_ptr, aux_ptr = (0 if t is None else t.data_ptr() for t in epilogue)
        self.launch(a.data_ptr(), b.data_ptr(), c.data_ptr(), bias_ptr, aux_ptr, workspace, stream)

    def launch(self, a_ptr: int, b_ptr: int, c_ptr: int, bias_ptr: int = 0, aux_ptr: int = 0,
               workspace: Any = None, stream: Any = None) -> None:  # fmt: skip
        """The hot path (raw plans only): cuBLASLt matmul on raw pointers. `bias_ptr` is the bias input or
        the bias-gradient output, `aux_ptr` the GELU input; 0 where the epilogue has none. `workspace`
        must be scratch for `stream` alone (the dispatcher lends one per stream); without one large
        enough the launch takes `stream`'s fallback buffer, never one that another stream uses."""
        if self.workspace_size and (workspace is None or workspace.numel() < self.workspace_size):
            stream = resolve_stream(stream)
            workspace = fallback_workspace(self.workspace_size, self.device, stream)
        handle, desc, alpha, a_layout, b_layout, beta, c_layout, d_layout, algo = self._args
        with self._lock:
            if bias_ptr:
                self._set_pointer("bias_pointer", bias_ptr)
            if aux_ptr:
                self._set_pointer("epilogue_aux_pointer", aux_ptr)
            self._matmul(handle, desc, alpha, a_ptr, a_layout, b_ptr, b_layout, beta,
                         c_ptr if self.inplace else 0, c_layout, c_ptr, d_layout, algo,
                         workspace.data_ptr() if self.workspace_size else 0, self.workspace_size,
                         stream_handle(stream))  # fmt: skip

    def _execute(self, a: Any, b: Any, c: Any, bias: Any, aux: Any, bgrad: Any, stream: Any) -> None:
        """nvmath's own path: swap operands, execute (it allocates its workspace and epilogue outputs).

        nvmath keeps one workspace per Matmul and leaves ordering between streams to the caller: an
        execute on another stream than the previous one first waits for the work queued on that one."""
        inputs = {}
        if bias is not None:
            inputs["bias"] = bias
        if aux is not None:
            inputs["gelu_aux"] = aux
        stream = resolve_stream(stream)
        with self._lock:
            if self._exec_stream is None:
                self._alloc_stream = stream  # nvmath allocates its workspace on the first execute's stream
            elif self._exec_stream != stream:
                stream.wait_stream(self._exec_stream)
            self._exec_stream = stream
            self.mm.reset_operands_unchecked(a=a, b=b, c=c, epilog_inputs=inputs or None, stream=stream)
            result = self.mm.execute(stream=stream)
        if bgrad is not None:
            bgrad.copy_(result[1][self.epilog.lower()].reshape(bgrad.shape))

    def free(self) -> None:
        with self._lock:
            if self._exec_stream is not None and self._exec_stream != self._alloc_stream:
                # the workspace returns to its allocation stream's pool: reuse there must wait for its last use
                self._alloc_stream.wait_stream(self._exec_stream)
            self.mm.free()
