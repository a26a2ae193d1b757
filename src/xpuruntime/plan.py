"""Plans and the plan cache: a decision is made once per call signature and reused.

A signature is (op, policy fingerprint, attributes, per argument: dtype, shape, strides, device).
Everything a plan holds is a pure function of that key, so a hit can skip validation, selection,
launch-config and workspace computation. Policy changes need no invalidation (the fingerprint is in
the key); registering or removing a kernel drops that op's plans.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from .abi import LaunchConfig, itemsize
from .registry import KernelSpec
from .schema import OpSchema
from .selector import Decision


class Plan:
    """What to run for one call signature: kernel, normalized attributes, launch config, output spec."""

    __slots__ = (
        "_cost", "_log_fields", "allocate", "attrs", "config", "current_stream", "decision", "device", "empty",
        "finish", "hit_path", "kernel", "last_used", "launch", "returns_output", "schema", "workspace_bytes",
    )  # fmt: skip

    def __init__(
        self,
        decision: Decision,
        schema: OpSchema,
        config: LaunchConfig,
        workspace_bytes: int,
        empty: Callable[..., Any],
        current_stream: Callable[[str], Any] | None,
        finish: Callable[[Any], None] | None,
    ) -> None:
        ctx = decision.ctx
        self.decision = decision
        self.schema = schema
        self.kernel: KernelSpec = decision.kernel
        self.launch = decision.kernel.launch
        self.attrs = MappingProxyType(dict(ctx.attrs))  # shared by every launch: read-only
        self.config = config
        self.workspace_bytes = workspace_bytes
        self.empty = empty
        self.device = ctx.device
        self.allocate = functools.partial(empty, ctx.out_shape, ctx.out_dtype, ctx.device)  # (stream) -> output
        # the kernel allocates and returns its output when given none: the dispatcher then skips `allocate`
        # (callers that allocate anyway and pass the buffer as out= stay correct: the kernel writes into it)
        self.returns_output = decision.kernel.returns_output
        self.current_stream = current_stream  # None where launches need no stream (the CPU)
        self.finish = finish  # (stream) -> None after each launch: the policy's sync, or None for NO_SYNC
        self.last_used = 0  # the plan cache's clock at the last hit, for LRU eviction
        # what the C hit path (runtime/hot_path.cpp) runs for a call without out=; None: Python runs it
        # (a workspace to lend, a sync to make after the launch, or input buffers to check)
        self.hit_path = (
            None if workspace_bytes or finish is not None or schema.buffers
            else (current_stream, ctx.device, None if self.returns_output else self.allocate, self.attrs, config,
                  self.launch)
        )  # fmt: skip
        self._log_fields: tuple | None = None
        self._cost: tuple[int, int] | None = None

    @property
    def reason(self) -> str:
        return self.decision.reason

    @property
    def log_fields(self) -> tuple:
        """(op, kernel, backend, reason, shapes, dtype, launch config): fixed per plan, built once."""
        if self._log_fields is None:
            ctx = self.decision.ctx
            dtype = ctx.dtype if ctx.tensors else ""
            self._log_fields = (ctx.op, self.kernel.name, self.kernel.backend, self.reason, ctx.shapes, dtype,
                                self.config.describe())  # fmt: skip
        return self._log_fields

    @property
    def cost(self) -> tuple[int, int]:
        """(bytes moved, FLOPs) of one call: each tensor read once and the output written once."""
        if self._cost is None:
            ctx = self.decision.ctx
            out_bytes = math.prod(ctx.out_shape or ()) * itemsize(ctx.out_dtype or "")
            self._cost = (sum(t.nbytes for t in ctx.tensors) + out_bytes, int(self.schema.flops(ctx)))
        return self._cost

    def __repr__(self) -> str:
        return (
            f"Plan({self.kernel.qualified_name}, reason={self.reason}, {self.config.describe()}, "
            f"workspace={self.workspace_bytes}B)"
        )


@dataclass(frozen=True)
class PlanCacheStats:
    hits: int
    misses: int
    evictions: int
    invalidations: int
    size: int
    maxsize: int

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


class PlanCache:
    """Bounded LRU of plans with hit/miss statistics, safe under concurrent dispatch.

    A hit costs one dict lookup and two integer stores: the hit counter doubles as the LRU clock
    (stored on the plan), and eviction, when an insert overflows, drops the least recently used
    eighth of the entries at once.
    """

    def __init__(self, maxsize: int = 4096) -> None:
        if maxsize < 1:
            raise ValueError(f"PlanCache: maxsize must be >= 1, got {maxsize}")
        self.maxsize = maxsize
        self.entries: dict[Hashable, Plan] = {}  # key -> plan; the C hit path (runtime/hot_path.cpp) reads it
        self._lock = threading.Lock()
        self.hits = self.misses = self.evictions = self.invalidations = 0

    def get(self, key: Hashable) -> Plan | None:
        plan = self.entries.get(key)
        if plan is None:
            self.misses += 1
            return None
        self.hits += 1
        plan.last_used = self.hits
        return plan

    def put(self, key: Hashable, plan: Plan, still_valid: Callable[[], bool] = lambda: True) -> None:
        """Insert unless `still_valid()` is false; it is asked under the same lock that `invalidate`
        takes, so an invalidation can never slip between the check and the insert."""
        with self._lock:
            if not still_valid():
                return
            plan.last_used = self.hits
            self.entries[key] = plan
            if len(self.entries) > self.maxsize:
                by_age = sorted(self.entries, key=lambda k: self.entries[k].last_used)
                for old in by_age[: max(1, len(by_age) // 8)]:
                    del self.entries[old]
                    self.evictions += 1

    def invalidate(self, op: str | None = None) -> int:
        """Drop every plan (op=None) or the plans of one op; returns how many were dropped."""
        with self._lock:
            doomed = [k for k in self.entries if op is None or k[0] == op]
            for key in doomed:
                del self.entries[key]
            self.invalidations += len(doomed)
            return len(doomed)

    def clear(self) -> None:
        with self._lock:
            self.entries.clear()
            self.hits = self.misses = self.evictions = self.invalidations = 0

    def stats(self) -> PlanCacheStats:
        return PlanCacheStats(
            self.hits, self.misses, self.evictions, self.invalidations, len(self.entries), self.maxsize
        )

    def __len__(self) -> int:
        return len(self.entries)
