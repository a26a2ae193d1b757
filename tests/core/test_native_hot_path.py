"""The dispatcher's hot path in C (runtime/hot_path.cpp): its plan-cache key gives exactly the Python key's
tuples, so plans made with either stay valid when the extension loads; its plan-cache hit does what
`Dispatcher.run` does in Python (outputs, statistics, errors, references); and how the extension loads."""

from __future__ import annotations

import collections
import os
import shutil
import subprocess
import sys
import threading
import traceback

import numpy as np
import pytest
import torch
from conftest import make_toy_registry
from hypothesis import given, settings
from hypothesis import strategies as st
from pytorch_cpu_routing import run_without_extension

import xpuruntime as xrt
from xpuruntime import arguments, arrays, dispatch
from xpuruntime.abi import ArgPack, LaunchConfig
from xpuruntime.arrays import NotAnArray
from xpuruntime.dispatch import Dispatcher
from xpuruntime.errors import LaunchError
from xpuruntime.registry import Backend, Registry, kernel
from xpuruntime.runtime import extension
from xpuruntime.schema import OpSchema

needs_compiler = pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "c++")) is None, reason="no C++ compiler: the extension cannot build"
)


def _tensors(device: str) -> list[torch.Tensor]:
    base = torch.randn(6, 10, device=device)
    return [
        base,
        base.t(),  # transposed: strides
        base[1:, 3:],  # an offset: 4-byte steps break 16-byte alignment
        base[:, ::3],  # strided columns
        base[:1],  # a size-1 dim
        torch.randn(1, 7, device=device).expand(5, 7),  # stride 0
        torch.empty(0, 4, device=device),
        torch.tensor(2.5, device=device),  # 0-dim
        torch.randn(2, 3, 4, 5, device=device).to(memory_format=torch.channels_last),
        torch.randn(3, 5, device=device, dtype=torch.bfloat16),
        torch.randn(3, 5, device=device, dtype=torch.complex64),
        torch.ones(4, device=device, dtype=torch.bool),
        torch.nn.Parameter(torch.randn(3, 3, device=device)),  # a subclass
        torch.randn(4, 4, device=device, requires_grad=True) * 2,  # an autograd result
    ]


def _check_keys_match(device: str) -> None:
    c_key = extension.load().cuda_tensor_key
    for t in _tensors(device):
        got, want = c_key(t), arrays.python_cuda_tensor_key(t)
        assert got == want and hash(got) == hash(want), (t.shape, t.stride(), got, want)
        assert [type(x) for x in got] == [type(x) for x in want]


@needs_compiler
def test_c_key_equals_the_python_key_on_every_layout():
    _check_keys_match("cpu")  # the function reads any tensor; the dispatcher calls it for CUDA ones


@needs_compiler
def test_c_key_names_a_wrong_argument():
    c_key = extension.load().cuda_tensor_key
    with pytest.raises(TypeError, match=r"cuda_tensor_key: expected a tensor, got list"):
        c_key([1.0, 2.0])


@needs_compiler
def test_loading_the_extension_switches_the_dispatcher_key_and_hits_to_c():
    module = extension.load()
    assert arguments.plan_key is module.plan_key and dispatch._hit_in_c is module.plan_hit
    assert extension.status() == "built and loaded"


def _key_or_error(make_key, *args):
    try:
        return make_key(*args)
    except (NotAnArray, TypeError) as exc:
        return type(exc)


def _array(dtype: type, rows: int, cols: int, step: int, transpose: bool) -> np.ndarray:
    """A random (rows, cols) array, strided when step > 1, transposed on request."""
    a = np.random.default_rng(rows * 31 + cols).standard_normal((rows, cols * step)).astype(dtype)[:, ::step]
    return a.T if transpose else a


_ARRAYS = st.builds(
    _array, st.sampled_from([np.float32, np.float64, np.int64, np.bool_, np.float16]),
    st.integers(0, 4), st.integers(1, 5), st.integers(1, 3), st.booleans(),
)  # fmt: skip
_ARGS = st.one_of(
    _ARRAYS, st.floats(allow_nan=False), st.integers(-5, 5), st.booleans(), st.none(),
    st.just(np.float32(1.5)), st.just(torch.ones(2, 3)), st.just([1.0, 2.0]), st.just("text"),
)  # fmt: skip
_ATTRS = st.recursive(
    st.one_of(st.integers(-3, 3), st.floats(allow_nan=False), st.just(-0.0), st.booleans(), st.none(), st.text(max_size=3)),
    lambda inner: st.tuples(inner, inner) | st.lists(inner, max_size=2),
    max_leaves=4,
)  # fmt: skip


@needs_compiler
@settings(max_examples=300, deadline=None)
@given(
    inputs=st.lists(_ARGS, max_size=4), attrs=st.lists(_ATTRS, max_size=3), out=st.one_of(st.none(), _ARRAYS),
    as_tuples=st.booleans(),
)  # fmt: skip
def test_c_plan_key_equals_the_python_plan_key(inputs, attrs, out, as_tuples):
    """Arrays of any layout, scalars, None, NumPy scalars, CPU tensors, lists, nested attributes, -0.0."""
    c_key = extension.load().plan_key
    call = ("matmul", 7, tuple(attrs) if as_tuples else attrs, tuple(inputs) if as_tuples else inputs, out)
    got, want = _key_or_error(c_key, *call), _key_or_error(arguments.python_plan_key, *call)
    assert got == want
    if isinstance(want, tuple):
        assert [type(x) for x in got] == [type(x) for x in want]
        assert _key_or_error(hash, got) == _key_or_error(hash, want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@needs_compiler
def test_c_keys_equal_the_python_keys_on_cuda_tensors():
    _check_keys_match("cuda")
    c_key = extension.load().plan_key
    for t in _tensors("cuda"):
        call = ("sum", 3, (-1, False), (t, 2.0, None), None)
        assert c_key(*call) == arguments.python_plan_key(*call)


def test_load_soon_builds_on_a_background_thread_once(monkeypatch, tmp_path):
    """No library yet: one background build starts, and the calling thread does not wait for it."""
    release, threads = threading.Event(), []

    def slow_build():
        threads.append(threading.current_thread().name)
        release.wait(10)
        return None

    state = extension._State()
    monkeypatch.setattr(extension, "_state", state)
    monkeypatch.setattr(extension, "_library", lambda: tmp_path / "missing.so")
    monkeypatch.setattr(extension, "_build_and_load", slow_build)
    monkeypatch.delenv(extension.ENV_SWITCH, raising=False)
    extension.load_soon()
    extension.load_soon()
    assert state.building and not state.tried
    release.set()
    assert extension.load() is None  # waits for the build under way
    assert threads == ["xpuruntime-extension-build"] and state.tried


def test_disabled_extension_keeps_the_python_key():
    code = (
        "import torch\nfrom xpuruntime import arguments\nfrom xpuruntime.runtime import extension\n"
        "assert extension.load() is None\nassert arguments.plan_key is arguments.python_plan_key\n"
        "from xpuruntime import dispatch\nassert dispatch._hit_in_c is None\n"
        "print(extension.status())\n"
    )
    assert "disabled by XPURUNTIME_NATIVE=0" in run_without_extension(code)


@needs_compiler
def test_a_failing_cuda_tensor_key_releases_what_the_key_held():
    """A CUDA tensor whose storage cannot be read (a fake one under vmap) raises as in Python, and the
    half-built key is released: the call's op, fingerprint and attributes keep their reference counts."""
    from torch._C._functorch import _add_batch_dim, _vmap_decrement_nesting, _vmap_increment_nesting
    from torch._subclasses.fake_tensor import FakeTensorMode

    c_key = extension.load().plan_key
    with FakeTensorMode():
        fake = torch.empty(3, 4, device="cuda")
    level = _vmap_increment_nesting(3, "error")
    try:
        batched = _add_batch_dim(torch.Tensor.as_subclass(fake, torch.Tensor), 0, level)
        op, fingerprint, attrs = "an op of its own", object(), (1.5, 2)
        with pytest.raises(RuntimeError, match="storage"):
            arguments.python_plan_key(op, fingerprint, attrs, (batched,), None)
        before = [sys.getrefcount(x) for x in (op, fingerprint, attrs)]
        for _ in range(200):
            with pytest.raises(RuntimeError, match="storage"):
                c_key(op, fingerprint, attrs, (batched,), None)
        assert [sys.getrefcount(x) for x in (op, fingerprint, attrs)] == before
    finally:
        _vmap_decrement_nesting()


# -- the plan-cache hit in C ------------------------------------------------------------------------------


@pytest.fixture
def c_hits(monkeypatch):
    """The C hit path on, with a count of the calls it served (NOT_HIT answers are not counted)."""
    extension.load()
    real, served = dispatch._hit_in_c, []
    assert real is not None

    def counted(*args):
        result = real(*args)
        if result is not dispatch.NOT_HIT:
            served.append(args[2])
        return result

    monkeypatch.setattr(dispatch, "_hit_in_c", counted)
    return served


@pytest.fixture
def c_hit_path():
    """The extension loaded, so that calls without out= go through `plan_hit` first (not wrapped: some tests
    read the frames of a traceback)."""
    extension.load()
    assert dispatch._hit_in_c is not None


def _toy(launch, *, backend: Backend | None = None, **hints) -> Dispatcher:
    """A dispatcher of its own for the toy op (y = x) with one kernel `launch`."""
    registry = make_toy_registry()
    if backend is not None:
        registry.register_backend(backend)
    registry.register_kernel(kernel("toy", "k", backend=backend.name if backend else "cpu", **hints)(launch))
    return Dispatcher(registry)


def _add_one(args: ArgPack) -> None:
    np.add(args.inputs[0], 1.0, out=args.out)


def _python_hits(monkeypatch) -> None:
    monkeypatch.setattr(dispatch, "_hit_in_c", None)


@needs_compiler
@settings(max_examples=60, deadline=None)
@given(case=st.sampled_from(["matmul", "sin_affine", "sum", "softmax"]), rows=st.integers(1, 9),
       cols=st.integers(1, 9), step=st.integers(1, 3), transpose=st.booleans())  # fmt: skip
def test_a_c_hit_gives_the_python_hits_output_bit_for_bit(case, rows, cols, step, transpose):
    extension.load()
    a = _array(np.float32, rows, cols, step, transpose)
    call = {
        "matmul": ("matmul", (a, a.T), ()), "sin_affine": ("sin_affine", (a, 1.5, -0.25), ()),
        "sum": ("sum", (a,), (-1, False)), "softmax": ("softmax", (a,), (-1,)),
    }[case]  # fmt: skip
    dispatcher = Dispatcher()
    first = dispatcher.run(*call)  # the miss, in Python
    assert (
        dispatch._hit_in_c is not None
        and dispatcher.plans.get(
            arguments.plan_key(call[0], dispatch.current_policy().fingerprint, call[2], call[1], None)
        ).hit_path
    )
    hit = dispatcher.run(*call)
    assert hit is not first and hit.flags.c_contiguous
    np.testing.assert_array_equal(hit, first)
    np.testing.assert_allclose(
        hit, Dispatcher().registry.op(call[0]).reference(*call[1], *call[2]), rtol=2e-5, atol=2e-5
    )


@needs_compiler
def test_a_c_hit_counts_in_the_plan_cache_as_a_python_hit(c_hits, monkeypatch):
    x = np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32)
    y = x[:, ::2]
    dispatcher = _toy(_add_one)
    for z in (x, x, y, x, y, y):
        np.testing.assert_array_equal(dispatcher.run("toy", (z,)), z + 1.0)
    c_stats = dispatcher.plans.stats()
    c_clock = sorted(plan.last_used for plan in dispatcher.plans.entries.values())
    assert c_hits == ["toy"] * 4
    _python_hits(monkeypatch)
    python = _toy(_add_one)
    for z in (x, x, y, x, y, y):
        python.run("toy", (z,))
    assert c_stats == python.plans.stats() and c_stats.hits == 4
    assert c_clock == sorted(plan.last_used for plan in python.plans.entries.values())


def _raise_value_error(args: ArgPack) -> None:
    raise ValueError("bad tile")


def _launch_failure(dispatcher: Dispatcher, x: np.ndarray) -> LaunchError:
    with pytest.raises(LaunchError) as info:
        dispatcher.run("toy", (x,))
    return info.value


@needs_compiler
def test_a_failing_launch_on_a_c_hit_raises_the_python_hits_launch_error(c_hits, monkeypatch):
    x = np.ones((2, 3), np.float32) * 0.5
    calls = []

    def fail_after_the_first(args: ArgPack) -> None:
        calls.append(1)
        if len(calls) > 1:
            _raise_value_error(args)
        _add_one(args)

    dispatcher = _toy(fail_after_the_first)
    dispatcher.run("toy", (x,))
    c_error = _launch_failure(dispatcher, x)
    assert c_hits == []  # a raising call is not counted by the fixture: it served nothing
    assert isinstance(c_error.__cause__, ValueError) and c_error.__suppress_context__
    assert c_error.__cause__.__traceback__ is not None
    _python_hits(monkeypatch)
    python_error = _launch_failure(dispatcher, x)
    assert str(c_error) == str(python_error) and "bad tile" in str(c_error)
    assert type(c_error.__cause__) is type(python_error.__cause__)


@needs_compiler
def test_a_returns_output_kernel_on_a_c_hit(c_hits):
    x = np.random.default_rng(2).standard_normal(7).astype(np.float32)
    returned = []

    def own(args: ArgPack):
        assert args.out is None and args.workspace is None and args.stream is None
        returned.append(None if len(returned) == 2 else args.inputs[0] * 3)
        return returned[-1]

    dispatcher = _toy(own, returns_output=True)
    dispatcher.run("toy", (x,))
    assert dispatcher.run("toy", (x,)) is returned[-1] and c_hits == ["toy"]
    with pytest.raises(LaunchError, match="declares returns_output=True but returned None"):
        dispatcher.run("toy", (x,))


@needs_compiler
def test_an_allocation_failure_on_a_c_hit_propagates_as_in_python(c_hits):
    fail = []

    def empty(shape, dtype, device, stream):
        if fail:
            raise MemoryError("no room")
        return np.empty(shape, dtype)

    dispatcher = _toy(_add_one, backend=Backend("mem", "cpu", empty=empty))
    x = np.ones(4, np.float32)
    dispatcher.run("toy", (x,))
    fail.append(1)
    with pytest.raises(MemoryError, match="no room"):
        dispatcher.run("toy", (x,))


@needs_compiler
def test_calls_the_c_path_cannot_serve_go_through_python(c_hits):
    """out=, a sync after the launch, a workspace, logging, array-likes: Python runs them, with their effects."""
    recorded = []
    backend = Backend("ev", "cpu", empty=lambda shape, dtype, device, stream: np.empty(shape, dtype),
                      record_event=lambda device, stream: recorded.append(device) or "event")  # fmt: skip
    x = np.random.default_rng(3).standard_normal((2, 2)).astype(np.float32)
    synced = _toy(_add_one, backend=backend)
    with xrt.kernel_policy(sync="event_record"):
        for _ in range(3):
            np.testing.assert_array_equal(synced.run("toy", (x,)), x + 1)
    assert recorded == ["cpu"] * 3 and dispatch.last_event() == "event"
    lent = []
    workspace = _toy(lambda args: lent.append(args.workspace.nbytes) or _add_one(args), workspace_bytes=lambda ctx: 64)
    for _ in range(3):
        workspace.run("toy", (x,))
    assert lent == [64] * 3
    plain = _toy(_add_one)
    out = np.full_like(x, np.nan)
    for _ in range(2):
        assert plain.run("toy", (x,), out=out) is out
    np.testing.assert_array_equal(plain.run("toy", ([[1.0, 2.0], [3.0, 4.0]],)), [[2.0, 3.0], [4.0, 5.0]])
    plain.run("toy", (x + 1,))  # the same signature: its plan is made, and later calls hit it
    xrt.enable_dispatch_logging()
    try:
        xrt.clear_dispatch_logs()
        plain.run("toy", (x,))
        records = xrt.get_dispatch_logs()
    finally:
        xrt.disable_dispatch_logging()
    assert c_hits == [] and [(r.op_name, r.cache_hit) for r in records] == [("toy", True)]


@needs_compiler
def test_a_c_hit_holds_no_extra_references(c_hits):
    x = np.random.default_rng(4).standard_normal((3, 3)).astype(np.float32)
    dispatcher = _toy(_add_one)
    inputs = (x,)
    dispatcher.run("toy", inputs)
    plan = next(iter(dispatcher.plans.entries.values()))
    watched = (x, inputs, plan, plan.hit_path, dispatcher.plans, "toy")
    dispatcher.run("toy", inputs)
    c_hits.clear()  # it holds the op name of each call it counts
    before = [sys.getrefcount(obj) for obj in watched]
    for _ in range(500):
        dispatcher.run("toy", inputs)
    assert len(c_hits) == 500
    c_hits.clear()
    assert [sys.getrefcount(obj) for obj in watched] == before
    fail = []
    failing = _toy(lambda args: _raise_value_error(args) if fail else _add_one(args))
    failing.run("toy", inputs)
    fail.append(True)
    before = sys.getrefcount(x)
    for _ in range(200):
        with pytest.raises(LaunchError):
            failing.run("toy", inputs)
    assert sys.getrefcount(x) == before


@needs_compiler
def test_a_kernel_registered_between_hits_is_seen_by_the_c_path(c_hits):
    x = np.ones(5, np.float32)
    dispatcher = _toy(_add_one)
    dispatcher.run("toy", (x,))
    dispatcher.run("toy", (x,))
    better = kernel("toy", "better", backend="cpu", priority=10)(
        lambda args: np.multiply(args.inputs[0], 4, out=args.out)
    )
    dispatcher.registry.register_kernel(better)
    np.testing.assert_array_equal(dispatcher.run("toy", (x,)), x * 4)  # a miss: the plan was dropped
    np.testing.assert_array_equal(dispatcher.run("toy", (x,)), x * 4)
    assert c_hits == ["toy", "toy"]


@needs_compiler
def test_c_hits_from_many_threads_while_plans_are_dropped(c_hits):
    x = np.random.default_rng(5).standard_normal((4, 4)).astype(np.float32)
    dispatcher, errors, stop = _toy(_add_one), [], threading.Event()

    def hammer():
        try:
            for _ in range(3000):
                np.testing.assert_array_equal(dispatcher.run("toy", (x,)), x + 1)
        except Exception as exc:  # pragma: no cover - the assertion below shows it
            errors.append(exc)

    def invalidate():
        while not stop.is_set():
            dispatcher.plans.invalidate()

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    dropper = threading.Thread(target=invalidate)
    dropper.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    dropper.join()
    assert errors == [] and len(c_hits) > 0


# -- edge cases of the C hit path against the Python body (found by review) ---------------------------------


def _fails_after_first(error: type[BaseException]):
    """A launch that works once (the miss makes the plan) and raises a new `error` on every later call (hits)."""
    calls = []

    def launch(args: ArgPack) -> None:
        calls.append(1)
        if len(calls) > 1:
            raise error("bad tile")
        _add_one(args)

    return launch


def _both_paths(monkeypatch, call):
    """call() once with C hits, once with Python hits: (C result, Python result); an exception is the result."""
    results = []
    for c_hits in (True, False):
        if not c_hits:
            monkeypatch.setattr(dispatch, "_hit_in_c", None)
        try:
            results.append(call())
        except BaseException as exc:  # KeyboardInterrupt is what some tests compare
            results.append(exc)
    return results


# -- BaseException from a launch --------------------------------------------------------------------------


@needs_compiler
@pytest.mark.parametrize("error", [KeyboardInterrupt, SystemExit])
def test_a_base_exception_from_a_launch_on_a_c_hit_is_not_wrapped(c_hit_path, error):
    """Dispatcher.run catches only Exception: Ctrl-C in a kernel must stay a KeyboardInterrupt (a LaunchError is
    an Exception, so `except Exception` around a call would swallow the interrupt)."""
    x = np.ones(3, np.float32)
    dispatcher = _toy(_fails_after_first(error))
    dispatcher.run("toy", (x,))
    with pytest.raises(error):
        dispatcher.run("toy", (x,))


# -- inputs that are not exactly a tuple ------------------------------------------------------------------


@needs_compiler
@pytest.mark.parametrize("make", [list, collections.namedtuple("Inputs", "x")._make], ids=["list", "namedtuple"])
def test_inputs_that_are_not_an_exact_tuple_run_as_in_python(c_hit_path, monkeypatch, make):
    """plan_hit raises TypeError('plan_hit: expected ...') for any inputs but an exact tuple, even on a miss;
    the Python path keys them (python_plan_key) and runs them."""
    x = np.arange(3, dtype=np.float32)

    def call():
        dispatcher = _toy(_add_one)
        return [dispatcher.run("toy", make([x])) for _ in range(2)]

    c, python = _both_paths(monkeypatch, call)
    assert not isinstance(python, BaseException)
    assert not isinstance(c, BaseException), c
    np.testing.assert_array_equal(c, python)


# -- LaunchError chaining and tracebacks ------------------------------------------------------------------


def _launch_error_inside_an_except_block(dispatcher: Dispatcher, x: np.ndarray) -> LaunchError:
    try:
        raise KeyError("the caller's own exception")
    except KeyError:
        try:
            dispatcher.run("toy", (x,))
        except LaunchError as exc:
            return exc
    raise AssertionError("no LaunchError")


@needs_compiler
def test_a_c_hit_launch_error_has_the_launch_exception_as_context_inside_an_except_block(c_hit_path, monkeypatch):
    """`raise _launch_error(plan, exc) from exc` gives __context__ = exc; PyErr_SetObject in raise_launch_error
    overwrites the context with the exception the caller is handling."""
    x = np.ones(3, np.float32)
    dispatcher = _toy(_fails_after_first(ValueError))
    dispatcher.run("toy", (x,))
    c, python = _both_paths(monkeypatch, lambda: _launch_error_inside_an_except_block(dispatcher, x))
    assert python.__context__ is python.__cause__
    assert c.__context__ is c.__cause__, repr(c.__context__)


@needs_compiler
def test_a_c_hit_launch_errors_cause_has_the_python_paths_traceback(c_hit_path, monkeypatch):
    """In Python the launch's exception passes through Dispatcher.run, whose frame heads its traceback (the
    'direct cause' part of a report shows the dispatcher's line); the C hit adds no frame."""
    x = np.ones(3, np.float32)
    dispatcher = _toy(_fails_after_first(ValueError))
    dispatcher.run("toy", (x,))

    def cause_frames():
        with pytest.raises(LaunchError) as info:
            dispatcher.run("toy", (x,))
        return [frame.name for frame in traceback.extract_tb(info.value.__cause__.__traceback__)]

    c, python = _both_paths(monkeypatch, cause_frames)
    assert python[0] == "run"
    assert c == python


class _Unprintable:
    def __format__(self, spec: str) -> str:
        raise RuntimeError("cannot describe")


@needs_compiler
def test_an_error_while_building_the_launch_error_keeps_the_launch_exception_as_context(c_hit_path, monkeypatch):
    """_launch_error raising (here: a launch config that cannot be described) is, in Python, raised inside
    `except Exception as exc`, so its __context__ is the launch's exception; the C path calls it after
    PyErr_Fetch, with nothing being handled, and the launch's exception is lost."""
    x = np.ones(3, np.float32)
    config = LaunchConfig(params={"tile": _Unprintable()})
    dispatcher = _toy(_fails_after_first(ValueError), launch_config=lambda ctx: config)
    dispatcher.run("toy", (x,))
    c, python = _both_paths(monkeypatch, lambda: dispatcher.run("toy", (x,)))
    assert isinstance(python, RuntimeError) and isinstance(python.__context__, ValueError)
    assert isinstance(c, RuntimeError) and isinstance(c.__context__, ValueError), repr(c.__context__)


# -- the output --------------------------------------------------------------------------------------------


@needs_compiler
def test_an_allocator_that_gives_none_returns_the_kernels_value_as_in_python(c_hit_path, monkeypatch):
    """Python decides 'the kernel's return value is the output' by `out is None` after allocating; the C path
    decides by returns_output only and hands back the allocator's None."""
    x = np.arange(3, dtype=np.float32)
    nothing = Backend("nothing", "cpu", empty=lambda shape, dtype, device, stream: None)

    def call():
        dispatcher = _toy(lambda args: args.inputs[0] * 5, backend=nothing)
        dispatcher.run("toy", (x,))
        return dispatcher.run("toy", (x,))

    c, python = _both_paths(monkeypatch, call)
    np.testing.assert_array_equal(python, x * 5)
    assert c is not None
    np.testing.assert_array_equal(c, python)


# -- exceptions while keying -------------------------------------------------------------------------------


class _InterruptedHash:
    """An attribute whose hash is interrupted once (Ctrl-C arriving while the key is hashed)."""

    armed = False

    def __hash__(self) -> int:
        if _InterruptedHash.armed:
            _InterruptedHash.armed = False
            raise KeyboardInterrupt
        return 7

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _InterruptedHash)


def _op_with_an_attribute() -> Dispatcher:
    registry = Registry()
    registry.register_op(
        OpSchema(name="toy", inputs=("x",), attrs=("k",), infer_dtype=lambda ctx: ctx.tensor("x").dtype,
                 infer_shape=lambda ctx: ctx.tensor("x").shape, reference=lambda x, k: np.asarray(x, np.float64))
    )  # fmt: skip
    registry.register_backend(Backend("cpu", "cpu", empty=lambda shape, dtype, device, stream: np.empty(shape, dtype)))
    registry.register_kernel(kernel("toy", "k", backend="cpu")(_add_one))
    return Dispatcher(registry)


@needs_compiler
def test_a_keyboard_interrupt_while_the_c_hit_keys_the_call_is_not_swallowed(c_hit_path, monkeypatch):
    """plan_hit clears every exception from keying and lookup (PyErr_Clear) and lets Python key again: an
    interrupt delivered there is lost; Python's path lets everything but NotAnArray and TypeError through."""
    x = np.ones(3, np.float32)
    attr = _InterruptedHash()

    def call():
        dispatcher = _op_with_an_attribute()
        dispatcher.run("toy", (x,), (attr,))
        _InterruptedHash.armed = True
        return dispatcher.run("toy", (x,), (attr,))

    c, python = _both_paths(monkeypatch, call)
    assert isinstance(python, KeyboardInterrupt)
    assert isinstance(c, KeyboardInterrupt), c


# -- loading -----------------------------------------------------------------------------------------------


@needs_compiler
def test_loading_the_extension_before_the_dispatcher_is_imported_still_enables_c_hits():
    """extension.on_load only remembers the hook: an extension loaded before xpuruntime.dispatch is imported
    (importing xpuruntime.runtime.extension does not import it) never reaches the hook, so no hit runs in C."""
    extension.load()  # built and cached: the child process only loads it
    code = (
        "import sys\nfrom xpuruntime.runtime import extension\n"
        "assert 'xpuruntime.dispatch' not in sys.modules\n"
        "assert extension.load() is not None\n"
        "from xpuruntime import dispatch\n"
        "print(dispatch._hit_in_c is not None)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"
