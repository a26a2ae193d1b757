"""profile(): PyTorch's profiler and xpuruntime's together, with each dispatch decision in the trace.

Every dispatch made while profiling emits a zero-length `record_function` range named
`xrt::<op> -> <kernel> (<reason>)` on the dispatching thread right after its launch, so the PyTorch
trace shows the decision next to the kernels it launched; on CUDA an NVTX mark carries the same name
for Nsight. xpuruntime's own trace (ops with launch configs, bytes and FLOPs) is written beside the
PyTorch one as `<name>.xpuruntime.json`, and its events are also merged into the PyTorch trace.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from ..log import DispatchEvent, add_observer, remove_observer
from ..profiling import profiler as xrt_profiler


class _DecisionMarker:
    """Observer: one named instant per dispatch in the PyTorch profiler (and NVTX)."""

    def __init__(self) -> None:
        self.nvtx = torch.cuda.is_available()

    def on_dispatch(self, event: DispatchEvent) -> None:
        record = event.record
        name = f"xrt::{record.op_name} -> {record.selected_kernel} ({record.reason})"
        with torch.autograd.profiler.record_function(name):
            pass
        if self.nvtx:
            torch.cuda.nvtx.mark(name)


def _default_activities() -> list:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return activities


@contextlib.contextmanager
def profile(
    activities: list | None = None,
    record_shapes: bool = True,
    profile_memory: bool = True,
    with_stack: bool = False,
    export_chrome_trace: str | None = None,
) -> Iterator[Any]:
    """Profile the block with both profilers; yields PyTorch's profiler (its `.xpuruntime` is ours)."""
    if export_chrome_trace is not None:
        _check_writable(Path(export_chrome_trace))
    marker = _DecisionMarker()
    with torch.profiler.profile(
        activities=activities or _default_activities(),
        record_shapes=record_shapes,
        profile_memory=profile_memory,
        with_stack=with_stack,
    ) as prof, xrt_profiler() as ours:  # fmt: skip
        prof.xpuruntime = ours
        add_observer(marker)
        try:
            with torch.autograd.profiler.record_function("xpuruntime.profile"):
                yield prof
        finally:
            remove_observer(marker)
    if export_chrome_trace is not None:
        _export(prof, ours, Path(export_chrome_trace))


def _check_writable(path: Path) -> None:
    if path.is_dir() or not path.parent.exists():
        from ..errors import ArgumentError

        raise ArgumentError(
            f"profile: argument 'export_chrome_trace' expected a file path in an existing folder, got {path}"
        )


def _export(prof: Any, ours: Any, path: Path) -> None:
    """PyTorch's trace at `path` with xpuruntime's events merged in, and ours alone beside it."""
    ours_path = path.with_suffix(".xpuruntime.json")
    ours.export_chrome_trace(str(ours_path))
    prof.export_chrome_trace(str(path))
    with open(path) as f:
        trace = json.load(f)
    with open(ours_path) as f:
        extra = json.load(f)
    events = extra["traceEvents"] if isinstance(extra, dict) else extra
    trace.setdefault("traceEvents", []).extend(_shift(events, trace, ours))
    with open(path, "w") as f:
        json.dump(trace, f)


def _shift(events: list, trace: dict, ours: Any) -> list:
    """Our events use the profiler's start as time zero; PyTorch's use wall-clock µs (minus a base)."""
    base_ns = int(trace.get("baseTimeNanoseconds", 0))
    offset = ours._wall_origin_us - base_ns / 1000.0
    shifted = []
    for event in events:
        event = dict(event)
        if "ts" in event:
            event["ts"] = float(event["ts"]) + offset
        event["pid"] = f"xpuruntime {event.get('pid', '')}".strip()
        shifted.append(event)
    return shifted
