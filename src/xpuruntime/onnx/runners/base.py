"""What every runner shares: the graph variant it is given, the session's policy around planning, and a
plan cache keyed by input signature."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...dispatch import Dispatcher
from ...graph.ir import Graph, Value
from ...policy import KernelPolicy, current_policy, kernel_policy
from ..executor import ExecutionPlan
from ..options import SessionOptions
from .plan_cache import PlanCache


@dataclass(frozen=True)
class GraphVariant:
    """The optimized graph a run uses: `fed` names the overridable initializers the run feeds (inputs
    here, after the model's own inputs); `inputs` is the graph's inputs, in the order feeds are passed."""

    fed: frozenset[str]
    graph: Graph
    inputs: tuple[Value, ...]


class Runner:
    """Runs graph variants of one session on one kind of device, one plan per input signature.

    A runner is what onnxruntime calls an execution provider: the session picks one for its device and
    hands it the graph variant and the feed of every run; the runner checks the feed's arrays, finds or
    makes the plan for their signature and runs it."""

    provider = ""  # onnxruntime's name for it

    def __init__(self, dispatcher: Dispatcher, policy: KernelPolicy | None, options: SessionOptions) -> None:
        self.dispatcher = dispatcher
        self.policy = policy
        self.options = options
        self.cache = PlanCache(options.max_cached_plans, options.max_cached_plan_bytes)
        self.lock = threading.Lock()  # one planning at a time
        self.fns: dict[int, Any] = {}  # id(node) -> step function, built once per runner

    def tensor_limit(self) -> int:
        """The most bytes one node output may take: SessionOptions.max_tensor_bytes, else the device's memory."""
        return self.options.max_tensor_bytes or self.device_memory()

    def device_memory(self) -> int:
        """Bytes of memory of the device the runner computes on (the host's here)."""
        return host_memory()

    def run(self, variant: GraphVariant, feed: Mapping[str, Any]) -> list:
        """The graph's outputs for a feed whose names the session has checked."""
        raise NotImplementedError

    def plan(self, variant: GraphVariant, feed: Mapping[str, Any]) -> ExecutionPlan:
        """The execution plan for this feed's signature (made and cached on first use)."""
        raise NotImplementedError

    def plans(self) -> list[ExecutionPlan]:
        """The cached plans, least recently used first."""
        return self.cache.values()

    def last_plan(self) -> ExecutionPlan | None:
        """The most recently used plan (None before the first run)."""
        return self.cache.last()

    def status(self) -> str:
        """One line about the last plan for explain() ('' when there is nothing to say)."""
        return ""

    def take_profile(self) -> list[dict]:
        """Chrome-trace events recorded since the last call (profiling on)."""
        return []

    def policy_scope(self) -> Any:
        """Planning happens under the session's policy, if it has one."""
        return kernel_policy(self.policy) if self.policy is not None else contextlib.nullcontext()

    def key(self, variant: GraphVariant, signature: list[tuple]) -> tuple:
        """The plan cache's key: the policy in force, the fed initializers and each input's dtype and shape."""
        return ((self.policy or current_policy()).fingerprint, variant.fed, *signature)


def host_memory() -> int:
    """The host's physical memory in bytes (1 TiB where the OS does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 1 << 40
