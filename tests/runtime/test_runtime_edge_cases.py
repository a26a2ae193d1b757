"""Runtime services and autotuning edge cases: aliases of allocator arrays, leaks on bad input, an
empty_cache racing a free, unwritable / corrupt tuning caches, autotune keys, workspace views."""

from __future__ import annotations

import gc
import threading
import warnings
import weakref

import numpy as np
import pytest
from conftest import make_toy_registry

import xpuruntime as xrt
from xpuruntime import autotune
from xpuruntime.dispatch import Dispatcher
from xpuruntime.registry import Backend, Registry, kernel
from xpuruntime.runtime import allocator as alloc
from xpuruntime.runtime import tuning_cache
from xpuruntime.runtime.allocator import ALIGNMENT, Arena, CachingAllocator
from xpuruntime.runtime.tuning_cache import TuningCache, TuningCacheWarning
from xpuruntime.runtime.workspace import WorkspaceManager
from xpuruntime.schema import OpSchema

torch = pytest.importorskip("torch")


# -- allocator ------------------------------------------------------------------------------------
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


# -- tuning cache ---------------------------------------------------------------------------------
def test_an_unwritable_cache_folder_warns_once_and_keeps_results_in_memory(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should be")
    cache = TuningCache(blocker / "tuning")
    keys = [tuning_cache.key("matmul", dtypes="float32", shape=(n, 64)) for n in (100, 300, 900)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        values = [cache.get_or_tune(k, lambda n=n: {"block": n}) for n, k in enumerate(keys)]
        assert [cache.get(k) for k in keys] == values == [{"block": n} for n in range(3)]
    writes = [w for w in caught if "cannot be written" in str(w.message)]
    assert len(writes) == 1 and writes[0].category is TuningCacheWarning


def test_a_corrupt_file_warns_once_per_process_across_cache_instances(tmp_path, monkeypatch):
    k = tuning_cache.key("softmax", dtypes="float16", shape=(4096,))
    monkeypatch.setenv(tuning_cache.ENV_CACHE_DIR, str(tmp_path / "a"))
    monkeypatch.setattr(tuning_cache, "_default", None)
    path = tuning_cache.default_cache().path(k)
    path.parent.mkdir(parents=True)
    path.write_bytes(b'{"format": 1, "key": ')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for folder in ("a", "b", "a", "b", "a"):  # default_cache() follows the variable with new instances
            monkeypatch.setenv(tuning_cache.ENV_CACHE_DIR, str(tmp_path / folder))
            assert tuning_cache.get(k) is None
        assert TuningCache(tmp_path / "a" / "tuning").get(k) is None
    assert [w.category for w in caught] == [TuningCacheWarning], [str(w.message) for w in caught]


# -- autotune keys ----------------------------------------------------------------------------------
@pytest.fixture
def tuning_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(tuning_cache.ENV_CACHE_DIR, str(tmp_path))
    monkeypatch.setattr(tuning_cache, "_default", None)
    autotune.STORE.memory.clear()
    yield tmp_path
    autotune.STORE.memory.clear()


def fake_timing(monkeypatch, times_for):
    """Tuning reports `times_for(ctx)` (µs per kernel name) instead of timing anything."""
    calls = []

    def time_candidates(dispatcher, decision, candidates, inputs, policy):
        calls.append(decision.ctx)
        times = times_for(decision.ctx)
        return {c.kernel.name: times[c.kernel.name] for c in candidates}

    monkeypatch.setattr(autotune, "time_candidates", time_candidates)
    return calls


def test_autotune_never_reuses_a_winner_timed_under_another_math_mode(tuning_dir, monkeypatch):
    registry = make_toy_registry({"name": "k0"}, {"name": "k1"})  # kernel i writes x + i
    fast = {"tf32": "k0", "fp32": "k1"}
    calls = fake_timing(
        monkeypatch, lambda ctx: {n: 1.0 if n == fast[ctx.math_mode.value] else 9.0 for n in fast.values()}
    )
    x = np.random.default_rng().standard_normal(7).astype(np.float32)
    for mode in ("tf32", "fp32"):
        with xrt.kernel_policy(xrt.KernelPolicy(toy="autotune", math_mode=mode, validate=registry)):
            y = Dispatcher(registry).run("toy", (x,))
        ran = round(float((y - x).mean()))
        assert ran == int(fast[mode][1]), f"under {mode} the winner timed under another math mode ran"
    assert [c.math_mode.value for c in calls] == ["tf32", "fp32"]


def pair_registry() -> Registry:
    """An op y = x * w + b whose two optional tensors have the same shape and dtype."""
    registry = Registry()
    registry.register_op(
        OpSchema(
            name="pair", inputs=("x", "w", "b"), optional=frozenset({"w", "b"}),
            infer_dtype=lambda ctx: ctx.tensor("x").dtype, infer_shape=lambda ctx: ctx.tensor("x").shape,
            reference=lambda x, w, b: np.asarray(x, np.float64),
        )
    )  # fmt: skip
    registry.register_backend(Backend("cpu", "cpu", empty=lambda shape, dtype, device, stream: np.empty(shape, dtype)))
    for index in range(2):

        def launch(args, index=index):
            np.add(args.inputs[0], index, out=args.out)

        registry.register_kernel(kernel("pair", f"k{index}", backend="cpu")(launch))
    return registry


def test_autotune_keys_which_optional_argument_was_given(tuning_dir, monkeypatch):
    registry = pair_registry()
    fast = {"w": "k0", "b": "k1"}  # say k0 is fast with a weight, k1 with a bias

    def times_for(ctx):
        given = "w" if ctx["w"] is not None else "b"
        return {n: 1.0 if n == fast[given] else 9.0 for n in fast.values()}

    calls = fake_timing(monkeypatch, times_for)
    rng = np.random.default_rng()
    x, t = rng.standard_normal((2, 5)).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    with xrt.kernel_policy(xrt.KernelPolicy(pair="autotune", validate=registry)):
        for given, inputs in (("w", (x, t, None)), ("b", (x, None, t))):
            y = Dispatcher(registry).run("pair", inputs)
            assert round(float((y - x).mean())) == int(fast[given][1]), f"{given}: another call's winner"
    assert len(calls) == 2


# -- workspace ------------------------------------------------------------------------------------
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


def test_stream_and_event_without_pytorch_fail_with_a_clear_error(monkeypatch):
    """cuda.core has no current stream: waiting on 'the current one' or entering a stream must say so."""
    from xpuruntime.errors import XpuRuntimeError
    from xpuruntime.runtime import streams

    class CoreEvent:  # a cuda.core event has no .wait of its own
        pass

    monkeypatch.setattr(streams, "_torch", lambda: None)
    with pytest.raises(XpuRuntimeError, match=r"Event\.wait: .*stream="):
        streams.Event(CoreEvent()).wait()
    with pytest.raises(XpuRuntimeError, match="needs PyTorch"), streams.Stream(object()):
        pass
