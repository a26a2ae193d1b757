"""The caching allocator: size classes, alignment, event-guarded per-stream reuse (also when a free races
empty_cache), stats, typed arrays whose block lives as long as any alias."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from xpuruntime.runtime import allocator as alloc
from xpuruntime.runtime.allocator import ALIGNMENT, Arena, CachingAllocator, size_class

try:
    import torch
except ImportError:  # the tests of torch-backed blocks skip
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="needs PyTorch")


class FakeEvent:
    def __init__(self) -> None:
        self.done = False


class FakeStreamArena(Arena):
    """Host memory with pretend streams: events stay pending until the test completes them."""

    kind = "device"

    def __init__(self) -> None:
        super().__init__("fake:0")
        self.recorded: list[tuple[str, FakeEvent]] = []
        self.fail_next = 0

    def alloc(self, size):
        if self.fail_next:
            self.fail_next -= 1
            raise MemoryError("out of fake memory")
        return super().alloc(size)

    def record(self, stream):
        event = FakeEvent()
        self.recorded.append((stream, event))
        return event

    def ready(self, event):
        return event.done

    def finish(self, stream=None):
        for s, e in self.recorded:
            if stream is None or s == stream:
                e.done = True


@given(st.integers(0, 1 << 34))
def test_size_class_covers_the_request_with_bounded_slack(n):
    size = size_class(n)
    assert size >= max(n, 512) and size % 512 == 0
    if n > alloc.SMALL_LIMIT:
        assert size - n < n / 8 + 1
    else:
        assert size - max(n, 1) < 512
    assert size_class(size) == size  # classes are fixed points


def test_host_blocks_are_aligned_and_reused():
    rng = np.random.default_rng()
    a = CachingAllocator(Arena())
    sizes = [int(n) for n in rng.integers(0, 3 << 20, size=20)]
    blocks = [a.allocate(n) for n in sizes]
    assert all(b.ptr % ALIGNMENT == 0 and b.size == size_class(n) and b.data.nbytes == b.size
               for b, n in zip(blocks, sizes))  # fmt: skip
    ptrs = {b.ptr for b in blocks}
    assert len(ptrs) == len(blocks), "two live blocks share memory"
    for b in blocks:
        b.data[:] = 7  # writable over the whole block
        a.free(b)
    again = [a.allocate(n) for n in sizes]
    assert {b.ptr for b in again} == ptrs  # all served from the cache
    s = a.stats()
    assert s.cache_hits == len(sizes) and s.cache_misses == len(sizes) and s.allocations == 2 * len(sizes)
    assert s.bytes_in_use == sum(b.size for b in again) and s.bytes_cached == 0
    with pytest.raises(ValueError, match="freed twice"):
        a.free(again[0]) or a.free(again[0])


def test_stats_track_in_use_cached_and_peak():
    a = CachingAllocator(Arena())
    x, y = a.allocate(1000), a.allocate(5 << 20)
    peak = x.size + y.size
    a.free(y)
    s = a.stats()
    assert (s.bytes_in_use, s.bytes_cached, s.peak_bytes_in_use) == (x.size, y.size, peak)
    assert (s.blocks_in_use, s.blocks_cached, s.frees) == (1, 1, 1) and s.bytes_reserved == peak
    a.empty_cache()
    s = a.stats()
    assert s.bytes_cached == 0 and s.blocks_cached == 0 and s.bytes_in_use == x.size


def test_a_block_stays_with_its_stream_and_needs_no_event_there():
    arena = FakeStreamArena()
    a = CachingAllocator(arena)
    block = a.allocate(4096, stream="s1")
    a.free(block)
    assert a.allocate(4096, stream="s1") is block, "same-stream reuse needs no wait (stream order)"
    a.free(block)
    other = a.allocate(4096, stream="s2")
    assert other is not block, "handed to s2 while s1 may still use it"
    a.free(other)
    assert a.allocate(4096, stream="s2") is other and a.allocate(4096, stream="s1") is block
    assert not arena.recorded, "the common case must not record events"


def test_record_stream_guards_reuse_on_the_original_stream_too():
    arena = FakeStreamArena()
    a = CachingAllocator(arena)
    block = a.allocate(10_000, stream="s1")
    a.record_stream(block, "copy")
    a.free(block)
    assert a.allocate(10_000, stream="s1") is not block, "the copy stream may still read it"
    arena.finish("copy")
    assert a.allocate(10_000, stream="s1") is block


def test_empty_cache_synchronizes_then_drops_every_block_and_oom_retries_after_emptying():
    arena = FakeStreamArena()
    arena.synchronize = arena.finish
    a = CachingAllocator(arena)
    pending = a.allocate(2048, stream="s1")
    a.record_stream(pending, "copy")
    a.free(pending)
    a.empty_cache()
    assert a.stats().blocks_cached == 0 and a.stats().bytes_cached == 0
    assert all(e.done for _, e in arena.recorded), "dropped blocks before their work finished"
    kept = a.allocate(4096, stream="s1")
    a.free(kept)
    arena.fail_next = 1
    fresh = a.allocate(1 << 22, stream="s2")  # first try fails: cache emptied, second try succeeds
    assert fresh.size == size_class(1 << 22) and a.stats().oom_retries == 1 and a.stats().blocks_cached == 0


@pytest.mark.parametrize(
    "shape,dtype", [((3, 5, 7), np.float32), ((0, 4), np.float16), ((), np.int64), ((1001,), np.float64)]
)
def test_empty_gives_a_typed_array_that_returns_its_block_when_views_die(shape, dtype):
    a = CachingAllocator(Arena())
    out = a.empty(shape, dtype)
    assert out.shape == shape and out.dtype == dtype and out.flags.c_contiguous and out.flags.writeable
    assert out.ctypes.data % ALIGNMENT == 0
    out[...] = np.random.default_rng().standard_normal(shape).astype(dtype)
    view = out.reshape(-1)[::2]
    del out
    gc.collect()
    assert a.stats().blocks_in_use == 1, "block freed while a view is alive"
    del view
    gc.collect()
    s = a.stats()
    assert s.blocks_in_use == 0 and s.blocks_cached == 1 and s.frees == 1


def test_concurrent_threads_never_share_a_live_block():
    a = CachingAllocator(Arena())
    errors = []

    def worker(seed):
        rng = np.random.default_rng(seed)
        for _ in range(200):
            n = int(rng.integers(1, 20_000))
            b = a.allocate(n)
            b.data[:n] = seed
            if not (b.data[:n] == seed).all():
                errors.append(seed)
            a.free(b)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    s = a.stats()
    assert s.blocks_in_use == 0 and s.allocations == s.frees == 800


def test_process_wide_allocators_and_bad_kind():
    host = alloc.get_allocator("host")
    assert host is alloc.get_allocator("host", "cuda:3") and host.kind == "host"
    assert any(s.kind == "host" for s in alloc.stats())
    with pytest.raises(ValueError, match="kind must be one of"):
        alloc.get_allocator("managed")
    with pytest.raises(ValueError, match="nbytes"):
        host.allocate(-1)


@pytest.mark.gpu
def test_device_and_pinned_allocators_on_cuda():
    torch = pytest.importorskip("torch")
    dev = alloc.get_allocator("device", "cuda:0")
    side = torch.cuda.Stream()
    x = dev.empty((257, 33), torch.float16)
    assert x.is_cuda and x.shape == (257, 33) and x.data_ptr() % ALIGNMENT == 0
    x.copy_(torch.randn(257, 33, device="cuda"))
    block = dev.allocate(1 << 20, torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # keep the side stream busy
    dev.record_stream(block, side)
    dev.free(block)
    assert dev.allocate(1 << 20, torch.cuda.current_stream()) is not block, "reused while side stream busy"
    side.synchronize()
    assert dev.allocate(1 << 20, torch.cuda.current_stream()) is block
    pinned = alloc.get_allocator("pinned", "cuda:0").empty((1000,), torch.float32)
    assert pinned.is_pinned() and pinned.data_ptr() % ALIGNMENT == 0
    del x
    gc.collect()
    assert dev.stats().frees >= 2


class TorchHostArena(Arena):
    """Blocks as uint8 torch tensors (CPU), so `empty` takes the same torch path as device memory."""

    def alloc(self, size):
        raw = torch.empty(size + ALIGNMENT, dtype=torch.uint8)
        offset = -raw.data_ptr() % ALIGNMENT
        buffer = raw[offset : offset + size]
        return buffer, buffer.data_ptr()


ALIASES = {
    "detach": lambda x: x.detach(),
    "data": lambda x: x.data,
    "dtype view": lambda x: x.view(torch.int32),
    "numpy": lambda x: x.numpy(),
    "slice": lambda x: x[1:],
}


def as_numpy(array):
    return array if isinstance(array, np.ndarray) else array.numpy()


@needs_torch
@pytest.mark.parametrize("alias", ALIASES)
def test_a_torch_array_keeps_its_block_while_any_alias_lives(alias):
    a = CachingAllocator(TorchHostArena())
    x = a.empty((4, 8), torch.float32)
    x.copy_(torch.randn(4, 8))
    kept = ALIASES[alias](x)
    expected = as_numpy(kept).copy()
    del x
    gc.collect()
    assert a.stats().blocks_in_use == 1, f"block freed while its {alias} alias is alive"
    other = a.empty((4, 8), torch.float32)
    other.fill_(-1.0)
    np.testing.assert_array_equal(as_numpy(kept), expected)
    del kept, other
    gc.collect()
    s = a.stats()
    assert s.blocks_in_use == 0 and s.frees == 2


@needs_torch
def test_empty_with_bad_shape_or_dtype_raises_clearly_and_leaks_nothing():
    a = CachingAllocator(Arena())
    with pytest.raises(ValueError, match=r"dimensions must be >= 0.*\(-2, -3\)"):
        a.empty((-2, -3), np.float32)  # the product is positive: the size alone does not catch it
    with pytest.raises(ValueError, match=r"dimensions must be >= 0"):
        a.empty((2, -3), np.float32)
    with pytest.raises(TypeError):
        a.empty((2, 3), torch.float32)  # host blocks are NumPy arrays
    s = a.stats()
    assert s.blocks_in_use == 0 and s.bytes_in_use == 0 and s.allocations == s.frees


class PendingArena(Arena):
    """Host memory with pretend streams: events complete only when `synchronize` runs."""

    kind = "device"

    def __init__(self) -> None:
        super().__init__("fake:0")
        self.events: list[dict] = []
        self.during_sync = lambda: None

    def record(self, stream):
        self.events.append({"done": False})
        return self.events[-1]

    def ready(self, event):
        return event["done"]

    def synchronize(self):
        for e in self.events:
            e["done"] = True
        self.during_sync()  # another thread runs right after the device went idle


def test_empty_cache_keeps_a_block_freed_while_it_synchronizes():
    arena = PendingArena()
    a = CachingAllocator(arena)
    early, late = a.allocate(4096, "s1"), a.allocate(8192, "s1")
    a.free(early)
    a.record_stream(late, "copy")  # work on the copy stream is queued after the synchronize

    def free_from_another_thread():
        worker = threading.Thread(target=a.free, args=(late,))
        worker.start()
        worker.join()

    arena.during_sync = free_from_another_thread
    a.empty_cache()
    s = a.stats()
    assert s.blocks_in_use == 0 and s.blocks_cached == 1 and s.bytes_cached == late.size, (
        "a block freed after the synchronize was dropped while its streams may still use it"
    )
    assert a.allocate(8192, "s1") is not late, "handed out before its copy-stream event completed"


class SwitchingArena(PendingArena):
    """Pretend streams with a current one that the test switches, as `with torch.cuda.stream(s):` does."""

    current = "default"

    def current_stream(self):
        return self.current


def test_a_block_allocated_on_the_current_stream_stays_with_that_stream():
    arena = SwitchingArena()
    a = CachingAllocator(arena)
    arena.current = "side"
    block = a.allocate(1 << 20)  # stream=None: the current stream, "side"
    a.free(block)
    arena.current = "default"
    other = a.allocate(1 << 20)
    assert other is not block, "handed to the default stream while the side stream may still use it"
    a.free(other)
    arena.current = "side"
    assert a.allocate(1 << 20) is block and a.allocate(1 << 20, "default") is other


@pytest.mark.gpu
def test_device_block_freed_on_a_busy_side_stream_is_not_reused_on_the_default_stream():
    dev = CachingAllocator(alloc.TorchDeviceArena("cuda:0"))
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        block = dev.allocate(1 << 24)
        torch.cuda._sleep(100_000_000)  # keep the side stream busy
        block.view((1 << 24,), torch.uint8).fill_(1)
    dev.free(block)
    assert dev.allocate(1 << 24) is not block, "reused on the default stream while the side stream writes it"
    torch.cuda.synchronize()
    alias = dev.empty((64, 64), torch.float16)
    kept = alias.detach()
    del alias
    gc.collect()
    assert dev.stats().blocks_in_use == 2, "device block freed while its detached alias lives"
    del kept
