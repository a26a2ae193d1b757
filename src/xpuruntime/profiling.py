"""Profiler v1: host ranges and dispatched ops with kernel, launch config, time, bytes and FLOPs.

    with xrt.profiler() as prof:
        with prof.range("forward"):
            y = xrt.ops.matmul(a, b)
    prof.export_chrome_trace("trace.json")   # open in chrome://tracing or ui.perfetto.dev

Each op becomes a complete event ("ph": "X") for the whole dispatch, with a nested event for the
kernel launch itself, so the dispatcher's own overhead is visible. A profiler keeps the newest
`max_events` ops and ranges (a ring buffer; `xrt.profiler(max_events=...)` raises the bound); the trace
and the summary say how many were dropped, and the summary's totals still count every dispatch.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ArgumentError, clip
from .log import DispatchEvent, DispatchRecord, add_observer, check_capacity, remove_observer

DEFAULT_MAX_EVENTS = 100_000  # ops (and, separately, ranges) kept: some tens of MB at most
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


class _Totals:
    """Running totals of one (op, kernel): exact however many events the ring buffer dropped."""

    __slots__ = ("bytes_moved", "calls", "flops", "kept", "total_us")

    def __init__(self) -> None:
        self.calls = self.kept = self.bytes_moved = self.flops = 0
        self.total_us = 0.0


class Profiler:
    """Collects OpEvents and RangeEvents while active; use `xpuruntime.profiler()` to activate."""

    def __init__(self, max_events: int = DEFAULT_MAX_EVENTS) -> None:
        max_events = check_capacity("profiler", "max_events", max_events)
        self.ops: collections.deque[OpEvent] = collections.deque(maxlen=max_events)
        self.ranges: collections.deque[RangeEvent] = collections.deque(maxlen=max_events)
        self.dropped_ops = 0
        self.dropped_ranges = 0
        self._totals: dict[tuple[str, str], _Totals] = {}
        self._origin_ns = time.perf_counter_ns()
        self._wall_origin_us = time.time() * 1e6

    @property
    def max_events(self) -> int:
        return self.ops.maxlen or 0

    @property
    def dropped_events(self) -> int:
        """Events the ring buffers let go (oldest first) because more than `max_events` arrived."""
        return self.dropped_ops + self.dropped_ranges

    def _us(self, ns: int) -> float:
        return (ns - self._origin_ns) / 1000.0

    def on_dispatch(self, event: DispatchEvent) -> None:
        bytes_moved, flops = event.plan.cost
        record = event.record
        totals = self._totals.get((record.op_name, record.selected_kernel))
        if totals is None:
            totals = self._totals[(record.op_name, record.selected_kernel)] = _Totals()
        totals.calls += 1
        totals.total_us += record.elapsed_us
        totals.bytes_moved += bytes_moved
        totals.flops += flops
        if len(self.ops) == self.ops.maxlen:
            dropped = self.ops[0].record
            self.dropped_ops += 1
            self._totals[(dropped.op_name, dropped.selected_kernel)].kept -= 1
        totals.kept += 1
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
        if not isinstance(name, str):
            raise ArgumentError(f"record_range: argument 'name' expected a string, got {clip(name)}")
        start = time.perf_counter_ns()
        try:
            yield
        finally:
            end = time.perf_counter_ns()
            if len(self.ranges) == self.ranges.maxlen:
                self.dropped_ranges += 1
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
        if self.dropped_events:
            events.append(
                {"name": f"xpuruntime: {self.dropped_events} oldest events dropped (max_events={self.max_events})",
                 "ph": "i", "s": "g", "ts": 0, "pid": pid, "tid": 0}
            )  # fmt: skip
        other = {"wall_clock_origin_us": self._wall_origin_us, "max_events": self.max_events,
                 "dropped_events": self.dropped_events, "dropped_ops": self.dropped_ops,
                 "dropped_ranges": self.dropped_ranges}  # fmt: skip
        return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other}

    def export_chrome_trace(self, path: str | os.PathLike) -> Path:
        """Write the trace atomically (temporary file in the same folder, then rename) and return its path.
        The path is checked before any work, and the temporary file never outlives a failure."""
        path = check_trace_path(path)
        text = json.dumps(self.chrome_trace())
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            with os.fdopen(fd, "w") as file:
                file.write(text)
            os.chmod(tmp, 0o644)  # mkstemp makes it private; a trace is an ordinary file
            os.replace(tmp, path)
        except OSError as exc:
            raise _path_error(path, exc, TRACE_PATH) from None
        finally:
            if tmp is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        return path

    def summary(self) -> list[dict[str, Any]]:
        """Per (op, kernel): calls, total and mean kernel time, achieved GFLOP/s and GB/s over every dispatch,
        and `dropped`: how many of those calls the trace no longer holds (ring buffer)."""
        rows = []
        for (op, kernel), t in sorted(self._totals.items()):
            seconds = t.total_us / 1e6 or float("nan")
            rows.append({
                "op": op, "kernel": kernel, "calls": t.calls, "total_us": t.total_us, "mean_us": t.total_us / t.calls,
                "gflops": t.flops / seconds / 1e9, "gbytes_per_s": t.bytes_moved / seconds / 1e9,
                "dropped": t.calls - t.kept,
            })  # fmt: skip
        return rows


TRACE_PATH = "export_chrome_trace: argument 'path'"


def _path_error(path: object, exc: OSError, subject: str) -> ArgumentError:
    reason = exc.strerror or exc
    return ArgumentError(f"{subject} cannot be written: {clip(str(path))}: {reason}")


def check_trace_path(path: str | os.PathLike, subject: str = TRACE_PATH) -> Path:
    """The trace path as a Path, if a file can be written there: it is not empty, not a folder, and its
    folder exists and takes a new file (tried with a probe file, removed at once). Raises ArgumentError whose
    message names the path as the caller knows it (`subject`: an argument, or a command-line option)."""
    try:
        named = os.fspath(path) if isinstance(path, str | os.PathLike) else None
    except Exception as exc:  # a PathLike whose __fspath__ fails
        named, path = None, f"{type(path).__name__} whose __fspath__ raised {type(exc).__name__}"
    if not isinstance(named, str) or not named:
        raise ArgumentError(f"{subject} expected a file path, got {clip(path)}")
    path = Path(named)
    if path.is_dir():
        raise ArgumentError(f"{subject} is a folder, not a file path: {clip(str(path))}")
    if not path.parent.is_dir():
        raise ArgumentError(f"{subject} is in a folder that does not exist: {clip(str(path.parent))}")
    if path.exists() and not os.access(path, os.W_OK):
        raise _path_error(path, PermissionError(13, "Permission denied"), subject)
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise _path_error(path, exc, subject) from None
    os.close(fd)
    os.unlink(probe)
    return path


@contextlib.contextmanager
def profiler(max_events: int = DEFAULT_MAX_EVENTS) -> Iterator[Profiler]:
    """Profile every dispatch in this process while the block runs (keeping the newest `max_events`)."""
    prof = Profiler(max_events)
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
    if not isinstance(name, str):
        raise ArgumentError(f"record_range: argument 'name' expected a string, got {clip(name)}")
    with contextlib.ExitStack() as stack:
        for prof in list(_active):
            stack.enter_context(prof.range(name))
        yield
