"""The CPU runner: NumPy arrays through the planner, kernels chosen by the selector, the rest by the op
records' NumPy functions."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from ..executor import Arena, ExecutionPlan, Planner
from ..feeds import check_arrays
from .base import GraphVariant, Runner


class CpuRunner(Runner):
    """Runs on the host; results are NumPy arrays the caller owns."""

    provider = "CPUExecutionProvider"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._events: list[dict] = []
        self.arena = Arena()  # the reused buffers of every plan, in one block

    def run(self, variant: GraphVariant, feed: Mapping[str, Any]) -> list:
        arrays = check_arrays(variant.inputs, feed)
        plan, first = self._plan(variant, arrays)
        if first is not None:
            return first
        profiling = self.options.enable_profiling
        start = time.perf_counter_ns()
        results = plan.run(arrays, profiling)
        if profiling:
            self._record_profile(plan, start)
        return results

    def plan(self, variant: GraphVariant, feed: Mapping[str, Any]) -> ExecutionPlan:
        return self._plan(variant, check_arrays(variant.inputs, feed))[0]

    def _plan(self, variant: GraphVariant, arrays: list) -> tuple[ExecutionPlan, list | None]:
        """The plan for these arrays' signature, and the outputs of its planning run if it was made now."""
        key = self.key(variant, [(a.dtype, a.shape) for a in arrays])
        plan = self.cache.get(key)
        if plan is not None:
            return plan, None
        with self.lock, self.policy_scope():
            planner = Planner(variant.graph, self.dispatcher, self.fns, self.options.enable_mem_reuse,
                              self.tensor_limit(), self.arena)  # fmt: skip
            plan, outputs = planner.build({v.name: a for v, a in zip(variant.inputs, arrays)})
            self.cache.put(key, plan, plan.nbytes)
        return plan, outputs

    def _record_profile(self, plan: ExecutionPlan, start: int) -> None:
        t = start / 1000.0
        for name, us in plan.profile:
            self._events.append({"name": name, "ph": "X", "ts": t, "dur": us, "pid": 0, "tid": 0})
            t += us
        plan.profile.clear()

    def take_profile(self) -> list[dict]:
        events, self._events = self._events, []
        return events
