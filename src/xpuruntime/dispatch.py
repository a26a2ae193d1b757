"""The dispatcher: call signature -> plan (cached) -> launch, with logging and profiling hooks.

The hot path on a plan-cache hit is: read the policy, build the signature key, one dict lookup,
allocate the output, launch. Validation, selection, launch-config and workspace sizing happen only on
a miss, because the key fixes everything they depend on.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import warnings
from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np
from numpy import ndarray

from .abi import ArgPack, SyncPolicy, TensorSpec
from .arrays import NotAnArray, as_array, is_torch_tensor, signature
from .context import build_context, check_arity
from .errors import ArgumentError, KernelFallbackWarning, LaunchError, XpuRuntimeError
from .explanation import Explanation
from .log import OBSERVERS, DispatchEvent, DispatchRecord
from .plan import Plan, PlanCache
from .policy import KernelPolicy, as_policy, current_policy
from .registry import Registry, default_registry
from .schema import OpSchema
from .selector import Decision, Scorer, Selector, default_scorer
from .workspace import WorkspaceManager

_MAX_WARNED = 10_000
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _freeze(value: Any) -> Any:
    """Attribute values as plain, hashable Python: lists, tuples and arrays become tuples, NumPy scalars
    Python numbers, so that equal calls share one plan-cache key."""
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, np.ndarray):
        return _freeze(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    return value


def _attr_types(attrs: tuple) -> tuple:
    """Attribute types for the plan-cache key, element types too inside tuples: True == 1 == 1.0 as
    dict keys, yet only one of them may be a valid value, and a cache hit skips validation."""
    return tuple((tuple, *_attr_types(a)) if type(a) is tuple else type(a) for a in attrs)


def _fill_inputs(schema: OpSchema, inputs: tuple) -> tuple:
    """Trailing inputs left out take the schema's default (sin_affine's a=1.0) or None if optional."""
    if len(inputs) > len(schema.inputs):
        raise ArgumentError(
            f"{schema.name}: expected at most {len(schema.inputs)} inputs {schema.inputs}, got {len(inputs)}"
        )
    filled = list(inputs)
    for name in schema.inputs[len(inputs) :]:
        if name not in schema.defaults and name not in schema.optional:
            raise ArgumentError(f"{schema.name}: argument '{name}' is required")
        filled.append(schema.defaults.get(name))
    return tuple(filled)


def _attr_values(schema: OpSchema, attrs: Mapping[str, Any]) -> tuple:
    """Keyword attributes -> the positional tuple `run` takes, with the schema's defaults filled in."""
    unknown = set(attrs) - set(schema.attrs)
    if unknown:
        raise ArgumentError(f"{schema.name}: unknown attribute(s) {sorted(unknown)}; the op takes {list(schema.attrs)}")
    missing = [name for name in schema.attrs if name not in attrs and name not in schema.defaults]
    if missing:
        raise ArgumentError(f"{schema.name}: attribute(s) {missing} have no default; pass them")
    return tuple(attrs.get(name, schema.defaults.get(name)) for name in schema.attrs)


def _stacklevel_outside_package() -> int:
    """The `warnings.warn` stacklevel of the first caller outside xpuruntime (the user's line)."""
    frame, level = sys._getframe(2), 2  # 1 = our caller (which calls warnings.warn)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
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
        self.registry.on_change(self.plans.invalidate)

    # -- the hot path ------------------------------------------------------------------------
    def run(self, op: str, inputs: tuple, attrs: tuple = (), out: Any = None) -> Any:
        """Run `op` on `inputs` and `attrs` (positional, in the schema's order); returns the output."""
        start = time.perf_counter_ns() if OBSERVERS else 0
        policy = current_policy()
        result = out
        try:
            sigs = [(x.dtype, x.shape, x.strides) if type(x) is ndarray else signature(x) for x in inputs]
            types = tuple(map(type, attrs)) if attrs else ()
            if tuple in types:
                types = _attr_types(attrs)
            key = (op, policy.fingerprint, attrs, types, *sigs, None if out is None else signature(out))
            plan = self.plans.get(key)
        except (NotAnArray, TypeError):
            inputs, attrs, out, key = self._normalize_call(op, inputs, attrs, out, policy)
            plan = self.plans.get(key)
        hit = plan is not None
        if plan is None:
            plan = self._plan_miss(op, inputs, attrs, out, policy, key)
        if out is None:
            out = result = plan.allocate()
        else:
            plan.schema.check_layout(inputs, out)
        launch_start = time.perf_counter_ns() if start else 0
        workspace = (
            self.workspaces.lend(plan.workspace_bytes, plan.device, plan.empty) if plan.workspace_bytes else None
        )
        try:
            plan.launch(ArgPack(inputs, out, plan.attrs, plan.config, workspace))
            if plan.synchronize is not None:
                plan.synchronize(plan.device)
        except Exception as exc:
            raise _launch_error(plan, exc) from exc
        if start:
            _notify_observers(plan, hit, start, launch_start)
        return result

    # -- misses ------------------------------------------------------------------------------
    def _normalize_call(
        self, op: str, inputs: tuple, attrs: tuple, out: Any, policy: KernelPolicy
    ) -> tuple[tuple, tuple, Any, Hashable]:
        """Slow path: convert array-likes, NumPy scalars, array subclasses and unhashable attributes,
        naming the argument that cannot be converted."""
        schema = self.registry.op(op)
        check_arity(schema, inputs, attrs)
        inputs = tuple(_coerce_input(schema, name, x) for name, x in zip(schema.inputs, inputs))
        out = _coerce_out(op, out)
        attrs = _freeze(attrs)
        for name, value in zip(schema.attrs, attrs):
            try:
                hash(value)
            except TypeError:
                raise ArgumentError(
                    f"{op}: argument '{name}' expected a number, bool, None or tuple, got {type(value).__name__}"
                ) from None
        out_key = None if out is None else signature(out)
        key = (op, policy.fingerprint, attrs, _attr_types(attrs), *map(signature, inputs), out_key)
        return inputs, attrs, out, key

    def _plan_miss(self, op: str, inputs: tuple, attrs: tuple, out: Any, policy: KernelPolicy, key: Hashable) -> Plan:
        generation = self.registry.generation
        decision = self.decide(op, inputs, attrs, out, policy)
        if decision.reason == "fallback":
            self._warn_fallback(decision, key)
        plan = self.make_plan(decision, policy)
        # a kernel registered meanwhile may beat this plan: then use it for this call only
        self.plans.put(key, plan, still_valid=lambda: self.registry.generation == generation)
        return plan

    def decide(self, op: str, inputs: tuple, attrs: tuple, out: Any, policy: KernelPolicy) -> Decision:
        """Validate the call and let the selector choose (no caching, no warnings)."""
        ctx = build_context(self.registry.op(op), inputs, attrs, out, policy)
        return self.selector.select(ctx, policy)

    def make_plan(self, decision: Decision, policy: KernelPolicy) -> Plan:
        kernel, ctx = decision.kernel, decision.ctx
        backend = self.registry.backends[kernel.backend]
        return Plan(
            decision,
            self.registry.op(ctx.op),
            kernel.launch_config(ctx),
            int(kernel.workspace_bytes(ctx)),
            backend.empty,
            backend.synchronize if policy.sync is SyncPolicy.FULL_SYNC else None,
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
    def plan(self, op: str, *inputs: Any, out: Any = None, **attrs: Any) -> Plan:
        """The (cached) plan a call would use, without running it; attributes by keyword, defaults filled."""
        schema = self.registry.op(op)
        inputs = _fill_inputs(schema, inputs)
        policy = current_policy()
        inputs, attr_values, out, key = self._normalize_call(op, inputs, _attr_values(schema, attrs), out, policy)
        return self.plans.get(key) or self._plan_miss(op, inputs, attr_values, out, policy, key)

    def explain(
        self, op: str, *inputs: Any, policy: KernelPolicy | str | Mapping | None = None, out: Any = None,
        **attrs: Any,
    ) -> Explanation:  # fmt: skip
        """Every candidate for this call with its verdict, reasons and score; arrays or TensorSpecs."""
        schema = self.registry.op(op)
        inputs = tuple(
            _coerce_input(schema, n, x, specs=True) for n, x in zip(schema.inputs, _fill_inputs(schema, inputs))
        )
        attr_values = _freeze(_attr_values(schema, attrs))
        policy = as_policy(policy) or current_policy()
        ctx = build_context(schema, inputs, attr_values, out, policy)
        try:
            decision, error = self.selector.select(ctx, policy), None
            candidates = list(decision.candidates)
        except XpuRuntimeError as exc:  # the explanation shows why nothing could be chosen
            decision, error, candidates = None, exc, self.selector.evaluate(ctx)
        return Explanation(ctx, policy, candidates, decision, error)


def _launch_error(plan: Plan, exc: Exception) -> LaunchError:
    kernel = plan.kernel
    return LaunchError(
        f"{kernel.op}: kernel '{kernel.name}' [{kernel.backend}] failed "
        f"(launch config {plan.config.describe()}; {plan.decision.ctx.summary()}): {type(exc).__name__}: {exc}"
    )


def _notify_observers(plan: Plan, hit: bool, start: int, launch_start: int) -> None:
    """Tell the dispatch log and active profilers about one dispatch (only runs while any is active)."""
    end = time.perf_counter_ns()
    record = DispatchRecord.make(plan, hit, (end - launch_start) / 1000.0)
    event = DispatchEvent(plan, record, start, launch_start, end, threading.get_native_id())
    for observer in list(OBSERVERS):
        observer.on_dispatch(event)


def _coerce_input(schema: OpSchema, name: str, x: Any, specs: bool = False) -> Any:
    """One input as the dispatcher takes it; NumPy scalars count as Python numbers where the op takes those."""
    if isinstance(x, np.generic) and name in schema.scalars:
        return x.item()
    if isinstance(x, np.ma.MaskedArray):
        raise ArgumentError(f"{schema.name}: argument '{name}' is a masked array; pass x.filled(value) instead")
    if isinstance(x, TensorSpec) and not specs:
        raise ArgumentError(f"{schema.name}: argument '{name}' expected an array, got a TensorSpec (for explain)")
    try:
        return as_array(x)
    except (ValueError, TypeError) as exc:
        raise ArgumentError(
            f"{schema.name}: argument '{name}' expected an array, got {type(x).__name__}: {exc}"
        ) from None


def _coerce_out(op: str, out: Any) -> Any:
    """`out` must already be an array (it is written in place); ndarray subclasses are viewed as ndarrays."""
    if out is None or type(out) is ndarray or is_torch_tensor(out):
        return out
    if isinstance(out, ndarray):
        return np.asarray(out)
    raise ArgumentError(f"{op}: argument 'out' expected an array, got {type(out).__name__}")


_default: Dispatcher | None = None
_default_lock = threading.Lock()


def default_dispatcher() -> Dispatcher:
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
