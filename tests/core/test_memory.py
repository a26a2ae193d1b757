"""Memory stays flat over a long run: 100k dispatches with the dispatch log and a profiler active, a new
policy for every call and a new dispatcher for every call, measured with tracemalloc after a warm-up."""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np
from conftest import make_toy_registry

import xpuruntime as xrt
from xpuruntime import policy
from xpuruntime.policy import KernelPolicy
from xpuruntime.profiling import Profiler
from xpuruntime.registry import Registry

CALLS = 100_000
WARMUP = 10_000
BOUND = 1_000  # log records and profiler events kept: reached during the warm-up
ALLOWED_GROWTH = 256 * 1024  # bytes; a leak of one small object per call would be several MB


def run_calls(count: int, start: int, toy_registry: Registry, prof: Profiler) -> None:
    """`count` iterations: a fresh policy (new content each time, and one of a few dispatched ones), a fresh
    dispatcher on the toy registry, and dispatches through both the process-wide and the fresh dispatcher."""
    x = np.arange(6.0).reshape(2, 3)
    toy_x = np.ones(3, np.float32)
    preferred = ("numpy", "auto")
    for i in range(start, start + count):
        KernelPolicy(toy=f"k{i}", validate=False)  # distinct content: a fingerprint that must be forgotten
        with xrt.kernel_policy(KernelPolicy(sum=preferred[i % 2])):
            xrt.ops.sum(x)
        dispatcher = xrt.Dispatcher(toy_registry)
        if i % 10 == 0:
            with prof.range("toy"):
                dispatcher.run("toy", (toy_x,))


def test_memory_is_flat_after_warm_up():
    toy_registry = make_toy_registry({"name": "a"})
    xrt.enable_dispatch_logging(max_records=BOUND)
    try:
        with xrt.profiler(max_events=BOUND) as prof:
            tracemalloc.start()
            try:
                run_calls(WARMUP, 0, toy_registry, prof)
                gc.collect()
                before = tracemalloc.get_traced_memory()[0]
                run_calls(CALLS, WARMUP, toy_registry, prof)
                gc.collect()
                after = tracemalloc.get_traced_memory()[0]
            finally:
                tracemalloc.stop()
    finally:
        xrt.disable_dispatch_logging()
    growth = after - before
    assert growth < ALLOWED_GROWTH, f"memory grew by {growth / 1024:.0f} KiB over {CALLS} calls"
    total_ops = (WARMUP + CALLS) * 11 // 10
    assert len(xrt.get_dispatch_logs()) == BOUND
    assert len(prof.ops) == BOUND and prof.dropped_ops == total_ops - BOUND
    assert sum(row["calls"] for row in prof.summary()) == total_ops
    assert len(toy_registry._listeners) < 100  # dead dispatchers' references are pruned
    assert len(policy._fingerprints) < 100  # dropped policies' fingerprints are forgotten
