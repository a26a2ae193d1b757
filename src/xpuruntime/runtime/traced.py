"""Kernel launches recorded into a framework's graph instead of run.

While `recording()` is active on a thread, a kernel that declares itself `traceable` (registry.KernelSpec) is
being traced, not run: its tensors are the tracer's stand-ins and its Triton launches go through
`torch.library.wrap_triton`, so torch.compile records each as a node that inductor compiles and launches
from its own generated code (see `xpuruntime.pytorch.custom_ops.inline`)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class NotTraceable(Exception):
    """This launch cannot be recorded faithfully: the caller keeps the op opaque, dispatched at run time."""


class _Recording(threading.local):
    on = False


RECORDING = _Recording()


@contextlib.contextmanager
def recording() -> Iterator[None]:
    """Launches made on this thread inside the block are recorded into the graph being traced."""
    before = RECORDING.on
    RECORDING.on = True
    try:
        yield
    finally:
        RECORDING.on = before
