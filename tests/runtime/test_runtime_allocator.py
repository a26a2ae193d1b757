"""The caching allocator: size classes, alignment, event-guarded per-stream reuse, stats, typed arrays."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from xpuruntime.runtime import allocator as alloc
from xpuruntime.runtime.allocator import ALIGNMENT, Arena, CachingAllocator, size_class


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
