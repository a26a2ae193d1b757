"""The dispatcher's plan-cache key in C (runtime/plan_key.cpp) gives exactly the Python key's tuples, so
plans made with either stay valid when the extension loads; and how the extension gets loaded."""

from __future__ import annotations

import os
import shutil
import sys
import threading

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pytorch_cpu_routing import run_without_extension

from xpuruntime import arguments, arrays
from xpuruntime.arrays import NotAnArray
from xpuruntime.runtime import extension

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
def test_loading_the_extension_switches_the_dispatcher_key_to_c():
    module = extension.load()
    assert arguments.plan_key is module.plan_key
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
