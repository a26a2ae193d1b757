"""Review fixes: atomic workspace statistics under concurrent lends, and `split_weight_grad`'s argument
checks (the cuBLASLt scratch-per-stream fix is tested in test_cublaslt_review2.py)."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import numpy as np
import pytest

import xpuruntime as xrt
from xpuruntime.errors import ArgumentError, ShapeError, XpuRuntimeError
from xpuruntime.runtime.workspace import WorkspaceManager


# -- workspace statistics under concurrent lends ------------------------------------------------------------
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


# -- split_weight_grad's argument checks ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "error", "words"),
    [
        ((None, 2, 3), ArgumentError, ["'grad'", "an array", "None"]),
        ((1.5, 2, 3), ArgumentError, ["'grad'", "an array", "float"]),
        ((np.ones((2, 4)), 2, 3), ShapeError, ["'grad'", "1-d", "8 elements", "2-d"]),
        ((np.ones(7), 2, 3), ShapeError, ["'grad'", "n*k + n = 8", "7 elements"]),
        ((np.ones(6), 2, 3), ShapeError, ["'grad'", "bias=False"]),
        ((np.ones(8), 2.0, 3), ArgumentError, ["'n'", "non-negative int", "2.0"]),
        ((np.ones(8), True, 3), ArgumentError, ["'n'", "non-negative int"]),
        ((np.ones(8), 2, -3), ArgumentError, ["'k'", "non-negative int", "-3"]),
        ((np.ones(8), 2, np.ones(3)), ArgumentError, ["'k'", "non-negative int"]),
        ((np.ones(8), 2, "3"), ArgumentError, ["'k'", "non-negative int"]),
        (([[1.0], [2.0, 3.0]], 1, 1), ArgumentError, ["'grad'", "an array"]),
    ],
)  # fmt: skip
def test_split_weight_grad_errors_name_op_argument_and_expectation(args, error, words):
    with pytest.raises(error) as info:
        xrt.ops.split_weight_grad(*args)
    message = str(info.value)
    assert isinstance(info.value, XpuRuntimeError) and message.startswith("split_weight_grad: argument ")
    for word in words:
        assert word in message, message


def test_split_weight_grad_still_returns_views():
    torch = pytest.importorskip("torch")
    packed = np.arange(8.0)
    dw, db = xrt.ops.split_weight_grad(packed, np.int64(2), 3)
    assert dw.shape == (2, 3) and db.shape == (2,) and np.shares_memory(dw, packed) and np.shares_memory(db, packed)
    tensor = torch.arange(8.0)
    dw, db = xrt.ops.split_weight_grad(tensor, 2, 3)
    assert isinstance(dw, torch.Tensor) and dw.data_ptr() == tensor.data_ptr() and db.tolist() == [6.0, 7.0]
    dw, db = xrt.ops.split_weight_grad([1.0, 2.0, 3.0], 1, 2)  # array-likes, as every op takes them
    assert dw.tolist() == [[1.0, 2.0]] and db.tolist() == [3.0]
    dw, db = xrt.ops.split_weight_grad(np.ones(0), 0, 4)
    assert dw.shape == (0, 4) and db.shape == (0,)
