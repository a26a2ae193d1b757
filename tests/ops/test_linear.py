"""linear and its backward ops on the CPU: float64 references, random views, poisoned outputs, errors.

Tolerance: |got - ref| <= rtol * (|x| @ |W|^T + |b|) (the scale of a dot product's rounding error),
rtol 1e-12 / 1e-5 for float64 / float32; float16 accumulates in float32 and rounds once (+ 2^-11 |ref|).
The activation is applied to the accumulated value, so its derivative (<= 1.13 for GELU) bounds the
growth of that error.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import out_buffers, views

import xpuruntime as xrt
from xpuruntime.errors import ArgumentError, DTypeError, ShapeError, XpuRuntimeError
from xpuruntime.ops.linear import gelu_tanh, gelu_tanh_grad, linear
from xpuruntime.ops.linear import reference as linear_reference
from xpuruntime.ops.linear_backward import (
    grad_input_reference,
    grad_weight_reference,
    linear_grad_input,
    linear_grad_weight,
    split_weight_grad,
)

RTOL = {"float64": 1e-12, "float32": 1e-5, "float16": 1e-5}
DTYPES = ("float32", "float64", "float16")
ACTIVATIONS = (None, "relu", "gelu")


def tolerance(dtype: str, scale: np.ndarray, ref: np.ndarray) -> np.ndarray:
    tol = RTOL[dtype] * 1.2 * scale + 1e-300
    if dtype == "float16":
        tol = tol + 2.0**-11 * np.abs(ref) + 6e-8
    return tol


def assert_close(got: np.ndarray, ref: np.ndarray, tol: np.ndarray, what: str) -> None:
    assert got.shape == ref.shape, what
    assert not np.isnan(got).any(), f"{what}: NaN in the result (unwritten element?)"
    bad = np.abs(got.astype(np.float64) - ref) > tol
    assert not bad.any(), f"{what}: {bad.sum()} elements off, max err {np.abs(got - ref).max():.3g}"


@st.composite
def linear_problems(draw: st.DrawFn) -> tuple[tuple[int, ...], int, int]:
    batch = tuple(draw(st.lists(st.integers(0, 5), min_size=0, max_size=2)))
    return batch, draw(st.integers(0, 9)), draw(st.integers(1, 9))


@settings(max_examples=60, deadline=None)
@given(problem=linear_problems(), dtype=st.sampled_from(DTYPES), activation=st.sampled_from(ACTIVATIONS),
       with_bias=st.booleans(), use_out=st.booleans(), data=st.data())  # fmt: skip
def test_linear_matches_reference(problem, dtype, activation, with_bias, use_out, data):
    batch, k, n = problem
    x = data.draw(views((*batch, k), dtype), label="x")
    w = data.draw(views((n, k), dtype), label="weight")
    b = data.draw(views((n,), dtype), label="bias") if with_bias else None
    ref = linear_reference(x, w, b, activation)
    scale = np.abs(x.astype(np.float64)) @ np.abs(w.astype(np.float64)).T + (0 if b is None else np.abs(b))
    if use_out:
        buf = data.draw(out_buffers(ref.shape, dtype, np.nan), label="out")
        got = linear(x, w, b, activation, out=buf.view)
        assert got is buf.view and buf.untouched_outside()
    else:
        got = linear(x, w, b, activation)
    assert got.dtype == np.dtype(dtype)
    assert_close(got, ref, tolerance(dtype, scale * 1.2, ref), f"linear {dtype} {activation} x{x.shape} w{w.shape}")


def test_linear_shapes_and_zero_sizes():
    rng = np.random.default_rng(1)
    w, b = rng.standard_normal((3, 4)), rng.standard_normal(3)
    assert linear(rng.standard_normal(4), w).shape == (3,)
    assert linear(rng.standard_normal((2, 5, 4)), w).shape == (2, 5, 3)
    empty = linear(np.zeros((0, 4)), w, b)
    assert empty.shape == (0, 3)
    # K == 0: the product is empty, y = act(b) on every row
    y = linear(np.ones((2, 0)), np.ones((3, 0)), b, "relu")
    np.testing.assert_allclose(y, np.broadcast_to(np.maximum(b, 0), (2, 3)))


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "words"),
    [
        ((np.ones((2, 4)), np.ones((3, 5))), {}, ShapeError, ["linear", "'x'", "last dimension 5"]),
        ((np.ones((2, 4)), np.ones(4)), {}, ShapeError, ["'weight'", "2-d"]),
        ((np.ones((2, 4)), np.ones((3, 4)), np.ones(4)), {}, ShapeError, ["'bias'", "(3,)"]),
        ((np.ones((2, 4)), np.ones((3, 4))), {"activation": "tanh"}, ArgumentError, ["'activation'", "'gelu'"]),
        ((np.ones((2, 4), np.float32), np.ones((3, 4))), {}, DTypeError, ["'weight'", "float32"]),
        ((np.ones((2, 4), np.int32), np.ones((3, 4), np.int32)), {}, DTypeError, ["'x'", "floating"]),
        ((np.ones(()), np.ones((3, 4))), {}, ShapeError, ["'x'", "at least 1"]),
    ],
)
def test_linear_errors_name_the_argument(args, kwargs, error, words):
    with pytest.raises(error) as info:
        linear(*args, **kwargs)
    assert isinstance(info.value, XpuRuntimeError)
    for word in words:
        assert word in str(info.value)


def test_linear_out_may_not_alias_input():
    x = np.ones((4, 4))
    with pytest.raises(XpuRuntimeError, match="overlaps"):
        linear(x, np.ones((4, 4)), out=x)


def test_gelu_tanh_derivative_matches_finite_differences():
    z = np.linspace(-6, 6, 1001)
    h = 1e-6
    numeric = (gelu_tanh(z + h) - gelu_tanh(z - h)) / (2 * h)
    np.testing.assert_allclose(gelu_tanh_grad(z), numeric, atol=1e-8)
    # and it is the tanh approximation of x * Phi(x), within its known 1e-3 error
    from math import erf

    exact = np.array([0.5 * v * (1 + erf(v / np.sqrt(2))) for v in z])
    assert np.abs(gelu_tanh(z) - exact).max() < 1e-3


@settings(max_examples=40, deadline=None)
@given(problem=linear_problems(), dtype=st.sampled_from(DTYPES), activation=st.sampled_from(ACTIVATIONS),
       data=st.data())  # fmt: skip
def test_linear_grad_input_matches_reference(problem, dtype, activation, data):
    batch, k, n = problem
    dy = data.draw(views((*batch, n), dtype), label="dy")
    w = data.draw(views((n, k), dtype), label="weight")
    preact = data.draw(views((*batch, k), dtype), label="preact") if activation else None
    ref = grad_input_reference(dy, w, preact, activation)
    scale = np.abs(dy.astype(np.float64)) @ np.abs(w.astype(np.float64)) * 1.2
    buf = data.draw(out_buffers(ref.shape, dtype, np.nan), label="out")
    got = linear_grad_input(dy, w, preact, activation, out=buf.view)
    assert buf.untouched_outside()
    assert_close(got, ref, tolerance(dtype, scale, ref) + RTOL[dtype] * np.abs(ref), f"grad_input {activation}")


def test_linear_grad_input_is_the_derivative_of_linear():
    """Chain rule check: for x = act(preact), d/dpreact sum(linear(x) * dy) == linear_grad_input."""
    rng = np.random.default_rng(7)
    preact, w, dy = rng.standard_normal((5, 6)), rng.standard_normal((4, 6)), rng.standard_normal((5, 4))
    for activation in ("gelu", "relu"):
        act = gelu_tanh if activation == "gelu" else (lambda z: np.maximum(z, 0))
        grad = linear_grad_input(dy, w, preact, activation)
        h = 1e-6
        numeric = np.zeros_like(preact)
        for index in np.ndindex(*preact.shape):
            plus, minus = preact.copy(), preact.copy()
            plus[index] += h
            minus[index] -= h
            numeric[index] = np.sum((linear(act(plus), w) - linear(act(minus), w)) * dy) / (2 * h)
        np.testing.assert_allclose(grad, numeric, atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(problem=linear_problems(), dtype=st.sampled_from(DTYPES), bias=st.booleans(), data=st.data())
def test_linear_grad_weight_matches_reference(problem, dtype, bias, data):
    batch, k, n = problem
    dy = data.draw(views((*batch, n), dtype), label="dy")
    x = data.draw(views((*batch, k), dtype), label="x")
    ref = grad_weight_reference(dy, x, bias)
    m = int(np.prod(batch))
    dy2, x2 = np.abs(dy.astype(np.float64)).reshape(m, n), np.abs(x.astype(np.float64)).reshape(m, k)
    scale = dy2.T @ x2
    if bias:
        scale = np.concatenate([scale.ravel(), dy2.sum(axis=0)])
    buf = data.draw(out_buffers(ref.shape, dtype, np.nan), label="out")
    got = linear_grad_weight(dy, x, bias, out=buf.view)
    assert got.shape == ((n * k + n,) if bias else (n, k)) and buf.untouched_outside()
    assert_close(got, ref, tolerance(dtype, scale * 1.2, ref), f"grad_weight bias={bias}")


def test_split_weight_grad_and_linear_gradients_agree():
    """dW and db from the packed gradient are d/dW and d/db of sum(linear(x, W, b) * dy)."""
    rng = np.random.default_rng(3)
    x, dy = rng.standard_normal((2, 3, 5)), rng.standard_normal((2, 3, 4))
    packed = linear_grad_weight(dy, x, True)
    dw, db = split_weight_grad(packed, 4, 5)
    assert np.shares_memory(dw, packed) and np.shares_memory(db, packed)
    np.testing.assert_allclose(dw, np.einsum("abn,abk->nk", dy, x), atol=1e-12)
    np.testing.assert_allclose(db, dy.sum(axis=(0, 1)), atol=1e-12)
    np.testing.assert_allclose(linear_grad_weight(dy, x), dw, atol=1e-12)


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda: linear_grad_input(np.ones((2, 3)), np.ones((3, 4)), None, "gelu"), ArgumentError, ["'preact'"]),
        (lambda: linear_grad_input(np.ones((2, 3)), np.ones((3, 4)), np.ones((2, 5)), "gelu"), ShapeError,
         ["'preact'", "(2, 4)"]),
        (lambda: linear_grad_input(np.ones((2, 5)), np.ones((3, 4))), ShapeError, ["'dy'", "out_features"]),
        (lambda: linear_grad_weight(np.ones((2, 3)), np.ones((3, 4))), ShapeError, ["'x'", "leading"]),
        (lambda: linear_grad_weight(np.ones((2, 3)), np.ones((2, 4)), 1), ArgumentError, ["'bias'", "bool"]),
    ],
)  # fmt: skip
def test_backward_errors_name_the_argument(call, error, words):
    with pytest.raises(error) as info:
        call()
    for word in words:
        assert word in str(info.value)


def test_linear_is_discovered_and_explained():
    names = {k.name for k in xrt.default_registry().kernels_for("linear")}
    assert "numpy" in names and "cublasLt" in names
    explanation = xrt.explain("linear", np.ones((3, 4), np.float32), np.ones((2, 4), np.float32), show=False)
    assert explanation.decision.kernel.name == "numpy"


@pytest.mark.parametrize("seed", [0, 1])
def test_linear_fp16_accumulates_in_fp32(seed):
    """A long fp16 dot product that fp16 accumulation would get visibly wrong."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, (2, 4096)).astype(np.float16)
    w = rng.uniform(0, 1, (3, 4096)).astype(np.float16)
    ref = linear_reference(x, w)
    np.testing.assert_allclose(linear(x, w).astype(np.float64), ref, rtol=2e-3)


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
