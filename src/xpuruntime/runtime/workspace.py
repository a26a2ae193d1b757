"""Workspace manager: lends a kernel the scratch memory its workspace-size function asked for.

One buffer per (thread, device, stream) is kept and grown on demand, so concurrent dispatches never share
scratch memory and a steady workload allocates nothing after warm-up. Buffers and views are per thread and
need no lock; the statistics are shared by every thread and change only under the manager's lock.

Inside `per_call()` a lend is instead a fresh buffer that nothing here keeps: it lives as long as the launch
holds it. Calls from torch.compile'd graphs lend this way, because inductor's CUDA graphs
(`mode="reduce-overhead"`) record each graph into a memory pool that must hold nothing but the graph's own
tensors once the graph returns; a cached buffer grown while recording would stay in that pool.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

MAX_VIEWS = 256  # cached views per thread (one per stream, device and size)


class WorkspaceManager:
    """Lends per-(thread, device, stream) scratch buffers. `peak_bytes` is the largest buffer it has
    allocated (any thread); read it freely, it only ever grows, under `_stats_lock`."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._stats_lock = threading.Lock()  # guards the statistics, shared by all threads (growth path only)
        self.peak_bytes = 0

    def lend(self, nbytes: int, device: str, empty: Callable[..., Any], stream: Any = None) -> Any:
        """A uint8 buffer of exactly `nbytes` on `device` for use on `stream` (a view of this thread's
        cached buffer for that stream: work queued on one stream never shares scratch with another;
        inside `per_call()`, a fresh buffer).

        Hot path: the view itself is cached per (stream, device, size), keyed by the stream's id, which
        stays unique while the cache holds the stream (torch.cuda.Stream hashes in Python, slowly)."""
        if getattr(self._local, "per_call", 0):
            return empty((nbytes,), "uint8", device, stream)
        views = getattr(self._local, "views", None)
        if views is None:
            views = self._local.views = {}
        entry = views.get((id(stream), device, nbytes))
        if entry is None:
            if len(views) >= MAX_VIEWS:  # sizes vary with shapes: forget old views rather than keep every one
                views.clear()
            entry = views[(id(stream), device, nbytes)] = (stream, self._slice(nbytes, device, empty, stream))
        return entry[1]

    def per_call(self) -> PerCall:
        """A context in which this thread's lends are fresh buffers, kept by nothing here (see the module
        docstring); nests."""
        return PerCall(self._local)

    def _slice(self, nbytes: int, device: str, empty: Callable[..., Any], stream: Any) -> Any:
        """The first `nbytes` of this thread's buffer for (device, stream), grown if too small (which
        drops the cached views of the old buffer, so that it can be freed)."""
        buffers = getattr(self._local, "buffers", None)
        if buffers is None:
            buffers = self._local.buffers = {}
        key = (device, stream)
        buffer = buffers.get(key)
        if buffer is None or buffer.shape[0] < nbytes:
            buffer = buffers[key] = empty((nbytes,), "uint8", device, stream)
            self._record_allocation(nbytes)
            views = self._local.views
            for old in [k for k, (s, _) in views.items() if s == stream and k[1] == device]:
                del views[old]
        return buffer[:nbytes]

    def _record_allocation(self, nbytes: int) -> None:
        """Update the statistics for a newly allocated buffer: the read-compare-write of the peak is one
        step for every thread (without the lock, a smaller size could overwrite a larger one)."""
        with self._stats_lock:
            if nbytes > self.peak_bytes:
                self.peak_bytes = nbytes


class PerCall:
    """The context `WorkspaceManager.per_call()` returns (a class: cheaper to enter than a generator)."""

    __slots__ = ("_local",)

    def __init__(self, local: threading.local) -> None:
        self._local = local

    def __enter__(self) -> None:
        self._local.per_call = getattr(self._local, "per_call", 0) + 1

    def __exit__(self, *exc: object) -> None:
        self._local.per_call -= 1
