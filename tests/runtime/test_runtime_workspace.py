"""The workspace manager: scratch memory lent per thread and stream, reused, bounded, and statistics that stay
right when threads race."""

from __future__ import annotations

import gc
import sys
import threading
import time
import weakref
from typing import Any

import numpy as np
from conftest import make_toy_registry

from xpuruntime.dispatch import Dispatcher
from xpuruntime.registry import kernel
from xpuruntime.runtime.workspace import WorkspaceManager


def test_workspace_is_lent_per_thread_and_reused():
    manager = WorkspaceManager()
    empty = lambda shape, dtype, dev, stream: np.empty(shape, dtype)  # noqa: E731
    first = manager.lend(100, "cpu", empty)
    again = manager.lend(60, "cpu", empty)
    assert first.nbytes == 100 and again.nbytes == 60 and np.shares_memory(first, again)
    other = []
    thread = threading.Thread(target=lambda: other.append(manager.lend(100, "cpu", empty)))
    thread.start()
    thread.join()
    assert not np.shares_memory(first, other[0])
    assert manager.peak_bytes == 100


def test_kernel_receives_the_workspace_it_asked_for():
    seen = []

    def launch(args):
        seen.append(args.workspace_bytes)
        np.copyto(args.out, args.inputs[0])

    registry = make_toy_registry()
    registry.register_kernel(
        kernel("toy", "scratchy", backend="cpu", workspace_bytes=lambda ctx: 8 * ctx.tensor("x").numel)(launch)
    )
    Dispatcher(registry).run("toy", (np.ones((3, 5)),))
    assert seen == [120]


def test_workspace_views_do_not_pile_up_with_every_new_size():
    manager = WorkspaceManager()
    empty = lambda shape, dtype, dev, stream: np.empty(shape, dtype)  # noqa: E731
    manager.lend(1 << 16, "cpu", empty)
    lent = []
    for n in np.random.default_rng().permutation(np.arange(1, 5001)):  # shapes vary: so do workspace sizes
        view = manager.lend(int(n), "cpu", empty)
        assert view.nbytes == n
        lent.append(weakref.ref(view))
    del view
    gc.collect()
    alive = sum(r() is not None for r in lent)
    assert alive <= 1000, f"{alive} workspace views kept alive after 5000 sizes"


class SlowSize(int):
    """A size whose comparisons take a while, so that a thread updating the peak is caught between reading
    it and writing it (where an unlocked update lets another thread's smaller size win)."""

    delay = 0.0

    def _slow(self, other: Any, compare: Any) -> bool:
        time.sleep(self.delay)
        return compare(int(self), int(other))

    def __gt__(self, other: Any) -> bool:
        return self._slow(other, int.__gt__)

    def __lt__(self, other: Any) -> bool:
        return self._slow(other, int.__lt__)

    def __ge__(self, other: Any) -> bool:
        return self._slow(other, int.__ge__)

    def __le__(self, other: Any) -> bool:
        return self._slow(other, int.__le__)

    __hash__ = int.__hash__


def _empty(shape: tuple[int, ...], dtype: str, device: str, stream: Any) -> np.ndarray:
    return np.empty(shape, dtype)


def test_peak_bytes_keeps_the_largest_size_when_threads_race():
    """Thread 'big' reads the peak (0), thread 'small' reads it too (0); 'big' writes 4096, then 'small'
    would write 64 over it: the update must be one step per thread."""
    big, small = SlowSize(4096), SlowSize(64)
    big.delay, small.delay = 0.02, 0.15
    manager = WorkspaceManager()
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def lend(size: SlowSize) -> None:
        try:
            start.wait()
            manager.lend(size, "cpu", _empty)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=lend, args=(size,)) for size in (big, small)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert manager.peak_bytes == 4096


def test_peak_bytes_is_the_largest_lent_by_many_threads():
    manager = WorkspaceManager()
    sizes = list(range(1, 257))
    np.random.default_rng().shuffle(sizes)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        start = threading.Barrier(16)

        def lend(chunk: list[int]) -> None:
            start.wait()
            for n in chunk:
                manager.lend(n, "cpu", _empty, stream=object())  # a new stream each time: a new buffer
                manager.lend(n, "cpu", _empty)

        threads = [threading.Thread(target=lend, args=(sizes[i::16],)) for i in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(old)
    assert manager.peak_bytes == 256


def test_lends_inside_per_call_are_fresh_and_kept_by_nothing():
    manager = WorkspaceManager()
    empty = lambda shape, dtype, dev, stream: np.empty(shape, dtype)  # noqa: E731
    cached = manager.lend(64, "cpu", empty)
    with manager.per_call():
        with manager.per_call():  # nests
            inner = manager.lend(64, "cpu", empty)
        fresh = manager.lend(64, "cpu", empty)
    assert fresh.nbytes == inner.nbytes == 64
    assert not np.shares_memory(fresh, cached) and not np.shares_memory(fresh, inner)
    gone = weakref.ref(fresh)
    del fresh
    gc.collect()
    assert gone() is None
    assert np.shares_memory(manager.lend(64, "cpu", empty), cached)  # outside: the cached buffer again
