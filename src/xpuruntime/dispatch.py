"""The dispatcher: call signature -> plan (cached) -> launch, with logging and profiling hooks.

The hot path on a plan-cache hit is: read the policy, build the signature key, one dict lookup,
allocate the output, launch. Validation, selection, launch-config and workspace sizing happen only on
a miss, because the key fixes everything they depend on.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Hashable, Mapping
from types import MappingProxyType
from typing import Any

from numpy import ndarray

from .abi import ArgPack, SyncPolicy
from .arrays import NotAnArray, as_array, signature
from .context import build_context
from .errors import ArgumentError, KernelFallbackWarning, LaunchError
from .explanation import Explanation
from .log import OBSERVERS, DispatchEvent
from .plan import Plan, PlanCache
from .policy import KernelPolicy, _coerce, current_policy
from .registry import Registry, default_registry
from .selector import Decision, Scorer, Selector, default_scorer
from .workspace import WorkspaceManager

_MAX_WARNED = 10_000


def _freeze(value: Any) -> Any:
    """Make attribute values hashable (lists become tuples) for the plan-cache key."""
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value


class Dispatcher:
    """Runs ops through registry, selector and plan cache. Most code uses the process-wide one."""

    def __init__(
        self,
        registry: Registry | None = None,
        *,
        scorer: Scorer = default_scorer,
        plan_cache_size: int = 4096,
    ) -> None:
        self.registry = registry if registry is not None else default_registry()
        self.selector = Selector(self.registry, scorer)
        self.plans = PlanCache(plan_cache_size)
        self.workspaces = WorkspaceManager()
        self._warned: set[Hashable] = set()
        self.registry.on_change(self.plans.invalidate)

    # -- the hot path ------------------------------------------------------------------------
    def run(self, op: str, inputs: tuple, attrs: tuple = (), out: Any = None) -> Any:
        """Run `op` on `inputs` (positional, as the op's schema names them) and return the output."""
        start = time.perf_counter_ns() if OBSERVERS else 0
        policy = current_policy()
        try:
            sigs = [(x.dtype, x.shape, x.strides) if type(x) is ndarray else signature(x) for x in inputs]
            key = (op, policy._id, attrs, *sigs, None if out is None else signature(out))
            plan = self.plans.get(key)
        except (NotAnArray, TypeError):
            inputs, attrs, key = self._normalize_call(op, inputs, attrs, out, policy)
            plan = self.plans.get(key)
        hit = plan is not None
        if plan is None:
            plan = self._plan_miss(op, inputs, attrs, out, policy, key)
        if out is None:
            out = plan.allocate()
        else:
            plan.schema.check_layout(inputs, out)
        if start:
            self._launch_observed(plan, inputs, out, hit, start)
        else:
            self._launch(plan, inputs, out)
        return out

    def _launch(self, plan: Plan, inputs: tuple, out: Any) -> None:
        workspace = None
        if plan.workspace_bytes:
            workspace = self.workspaces.lend(plan.workspace_bytes, plan.decision.ctx.device, plan.empty)
        try:
            plan.launch(ArgPack(inputs, out, plan.attrs, plan.config, workspace))
            if plan.synchronize is not None:
                plan.synchronize(plan.decision.ctx.device)
        except Exception as exc:
            kernel = plan.kernel
            raise LaunchError(
                f"{kernel.op}: kernel '{kernel.name}' [{kernel.backend}] failed "
                f"(launch config {plan.config.describe()}; {plan.decision.ctx.summary()}): "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    def _launch_observed(self, plan: Plan, inputs: tuple, out: Any, hit: bool, start: int) -> None:
        launch_start = time.perf_counter_ns()
        self._launch(plan, inputs, out)
        event = DispatchEvent(plan, hit, start, launch_start, time.perf_counter_ns(), threading.get_ident())
        for observer in list(OBSERVERS):
            observer.on_dispatch(event)

    # -- misses ------------------------------------------------------------------------------
    def _normalize_call(
        self, op: str, inputs: tuple, attrs: tuple, out: Any, policy: KernelPolicy
    ) -> tuple[tuple, tuple, Hashable]:
        """Slow path for array-likes (lists, NumPy scalars) and unhashable attributes."""
        inputs = tuple(as_array(x) for x in inputs)
        attrs = _freeze(attrs)
        try:
            out_key = None if out is None else signature(out)
        except NotAnArray:
            raise ArgumentError(f"{op}: argument 'out' expected an array, got {type(out).__name__}") from None
        return inputs, attrs, (op, policy._id, attrs, *[signature(x) for x in inputs], out_key)

    def _plan_miss(self, op: str, inputs: tuple, attrs: tuple, out: Any, policy: KernelPolicy, key: Hashable) -> Plan:
        decision = self.decide(op, inputs, attrs, out, policy)
        if decision.reason == "fallback":
            self._warn_fallback(decision, key)
        plan = self.make_plan(decision, policy)
        self.plans.put(key, plan)
        return plan

    def decide(self, op: str, inputs: tuple, attrs: tuple, out: Any, policy: KernelPolicy) -> Decision:
        """Validate the call and let the selector choose (no caching, no warnings)."""
        ctx = build_context(self.registry.op(op), inputs, attrs, out, policy)
        return self.selector.select(ctx, policy)

    def make_plan(self, decision: Decision, policy: KernelPolicy) -> Plan:
        kernel, ctx = decision.kernel, decision.ctx
        backend = self.registry.backends[kernel.backend]
        plan = Plan(
            decision,
            self.registry.op(ctx.op),
            kernel.launch_config(ctx),
            int(kernel.workspace_bytes(ctx)),
            backend.empty,
            backend.synchronize if policy.sync is SyncPolicy.FULL_SYNC else None,
        )
        plan.attrs = MappingProxyType(plan.attrs)
        return plan

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
            stacklevel=5,
        )

    # -- introspection -----------------------------------------------------------------------
    def plan(self, op: str, *inputs: Any, attrs: tuple = (), out: Any = None) -> Plan:
        """The (cached) plan a call would use, without running it."""
        policy = current_policy()
        inputs, attrs, key = self._normalize_call(op, inputs, attrs, out, policy)
        return self.plans.get(key) or self._plan_miss(op, inputs, attrs, out, policy, key)

    def explain(
        self, op: str, *inputs: Any, policy: KernelPolicy | str | Mapping | None = None, out: Any = None,
        **attrs: Any,
    ) -> Explanation:  # fmt: skip
        """Every candidate for this call with its verdict, reasons and score; arrays or TensorSpecs."""
        schema = self.registry.op(op)
        unknown = set(attrs) - set(schema.attrs)
        if unknown:
            raise ArgumentError(f"{op}: unknown attribute(s) {sorted(unknown)}; the op takes {list(schema.attrs)}")
        missing = schema.inputs[len(inputs) :]
        if any(name not in schema.optional for name in missing):
            raise ArgumentError(f"{op}: expected inputs {schema.inputs}, got {len(inputs)}")
        inputs = tuple(as_array(x) for x in inputs) + (None,) * len(missing)
        attr_values = tuple(_freeze(attrs.get(name, schema.defaults.get(name))) for name in schema.attrs)
        policy = _coerce(policy, {}) or current_policy()
        ctx = build_context(schema, inputs, attr_values, out, policy)
        candidates = self.selector.evaluate(ctx)
        try:
            decision, error = self.selector.select(ctx, policy), None
        except Exception as exc:  # the explanation shows why nothing could be chosen
            decision, error = None, exc
        return Explanation(ctx, policy, candidates, decision, error)


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


def explain(op: str, *inputs: Any, policy: Any = None, show: bool = True, **attrs: Any) -> Explanation:
    """Explain how the process-wide dispatcher would choose a kernel; prints the table unless show=False."""
    explanation = default_dispatcher().explain(op, *inputs, policy=policy, **attrs)
    if show:
        explanation.print()
    return explanation
