"""Kernel launches captured as they run, for replaying them later without the code that made them.

While `capturing()` is active on a thread, the dispatcher notes each plan it runs there and Triton's launch
helper (`backends/triton/common.launch`) notes each compiled kernel it launches, with its grid and arguments
(see `xpuruntime.pytorch.custom_ops.replay`, which replays a fused op's eager body from such a capture)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Capture:
    """What ran on this thread inside `capturing()`: the plans, and the launches as
    (compiled kernel, grid, positional arguments, constexpr tail); a launch that cannot be replayed
    (no compiled kernel to call again) appends None."""

    plans: list[Any] = field(default_factory=list)
    launches: list[Any] = field(default_factory=list)


class _Active(threading.local):
    capture: Capture | None = None


CAPTURE = _Active()


@contextlib.contextmanager
def capturing() -> Iterator[Capture]:
    """Capture the plans and launches this thread runs inside the block (no nesting: an outer capture pauses)."""
    before, CAPTURE.capture = CAPTURE.capture, Capture()
    try:
        yield CAPTURE.capture
    finally:
        CAPTURE.capture = before
