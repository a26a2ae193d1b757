"""Streams and events: thin wrappers over PyTorch's CUDA streams/events, or cuda.core's when torch is absent.

Kernels launch on the caller's current stream (`current_stream(device)`), the one PyTorch code around
them uses, so ordering with the caller's own work needs no extra synchronization. `Event` is what
`SyncPolicy.EVENT_RECORD` hands back: `event.synchronize()` blocks the host until the kernel is done,
`event.query()` polls, `stream.wait(event)` orders another stream after it. On the CPU everything has
completed by the time a call returns, so `CompletedEvent` answers at once.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from ..errors import XpuRuntimeError


def _torch() -> Any:
    """PyTorch if importable with CUDA, else None (never imports it for CPU-only callers twice)."""
    torch = sys.modules.get("torch")
    if torch is None:
        try:
            import torch
        except ImportError:
            return None
    return torch if torch.cuda.is_available() else None


@functools.lru_cache(maxsize=64)
def device_index(device: str) -> int:
    """'cuda:1' -> 1, 'cuda' -> 0."""
    _, _, index = device.partition(":")
    return int(index) if index else 0


class CompletedEvent:
    """An event that has already happened (CPU launches are synchronous)."""

    __slots__ = ()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass


COMPLETED = CompletedEvent()


class Event:
    """A device event: recorded on a stream, then queried, waited on or timed."""

    __slots__ = ("raw",)

    def __init__(self, raw: Any) -> None:
        self.raw = raw  # torch.cuda.Event or cuda.core Event

    def query(self) -> bool:
        """True once all work before the record point has finished."""
        raw = self.raw
        return bool(raw.query()) if hasattr(raw, "query") else bool(raw.is_done)

    def synchronize(self) -> None:
        """Block the host until the recorded work is done."""
        self.raw.synchronize() if hasattr(self.raw, "synchronize") else self.raw.sync()

    def wait(self, stream: Any = None) -> None:
        """Make `stream` (default: the current one) wait for this event without blocking the host."""
        target = _raw(stream) if stream is not None else None
        if hasattr(self.raw, "wait"):  # torch
            self.raw.wait(target)
        elif target is None:  # cuda.core has no notion of a current stream
            raise XpuRuntimeError("Event.wait: without PyTorch, pass the stream that should wait (stream=...)")
        else:
            target.wait(self.raw)

    def elapsed_ms(self, end: Event) -> float:
        """Milliseconds between this event and a later one (both created with timing=True)."""
        return float(self.raw.elapsed_time(end.raw)) if hasattr(self.raw, "elapsed_time") else float(end.raw - self.raw)


class Stream:
    """A device stream; `with stream:` makes it PyTorch's current stream for the block."""

    __slots__ = ("_context", "raw")

    def __init__(self, raw: Any) -> None:
        self.raw = raw  # torch.cuda.Stream or cuda.core Stream
        self._context: Any = None

    @property
    def handle(self) -> int:
        """The cudaStream_t as an integer (for raw kernel launches)."""
        raw = self.raw
        return int(raw.cuda_stream) if hasattr(raw, "cuda_stream") else int(raw.handle)

    def synchronize(self) -> None:
        self.raw.synchronize() if hasattr(self.raw, "synchronize") else self.raw.sync()

    def record_event(self, timing: bool = False) -> Event:
        """An event recorded now on this stream."""
        torch = _torch()
        if torch is not None and isinstance(self.raw, torch.cuda.Stream):
            event = torch.cuda.Event(enable_timing=timing)
            event.record(self.raw)
            return Event(event)
        options = _cuda_core("EventOptions")(enable_timing=timing)
        return Event(self.raw.record(options=options))

    def wait(self, event: Event) -> None:
        event.wait(self)

    def __enter__(self) -> Stream:
        torch = _torch()
        if torch is None:
            raise XpuRuntimeError(
                "with Stream: making a stream current needs PyTorch with CUDA; pass it to kernels instead"
            )
        self._context = torch.cuda.stream(self.raw)
        self._context.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._context.__exit__(*exc)
        self._context = None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and self.handle == other.handle

    def __hash__(self) -> int:
        return hash(self.handle)

    def __repr__(self) -> str:
        return f"Stream(0x{self.handle:x})"


def _raw(stream: Any) -> Any:
    return stream.raw if isinstance(stream, Stream) else stream


def current_stream(device: str) -> Any:
    """The caller's current stream on `device` as PyTorch sees it (a torch.cuda.Stream); None on the CPU.

    Hot path (once per dispatch): the raw cudaStream_t is read from PyTorch and mapped to a cached
    torch.cuda.Stream object, instead of building a new one each call.
    """
    entry = _cuda_devices.get(device)
    if entry is not None:
        index, raw_current = entry
        stream = _stream_objects.get((index, raw_current(index)))
        if stream is not None:
            return stream
    return _current_stream_slow(device)


_cuda_devices: dict[str, tuple[int, Any]] = {}  # device string -> (index, PyTorch's raw current-stream getter)
_stream_objects: dict[tuple[int, int], Any] = {}  # (device index, cudaStream_t) -> torch.cuda.Stream


def _current_stream_slow(device: str) -> Any:
    """First call for a device or stream: fill the caches (PyTorch), or ask cuda.core without PyTorch."""
    if not device.startswith("cuda"):
        return None
    index = device_index(device)
    torch = _torch()
    if torch is None:
        return _cuda_core_device(index).default_stream
    stream = torch.cuda.current_stream(index)
    raw_current = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw_current is not None:  # the function Triton uses too; absent only in unusual builds
        _cuda_devices[device] = (index, raw_current)
        _stream_objects[(index, stream.cuda_stream)] = stream
    return stream


def new_stream(device: str = "cuda:0", priority: int = 0) -> Stream:
    """A new (non-default) stream on `device`."""
    torch = _torch()
    if torch is not None:
        return Stream(torch.cuda.Stream(device_index(device), priority=priority))
    return Stream(_cuda_core_device(device_index(device)).create_stream())


def record_event(device: str, stream: Any = None, timing: bool = False) -> Event | CompletedEvent:
    """Record an event on `stream` (default: the current stream of `device`); CPU work is already done."""
    if not device.startswith("cuda"):
        return COMPLETED
    torch = _torch()
    if torch is not None:
        event = torch.cuda.Event(enable_timing=timing)
        event.record(_raw(stream) if stream is not None else torch.cuda.current_stream(device_index(device)))
        return Event(event)
    raw = _raw(stream) if stream is not None else current_stream(device)
    return Stream(raw).record_event(timing)


def synchronize(device: str, stream: Any = None) -> None:
    """Wait for `stream`, or for the whole device when no stream is given."""
    if not device.startswith("cuda"):
        return
    if stream is not None:
        _raw(stream).synchronize() if hasattr(_raw(stream), "synchronize") else _raw(stream).sync()
        return
    torch = _torch()
    if torch is not None:
        torch.cuda.synchronize(device_index(device))
    else:
        _cuda_core_device(device_index(device)).sync()


def _cuda_core(name: str) -> Any:
    """A cuda.core class, from its stable or (older releases) experimental namespace."""
    import importlib

    for module in ("cuda.core", "cuda.core.experimental"):
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
    raise ImportError(f"cuda.core with {name} is not installed")


@functools.lru_cache(maxsize=16)
def _cuda_core_device(index: int) -> Any:
    dev = _cuda_core("Device")(index)
    dev.set_current()
    return dev
