"""Caching allocator for device, host and pinned memory, with size-class bins and event-guarded reuse.

Why on top of PyTorch on CUDA: every GPU kernel here (Triton, cuBLAS through torch, nvmath) consumes
torch tensors, so blocks are uint8 tensors from `torch.empty(..., device=)`: memory stays visible to
PyTorch's own accounting (`torch.cuda.memory_allocated`), shares its driver context, and a block can be
viewed as a typed tensor without a copy or a DLPack round trip. cuda-python would add a second pool
competing with PyTorch's for the same memory.

Rules:
- every block is at least 256-byte aligned and its size is a size class: multiples of 512 bytes up to
  1 MiB, then eight classes per power of two (at most 12.5 % slack);
- a freed block goes back to the bin of the stream it was allocated on and is reused at once on that
  stream (stream order protects it), once the events recorded at free time on the other streams that
  used it (`record_stream`) have completed; it never moves to another stream while cached, so a block is
  never handed out while a kernel may still read or write it, and the common case records no event;
- `empty_cache()` synchronizes the device and returns every cached block (which then serves any stream);
- `stats()` reports bytes in use / cached / peak and counts.

`empty(shape, dtype, stream)` gives a typed array whose block returns to the cache when the array
and all its views are gone. Kernel outputs use PyTorch's own allocator (`torch.empty`) when it is
faster: see `benchmarks/dispatch_overhead.py` for the measurement.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import streams

ALIGNMENT = 256
SMALL_LIMIT = 1 << 20
SMALL_GRANULE = 512
KINDS = ("device", "host", "pinned")


def size_class(nbytes: int) -> int:
    """The block size serving a request of `nbytes` (never below 512 bytes)."""
    if nbytes <= SMALL_LIMIT:
        return max(SMALL_GRANULE, -(-nbytes // SMALL_GRANULE) * SMALL_GRANULE)
    step = (1 << ((nbytes - 1).bit_length() - 1)) // 8  # an eighth of the power of two below
    return -(-nbytes // step) * step


@dataclass(frozen=True)
class AllocatorStats:
    kind: str
    device: str
    bytes_in_use: int  # handed out now (block sizes)
    bytes_cached: int  # held free in the bins
    peak_bytes_in_use: int
    bytes_reserved: int  # in use + cached
    allocations: int  # allocate() calls
    frees: int
    cache_hits: int  # allocations served from the bins
    cache_misses: int  # allocations that asked the system for memory
    blocks_in_use: int
    blocks_cached: int
    oom_retries: int  # allocations that had to empty the cache first


class Block:
    """A span of memory from the allocator: `data` (uint8 array or tensor of `size` bytes), `ptr`."""

    __slots__ = ("data", "events", "nbytes", "ptr", "size", "stream", "used_on")

    def __init__(self, data: Any, ptr: int, size: int) -> None:
        self.data = data
        self.ptr = ptr
        self.size = size
        self.nbytes = 0  # bytes asked for by the current user
        self.stream: Any = None  # the stream the block was last allocated on
        self.used_on: list = []  # other streams it was used on (record_stream)
        self.events: list[tuple[Any, Any]] = []  # (stream, event) recorded at free time

    def view(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """The first bytes of the block as a typed, contiguous array of `shape` (no copy)."""
        return _typed_view(self.data, shape, dtype)


class Arena:
    """Where blocks come from and how their streams are tracked; one subclass per memory kind."""

    kind = "host"

    def __init__(self, device: str = "cpu") -> None:
        self.device = device

    def alloc(self, size: int) -> tuple[Any, int]:
        """(buffer of `size` bytes, its 256-aligned address); raises MemoryError when out of memory."""
        raw = np.empty(size + ALIGNMENT, np.uint8)
        offset = -raw.ctypes.data % ALIGNMENT
        buffer = raw[offset : offset + size]
        return buffer, buffer.ctypes.data

    def current_stream(self) -> Any:
        """The stream that `stream=None` stands for now (host memory has none)."""
        return None

    def record(self, stream: Any) -> Any:
        """An event on `stream` marking the work enqueued so far (None: nothing to wait for)."""
        return None

    def ready(self, event: Any) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def release(self) -> None:
        """Called after cached blocks were dropped (e.g. to let PyTorch return them to the driver)."""


class TorchDeviceArena(Arena):
    """CUDA memory as uint8 tensors from PyTorch; events are torch.cuda.Events."""

    kind = "device"

    def __init__(self, device: str = "cuda:0") -> None:
        import torch

        super().__init__(device)
        self._torch = torch
        self._device = torch.device(device)

    def alloc(self, size: int) -> tuple[Any, int]:
        torch = self._torch
        try:
            buffer = torch.empty(size, dtype=torch.uint8, device=self._device)
        except torch.cuda.OutOfMemoryError as exc:
            raise MemoryError(str(exc)) from None
        ptr = buffer.data_ptr()
        if ptr % ALIGNMENT:  # PyTorch's blocks are 512-aligned; never rely on it silently
            raw = torch.empty(size + ALIGNMENT, dtype=torch.uint8, device=self._device)
            offset = -raw.data_ptr() % ALIGNMENT
            buffer = raw[offset : offset + size]
            ptr = buffer.data_ptr()
        return buffer, ptr

    def current_stream(self) -> Any:
        return streams.current_stream(self.device)  # cached: torch.cuda.current_stream costs ~3 µs a call

    def record(self, stream: Any) -> Any:
        event = self._torch.cuda.Event()
        event.record(stream if stream is not None else self._torch.cuda.current_stream(self._device))
        return event

    def ready(self, event: Any) -> bool:
        return event is None or bool(event.query())

    def synchronize(self) -> None:
        self._torch.cuda.synchronize(self._device)

    def release(self) -> None:
        self._torch.cuda.empty_cache()


class PinnedArena(TorchDeviceArena):
    """Page-locked host memory (fast, asynchronous copies); guarded by events on the copying streams."""

    kind = "pinned"

    def __init__(self, device: str = "cuda:0") -> None:
        super().__init__(device)

    def alloc(self, size: int) -> tuple[Any, int]:
        torch = self._torch
        try:
            raw = torch.empty(size + ALIGNMENT, dtype=torch.uint8, pin_memory=True)
        except RuntimeError as exc:
            raise MemoryError(str(exc)) from None
        offset = -raw.data_ptr() % ALIGNMENT
        buffer = raw[offset : offset + size]
        return buffer, buffer.data_ptr()


class CachingAllocator:
    """Size-class bins of free blocks per stream, extra-stream use guarded by events; thread-safe."""

    def __init__(self, arena: Arena) -> None:
        self.arena = arena
        self.kind = arena.kind
        self.device = arena.device
        self._bins: dict[tuple[Any, int], list[Block]] = {}  # (stream, size class) -> free blocks
        self._in_use: dict[int, Block] = {}  # id(block) -> block
        self._lock = threading.Lock()
        self._in_use_bytes = self._cached_bytes = self._peak = 0
        self._allocations = self._frees = self._hits = self._misses = self._oom_retries = 0

    # -- allocation ------------------------------------------------------------------------------
    def allocate(self, nbytes: int, stream: Any = None) -> Block:
        """A block of at least `nbytes` usable on `stream` (default: the current stream) now."""
        if nbytes < 0:
            raise ValueError(f"allocate: nbytes must be >= 0, got {nbytes}")
        if stream is None:  # binned under the stream it stands for now, not under None for every stream
            stream = self.arena.current_stream()
        size = size_class(nbytes)
        with self._lock:
            self._allocations += 1
            block = self._take_cached(size, stream)
            if block is not None:
                self._hits += 1
                self._cached_bytes -= size
        if block is None:
            block = self._new_block(size)
        block.nbytes, block.stream, block.used_on, block.events = nbytes, stream, [], []
        with self._lock:
            self._in_use[id(block)] = block
            self._in_use_bytes += size
            self._peak = max(self._peak, self._in_use_bytes)
        return block

    def _take_cached(self, size: int, stream: Any) -> Block | None:
        """The newest free block of this class on `stream` whose other-stream events have completed."""
        free = self._bins.get((stream, size))
        if not free:
            return None
        for i in range(len(free) - 1, -1, -1):  # newest first: warmest in cache
            if all(self.arena.ready(e) for e in free[i].events):
                return free.pop(i)
        return None

    def _new_block(self, size: int) -> Block:
        with self._lock:
            self._misses += 1
        try:
            buffer, ptr = self.arena.alloc(size)
        except MemoryError:
            with self._lock:
                self._oom_retries += 1
            self.empty_cache()  # give back what is cached, then try once more
            buffer, ptr = self.arena.alloc(size)
        return Block(buffer, ptr, size)

    # -- release ---------------------------------------------------------------------------------
    def record_stream(self, block: Block, stream: Any) -> None:
        """Mark `block` as used on another stream too: its reuse will wait for that stream's work."""
        if stream != block.stream and stream not in block.used_on:
            block.used_on.append(stream)

    def free(self, block: Block) -> None:
        """Return `block` to its stream's bin; events recorded now on the other streams that used it
        guard its reuse."""
        events = [self.arena.record(s) for s in block.used_on]
        with self._lock:
            if self._in_use.pop(id(block), None) is None:
                raise ValueError("free: block is not in use (freed twice, or from another allocator)")
            block.events = [e for e in events if e is not None]
            self._in_use_bytes -= block.size
            self._cached_bytes += block.size
            self._frees += 1
            self._bins.setdefault((block.stream, block.size), []).append(block)

    def empty(self, shape: tuple[int, ...], dtype: Any, stream: Any = None) -> Any:
        """A typed array from the cache; its block is freed once the array and its views are gone."""
        shape = tuple(shape)
        if any(n < 0 for n in shape):
            raise ValueError(f"empty: dimensions must be >= 0, got shape {shape}")
        block = self.allocate(math.prod(shape) * _itemsize(dtype), stream)
        try:
            array = block.view(shape, dtype)
        except BaseException:
            self.free(block)  # a dtype the memory kind cannot hold must not leak the block
            raise
        weakref.finalize(_owner(array), self.free, block).atexit = False  # no device calls at interpreter exit
        return array

    def empty_cache(self) -> None:
        """Drop every cached block once the device has synchronized (their memory goes back to the arena).

        The bins are taken before the synchronize: a block freed meanwhile, whose work may have been
        queued after it, stays cached instead of being dropped unsynchronized."""
        with self._lock:
            dropped, self._bins = self._bins, {}
            self._cached_bytes = 0
        self.arena.synchronize()
        dropped.clear()
        self.arena.release()

    def stats(self) -> AllocatorStats:
        with self._lock:
            cached_blocks = sum(len(v) for v in self._bins.values())
            return AllocatorStats(
                self.kind, self.device, self._in_use_bytes, self._cached_bytes, self._peak,
                self._in_use_bytes + self._cached_bytes, self._allocations, self._frees, self._hits, self._misses,
                len(self._in_use), cached_blocks, self._oom_retries,
            )  # fmt: skip

    def reset_peak(self) -> None:
        with self._lock:
            self._peak = self._in_use_bytes


def _itemsize(dtype: Any) -> int:
    size = getattr(dtype, "itemsize", None)  # torch.dtype and np.dtype instances
    return size if isinstance(size, int) else np.dtype(dtype).itemsize


def _typed_view(data: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    """A contiguous `shape` x `dtype` array over the first bytes of a uint8 buffer (NumPy or torch)."""
    if isinstance(data, np.ndarray):
        return _Lease(data, shape, np.dtype(dtype)).array()
    import torch
    from torch.utils import dlpack

    # a storage of its own over the block (DLPack, no copy): it lives exactly as long as some tensor uses it,
    # views, detach() and dtype views included, which the block's own `data` storage never tells
    alias = dlpack.from_dlpack(dlpack.to_dlpack(data))
    out = torch.empty(0, dtype=dtype, device=data.device)
    return out.set_(alias.untyped_storage(), alias.storage_offset() // dtype.itemsize, shape)


class _Lease:
    """Owner object of a NumPy view: NumPy keeps the owner alive while any view exists, so a finalizer
    on it runs only after the last view is gone."""

    __slots__ = ("__array_interface__", "__weakref__", "data")

    def __init__(self, data: np.ndarray, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.data = data
        self.__array_interface__ = {
            "shape": shape, "typestr": dtype.str, "descr": dtype.descr, "version": 3,
            "data": (data.ctypes.data, False), "strides": None,
        }  # fmt: skip

    def array(self) -> np.ndarray:
        return np.asarray(self)


def _owner(array: Any) -> Any:
    """The object whose death means no view of `array` is left (a tensor's storage, not the tensor)."""
    return array.base if isinstance(array, np.ndarray) else array.untyped_storage()


# -- process-wide allocators ---------------------------------------------------------------------
_allocators: dict[tuple[str, str], CachingAllocator] = {}
_lock = threading.Lock()
_ARENAS: dict[str, Callable[[str], Arena]] = {"host": Arena, "device": TorchDeviceArena, "pinned": PinnedArena}


def get_allocator(kind: str = "device", device: str = "cuda:0") -> CachingAllocator:
    """The process-wide allocator for a memory kind ('device', 'host', 'pinned') and device."""
    if kind not in _ARENAS:
        raise ValueError(f"get_allocator: kind must be one of {KINDS}, got {kind!r}")
    device = "cpu" if kind == "host" else device if ":" in device else f"{device}:0"
    key = (kind, device)
    allocator = _allocators.get(key)
    if allocator is None:
        with _lock:
            allocator = _allocators.get(key)
            if allocator is None:
                allocator = _allocators[key] = CachingAllocator(_ARENAS[kind](device))
    return allocator


def stats() -> list[AllocatorStats]:
    """Statistics of every allocator this process created."""
    return [a.stats() for a in list(_allocators.values())]


def empty_cache() -> None:
    """Return every allocator's cached blocks."""
    for allocator in list(_allocators.values()):
        allocator.empty_cache()
