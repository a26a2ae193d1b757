"""Workspace manager: lends a kernel the scratch memory its workspace-size function asked for.

One buffer per (thread, device, stream) is kept and grown on demand, so concurrent dispatches never share
scratch memory and a steady workload allocates nothing after warm-up.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class WorkspaceManager:
    def __init__(self) -> None:
        self._local = threading.local()
        self.peak_bytes = 0

    def lend(self, nbytes: int, device: str, empty: Callable[..., Any], stream: Any = None) -> Any:
        """A uint8 buffer of exactly `nbytes` on `device` for use on `stream` (a view of this thread's
        cached buffer for that stream: work queued on one stream never shares scratch with another)."""
        buffers = getattr(self._local, "buffers", None)
        if buffers is None:
            buffers = self._local.buffers = {}
        key = (device, stream)
        buffer = buffers.get(key)
        if buffer is None or buffer.shape[0] < nbytes:
            buffer = buffers[key] = empty((nbytes,), "uint8", device, stream)
            self.peak_bytes = max(self.peak_bytes, nbytes)
        return buffer[:nbytes]
