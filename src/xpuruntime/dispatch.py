"""The dispatcher: call signature -> plan (cached) -> launch, with logging and profiling hooks.

The hot path on a plan-cache hit is: read the policy, build the signature key, one dict lookup,
allocate the output, launch. Validation, selection, launch-config and workspace sizing happen only on
a miss, because the key fixes everything they depend on. Once xpuruntime's C++ extension is loaded, a hit
without out= runs in C from the key to the launch (runtime/hot_path.cpp); the Python below is its reference
and serves everything else. A kernel declared `returns_output=True` allocates its own output: without
`out=` nothing is allocated here and its return value is the result.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Hashable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

from numpy import ndarray

from . import arguments
from .abi import ArgPack, SyncPolicy, itemsize
from .arguments import attr_values, fill_inputs, has_cpu_tensor, normalize_call
from .arrays import NotAnArray, check_out_autograd, is_cpu_tensor, is_torch_tensor, mark_written
from .context import DispatchContext, build_context
from .errors import ArgumentError, KernelFallbackWarning, LaunchError, OutOfMemoryError, PolicyError, XpuRuntimeError
from .log import OBSERVERS, DispatchEvent, DispatchRecord
from .plan import Plan, PlanCache
from .policy import KernelPolicy, current_policy
from .registry import Backend, KernelSpec, Registry, default_registry, no_stream
from .runtime import extension
from .runtime.capacity import check_bytes, check_fits
from .runtime.launch_capture import CAPTURE
from .runtime.workspace import WorkspaceManager
from .selector import Decision, Scorer, Selector, default_scorer

if TYPE_CHECKING:
    from .explanation import Explanation

_MAX_WARNED = 10_000
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_events = threading.local()


class _Launching(threading.local):
    depth = 0


# The plan-cache hit of a call without out= in C (runtime/hot_path.cpp), set when xpuruntime's C++ extension
# loads: (cache, entries, op, fingerprint, attrs, inputs) -> the output, or NOT_HIT where Python must run
# the call (a miss, a key only Python can build, a plan whose `hit_path` is None)
NOT_HIT = object()
_hit_in_c: Callable[..., Any] | None = None


def _use_c_hit_path(module: ModuleType) -> None:
    """Run plan-cache hits through the C++ extension's `plan_hit` from now on (runtime/extension.py)."""
    global _hit_in_c
    module.use_dispatcher(NOT_HIT, NotAnArray, ArgPack, _launch_error, _returned_output)
    _hit_in_c = module.plan_hit


# > 0 while this thread runs or tunes kernels the dispatcher chose: a framework front end (the PyTorch
# overrides) hands the framework calls those kernels make straight to the framework, never back here.
# Launches count only while a front end listens (`track_launches`); plan misses (tuning) always count.
LAUNCHING = _Launching()
_tracking = False


def track_launches(on: bool) -> None:
    """Count launches in LAUNCHING.depth (a front end that intercepts framework calls turns this on)."""
    global _tracking
    _tracking = on


def last_event() -> Any:
    """The event recorded after this thread's last launch under SyncPolicy.EVENT_RECORD (None before
    any): `xrt.last_event().synchronize()` waits for that kernel."""
    return getattr(_events, "last", None)


def _stacklevel_outside_package() -> int:
    """The `warnings.warn` stacklevel of the first caller outside xpuruntime (the user's line)."""
    frame, level = sys._getframe(2), 2  # 1 = our caller (which calls warnings.warn)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR + os.sep):
        frame, level = frame.f_back, level + 1
    return level


class Dispatcher:
    """Runs ops through registry, selector and plan cache. Most code uses the process-wide one."""

    def __init__(
        self, registry: Registry | None = None, *, scorer: Scorer = default_scorer, plan_cache_size: int = 4096
    ) -> None:
        self.registry = registry if registry is not None else default_registry()
        self.selector = Selector(self.registry, scorer)
        self.plans = PlanCache(plan_cache_size)
        self.workspaces = WorkspaceManager()
        self._warned: set[Hashable] = set()
        # (op, policy fingerprint) of every plan made as a fallback: asking whether a call's plan fell
        # back needs no plan key for the pairs not in here (the PyTorch front end asks in each backward)
        self.fallbacks: set[tuple[str, Hashable]] = set()
        self.registry.on_change(self.plans.invalidate)

    # -- the hot path ------------------------------------------------------------------------
    def run(
        self, op: str, inputs: tuple, attrs: tuple = (), out: Any = None, policy: KernelPolicy | None = None
    ) -> Any:
        """Run `op` on `inputs` and `attrs` (positional, in the schema's order); returns the output.
        `policy` overrides the one in force here (the PyTorch front end passes a backward's saved policy)."""
        if policy is None:
            policy = current_policy()
        if out is None and _hit_in_c is not None and not (OBSERVERS or _tracking or CAPTURE.capture):
            result = _hit_in_c(self.plans, self.plans.entries, op, policy.fingerprint, attrs, inputs)
            if result is not NOT_HIT:
                return result
        start = time.perf_counter_ns() if OBSERVERS else 0
        try:
            key = arguments.plan_key(op, policy.fingerprint, attrs, inputs, out)
            plan = self.plans.get(key)
        except (NotAnArray, TypeError):
            return self._run_converted(op, inputs, attrs, out, policy)
        hit = plan is not None
        if plan is None:  # tuning launches kernels: nested framework calls go to the framework
            plan = _tracked(self._plan_miss, op, inputs, attrs, out, policy, key)
        if CAPTURE.capture is not None:
            CAPTURE.capture.plans.append(plan)
        stream = None if plan.current_stream is None else plan.current_stream(plan.device)
        tensor_out = out is not None and type(out) is not ndarray  # a PyTorch tensor: autograd's rules apply
        if plan.schema.buffers:
            plan.schema.check_buffers(inputs)
        if out is not None:
            plan.schema.check_layout(inputs, out)
            if tensor_out:
                check_out_autograd(op, plan.schema.inputs, inputs, out)
        elif not plan.returns_output:
            out = plan.allocate(stream)
        launch_start = time.perf_counter_ns() if start else 0
        workspace = (
            self.workspaces.lend(plan.workspace_bytes, plan.device, plan.empty, stream)
            if plan.workspace_bytes
            else None
        )
        args = ArgPack(inputs, out, plan.attrs, plan.config, workspace, stream)
        try:
            returned = _tracked(plan.launch, args) if _tracking else plan.launch(args)
            if plan.finish is not None:
                plan.finish(stream)
        except Exception as exc:
            raise _launch_error(plan, exc) from exc
        if out is None:  # a returns_output kernel called without out=: its return value is the result
            out = _returned_output(plan, returned) if hit else checked_output(plan, returned)
        elif tensor_out:
            mark_written(out)
        if plan.schema.buffers:
            plan.schema.mark_buffers_written(inputs)
        if start:
            _notify_observers(plan, hit, start, launch_start)
        return out

    # -- misses ------------------------------------------------------------------------------
    def _run_converted(self, op: str, inputs: tuple, attrs: tuple, out: Any, policy: KernelPolicy) -> Any:
        """Slow path: convert array-likes, NumPy scalars, unhashable attributes and CPU tensors (to NumPy
        views of their memory), run, and give callers what they passed in: their own `out`, or for CPU
        tensors a CPU tensor sharing the result's memory."""
        schema = self.registry.op(op)
        if out is not None and is_torch_tensor(out):  # before a CPU tensor becomes a NumPy view without autograd
            check_out_autograd(op, schema.inputs, inputs, out)
        if schema.buffers:
            schema.check_buffers(inputs)
        inputs_, attrs_, out_ = normalize_call(schema, inputs, attrs, out)
        try:
            hash(arguments.plan_key(op, 0, attrs_, inputs_, out_))
        except (NotAnArray, TypeError) as exc:  # never loop: normalized arguments must make a key
            raise ArgumentError(f"{op}: arguments cannot be dispatched ({type(exc).__name__}: {exc})") from None
        result = self.run(op, inputs_, attrs_, out_, policy)
        if schema.buffers:  # CPU tensors among the buffers were written through NumPy views of their memory
            schema.mark_buffers_written(tuple(x if is_cpu_tensor(x) else None for x in inputs))
        if out is not None:
            if out_ is not out and is_torch_tensor(out):  # written through a NumPy view of its memory
                mark_written(out)
            return out
        if not has_cpu_tensor(inputs, None):
            return result
        from_numpy = sys.modules["torch"].from_numpy
        return tuple(map(from_numpy, result)) if isinstance(result, tuple) else from_numpy(result)

    def _plan_miss(self, op: str, inputs: tuple, attrs: tuple, out: Any, policy: KernelPolicy, key: Hashable) -> Plan:
        generation = self.registry.generation
        decision = self.decide(op, inputs, attrs, out, policy)
        if decision.reason == "fallback":
            self.fallbacks.add((op, policy.fingerprint))
            self._warn_fallback(decision, key)
        elif decision.reason == "auto" and policy.tunes(op):
            from .autotune import tune

            decision = tune(self, decision, inputs, policy)
        plan = self.make_plan(decision, policy)
        if plan.device.startswith("cuda"):  # the hot path with CUDA tensors is cheaper in C
            extension.load_soon()
        # a kernel registered meanwhile may beat this plan: then use it for this call only
        self.plans.put(key, plan, still_valid=lambda: self.registry.generation == generation)
        return plan

    def decide(self, op: str, inputs: tuple, attrs: tuple, out: Any, policy: KernelPolicy) -> Decision:
        """Validate the call and let the selector choose (no caching, no warnings)."""
        ctx = build_context(self.registry.op(op), inputs, attrs, out, policy)
        return self.selector.select(ctx, policy)

    def make_plan(self, decision: Decision, policy: KernelPolicy) -> Plan:
        """Turn a selection decision into a Plan: launch config, workspace size, allocation and stream functions,
        everything a cache hit needs."""
        kernel, ctx = decision.kernel, decision.ctx
        backend = self.registry.backends[kernel.backend]
        workspace_bytes = int(kernel.workspace_bytes(ctx))
        _check_fits(ctx, kernel, workspace_bytes)
        finish = _finisher(backend, ctx.op, ctx.device, policy.sync)
        stream_used = not backend.ambient_stream or workspace_bytes or finish is not None
        return Plan(
            decision,
            self.registry.op(ctx.op),
            kernel.launch_config(ctx),
            workspace_bytes,
            backend.empty,
            None if backend.current_stream is no_stream or not stream_used else backend.current_stream,
            finish,
        )

    def _warn_fallback(self, decision: Decision, key: Hashable) -> None:
        if key in self._warned:
            return
        if len(self._warned) >= _MAX_WARNED:
            self._warned.clear()
        self._warned.add(key)
        preferred = next(c for c in decision.candidates if c.kernel.name == decision.preferred)
        warnings.warn(
            f"{decision.ctx.op}: policy prefers '{decision.preferred}', which cannot run this call "
            f"({decision.ctx.summary()}): {'; '.join(preferred.reasons)}. "
            f"Falling back to '{decision.kernel.name}'.",
            KernelFallbackWarning,
            stacklevel=_stacklevel_outside_package(),
        )

    # -- introspection -----------------------------------------------------------------------
    def plan(self, op: str, *inputs: Any, out: Any = None, policy: KernelPolicy | None = None, **attrs: Any) -> Plan:
        """The (cached) plan a call would use, without running it; attributes by keyword, defaults filled.
        `policy`: the one in force here when None."""
        schema = self.registry.op(op)
        policy = policy or current_policy()
        inputs, attrs_, out = normalize_call(schema, fill_inputs(schema, inputs), attr_values(schema, attrs), out)
        key = arguments.plan_key(op, policy.fingerprint, attrs_, inputs, out)
        return self.plans.get(key) or self._plan_miss(op, inputs, attrs_, out, policy, key)

    def explain(
        self, op: str, *inputs: Any, policy: KernelPolicy | str | Mapping | None = None, out: Any = None,
        **attrs: Any,
    ) -> Explanation:  # fmt: skip
        """Every candidate for this call with its verdict, reasons and score; arrays or TensorSpecs."""
        from .explanation import explain_call

        return explain_call(self, op, inputs, policy, out, attrs)


def _tracked(fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args) counted in LAUNCHING.depth."""
    LAUNCHING.depth += 1
    try:
        return fn(*args)
    finally:
        LAUNCHING.depth -= 1


def _finisher(backend: Backend, op: str, device: str, sync: SyncPolicy) -> Any:
    """What runs after each launch for the policy's SyncPolicy: nothing, an event, or a full sync."""
    if sync is SyncPolicy.FULL_SYNC:
        return functools.partial(backend.synchronize, device)
    if sync is SyncPolicy.EVENT_RECORD:
        record = backend.record_event
        if record is None:
            raise PolicyError(f"{op}: sync='event_record' is not supported by backend '{backend.name}' yet")

        def record_last(stream: Any) -> None:
            _events.last = record(device, stream)

        return record_last
    return None


def _check_fits(ctx: DispatchContext, kernel: KernelSpec, workspace_bytes: int) -> None:
    """OutOfMemoryError, before anything is allocated, for an output or workspace that cannot fit on the
    call's device (checked once per plan: the key fixes both sizes)."""
    if ctx.out is None and ctx.out_shape is not None and ctx.out_dtype is not None:
        check_fits(f"{ctx.op}: output", ctx.out_shape, ctx.out_dtype, itemsize(ctx.out_dtype), ctx.device)
    if workspace_bytes:
        check_bytes(f"{ctx.op}: workspace of kernel '{kernel.name}'", workspace_bytes, ctx.device)


def checked_output(plan: Plan, returned: Any) -> Any:
    """A returns_output kernel's result at a plan's first launch: the array (or tuple) the op's schema says,
    else a LaunchError naming the kernel. Later launches of the plan only refuse None (as the C hit path)."""
    returned = _returned_output(plan, returned)
    problem = plan.schema.returned_problem(plan.decision.ctx, returned)
    if problem is not None:
        kernel = plan.kernel
        raise LaunchError(
            f"{kernel.op}: kernel '{kernel.name}' [{kernel.backend}] declares returns_output=True and must return "
            f"{problem} ({plan.decision.ctx.summary()})"
        )
    return returned


def _returned_output(plan: Plan, returned: Any) -> Any:
    """What a returns_output kernel gave back when the caller passed no out=; None is a broken kernel."""
    if returned is None:
        kernel = plan.kernel
        raise LaunchError(
            f"{kernel.op}: kernel '{kernel.name}' [{kernel.backend}] declares returns_output=True but returned "
            f"None for a call without out= ({plan.decision.ctx.summary()}); it must return the output it allocated"
        )
    return returned


def _launch_error(plan: Plan, exc: Exception) -> XpuRuntimeError:
    """The error a failed launch raises: LaunchError naming op, kernel and launch config; OutOfMemoryError
    when the kernel's own temporaries did not fit (NumPy's MemoryError, PyTorch's OutOfMemoryError);
    ArgumentError for a Python int scalar beyond the float range (scalar values are no part of the plan key,
    so this is found, at no cost to other calls, when the kernel cannot convert it)."""
    kernel, ctx = plan.kernel, plan.decision.ctx
    ints = [name for name, spec in zip(ctx.arg_names, ctx.inputs) if spec is int]
    if isinstance(exc, OverflowError) and ints and "too large" in str(exc):  # a scalar's value is not in the key
        names = " or ".join(f"'{name}'" for name in ints)
        return ArgumentError(f"{kernel.op}: argument {names} expected a number within the float range, got a Python "
                             f"int beyond it ({exc})")  # fmt: skip
    out_of_memory = isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError"
    return (OutOfMemoryError if out_of_memory else LaunchError)(
        f"{kernel.op}: kernel '{kernel.name}' [{kernel.backend}] "
        f"{'ran out of memory' if out_of_memory else 'failed'} "
        f"(launch config {plan.config.describe()}; {plan.decision.ctx.summary()}): {type(exc).__name__}: {exc}"
    )


def _notify_observers(plan: Plan, hit: bool, start: int, launch_start: int) -> None:
    """Tell the dispatch log and active profilers about one dispatch (only runs while any is active)."""
    end = time.perf_counter_ns()
    record = DispatchRecord.make(plan, hit, (end - launch_start) / 1000.0)
    event = DispatchEvent(plan, record, start, launch_start, end, threading.get_native_id())
    for observer in list(OBSERVERS):
        observer.on_dispatch(event)


_default: Dispatcher | None = None
_default_lock = threading.Lock()


def default_dispatcher() -> Dispatcher:
    """The process-wide dispatcher over the default registry (what `xrt.ops.*` use)."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = Dispatcher()
    return _default


def plan_cache() -> PlanCache:
    """The process-wide plan cache (for statistics: `xrt.plan_cache().stats()`)."""
    return default_dispatcher().plans


def run(op: str, inputs: tuple, attrs: tuple = (), out: Any = None) -> Any:
    """Dispatch through the process-wide dispatcher (what `xrt.ops.*` call)."""
    return (_default or default_dispatcher()).run(op, inputs, attrs, out)


def explain(op: str, *inputs: Any, policy: Any = None, out: Any = None, show: bool = True, **attrs: Any) -> Explanation:
    """Explain how the process-wide dispatcher would choose a kernel; prints the table unless show=False."""
    explanation = default_dispatcher().explain(op, *inputs, policy=policy, out=out, **attrs)
    if show:
        explanation.print()
    return explanation


extension.on_load(_use_c_hit_path)  # at the end: the hook needs this module's functions
