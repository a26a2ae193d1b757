"""Profiler v1: host ranges and dispatched ops with kernel, launch config, time, bytes and FLOPs.

    with xrt.profiler() as prof:
        with prof.range("forward"):
            y = xrt.ops.matmul(a, b)
    prof.export_chrome_trace("trace.json")   # open in chrome://tracing or ui.perfetto.dev

Each op becomes a complete event ("ph": "X") for the whole dispatch, with a nested event for the
kernel launch itself, so the dispatcher's own overhead is visible.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .log import DispatchEvent, DispatchRecord, add_observer, remove_observer

_active: list[Profiler] = []


@dataclass(frozen=True, slots=True)
class OpEvent:
    """One dispatch: its log record (kernel, reason, launch config, kernel time) plus trace timing."""

    record: DispatchRecord
    start_us: float  # relative to the profiler's start
    dispatch_us: float  # whole dispatch, the runtime's overhead included
    kernel_start_us: float
    bytes_moved: int
    flops: int
    thread_id: int


@dataclass(frozen=True, slots=True)
class RangeEvent:
    name: str
    start_us: float
    dur_us: float
    thread_id: int


class Profiler:
    """Collects OpEvents and RangeEvents while active; use `xpuruntime.profiler()` to activate."""

    def __init__(self) -> None:
        self.ops: list[OpEvent] = []
        self.ranges: list[RangeEvent] = []
        self._origin_ns = time.perf_counter_ns()
        self._wall_origin_us = time.time() * 1e6

    def _us(self, ns: int) -> float:
        return (ns - self._origin_ns) / 1000.0

    def on_dispatch(self, event: DispatchEvent) -> None:
        bytes_moved, flops = event.plan.cost
        self.ops.append(
            OpEvent(
                record=event.record,
                start_us=self._us(event.dispatch_start_ns),
                dispatch_us=(event.launch_end_ns - event.dispatch_start_ns) / 1000.0,
                kernel_start_us=self._us(event.launch_start_ns),
                bytes_moved=bytes_moved,
                flops=flops,
                thread_id=event.thread_id,
            )
        )

    @contextlib.contextmanager
    def range(self, name: str) -> Iterator[None]:
        """Record a named host range (e.g. "forward") around a block."""
        start = time.perf_counter_ns()
        try:
            yield
        finally:
            end = time.perf_counter_ns()
            self.ranges.append(RangeEvent(name, self._us(start), (end - start) / 1000.0, threading.get_native_id()))

    def chrome_trace(self) -> dict[str, Any]:
        """The trace as a dict in the Chrome trace-event format (complete events)."""
        pid = os.getpid()
        events: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": "xpuruntime"}}
        ]
        for r in self.ranges:
            events.append(
                {"name": r.name, "cat": "range", "ph": "X", "ts": r.start_us, "dur": r.dur_us, "pid": pid,
                 "tid": r.thread_id}
            )  # fmt: skip
        for e in self.ops:
            r = e.record
            args = {
                "kernel": r.selected_kernel, "backend": r.backend, "reason": r.reason, "cache_hit": r.cache_hit,
                "launch_config": r.launch_config, "shapes": [list(s) for s in r.input_shapes], "dtype": r.dtype,
                "bytes": e.bytes_moved, "flops": e.flops,
            }  # fmt: skip
            events.append(
                {"name": r.op_name, "cat": "op", "ph": "X", "ts": e.start_us, "dur": e.dispatch_us, "pid": pid,
                 "tid": e.thread_id, "args": args}
            )  # fmt: skip
            events.append(
                {"name": f"{r.backend}:{r.selected_kernel}", "cat": "kernel", "ph": "X", "ts": e.kernel_start_us,
                 "dur": r.elapsed_us, "pid": pid, "tid": e.thread_id, "args": {"launch_config": r.launch_config}}
            )  # fmt: skip
        return {"traceEvents": events, "displayTimeUnit": "ms",
                "otherData": {"wall_clock_origin_us": self._wall_origin_us}}  # fmt: skip

    def export_chrome_trace(self, path: str | os.PathLike) -> Path:
        """Write the trace atomically (temporary file, then rename) and return its path."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.chrome_trace()))
        os.replace(tmp, path)
        return path

    def summary(self) -> list[dict[str, Any]]:
        """Per (op, kernel): calls, total and mean kernel time, achieved GFLOP/s and GB/s."""
        groups: dict[tuple[str, str], list[OpEvent]] = {}
        for e in self.ops:
            groups.setdefault((e.record.op_name, e.record.selected_kernel), []).append(e)
        rows = []
        for (op, kernel), events in sorted(groups.items()):
            total_us = sum(e.record.elapsed_us for e in events)
            seconds = total_us / 1e6 or float("nan")
            rows.append({
                "op": op, "kernel": kernel, "calls": len(events), "total_us": total_us,
                "mean_us": total_us / len(events),
                "gflops": sum(e.flops for e in events) / seconds / 1e9,
                "gbytes_per_s": sum(e.bytes_moved for e in events) / seconds / 1e9,
            })  # fmt: skip
        return rows


@contextlib.contextmanager
def profiler() -> Iterator[Profiler]:
    """Profile every dispatch in this process while the block runs."""
    prof = Profiler()
    _active.append(prof)
    add_observer(prof)
    try:
        yield prof
    finally:
        remove_observer(prof)
        _active.remove(prof)


@contextlib.contextmanager
def record_range(name: str) -> Iterator[None]:
    """Record a host range in every active profiler (no-op when none is active)."""
    with contextlib.ExitStack() as stack:
        for prof in list(_active):
            stack.enter_context(prof.range(name))
        yield
