"""Error injection: every bad call gets an XpuRuntimeError subclass naming op, argument and expectation."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from conftest import make_toy_registry

import xpuruntime as xrt
from xpuruntime.abi import TensorSpec
from xpuruntime.dispatch import Dispatcher
from xpuruntime.errors import (
    ArgumentError,
    DeviceMismatchError,
    DTypeError,
    LaunchError,
    LayoutError,
    ShapeError,
    XpuRuntimeError,
)  # fmt: skip
from xpuruntime.registry import kernel

rng = np.random.default_rng(7)
A = rng.standard_normal((3, 4)).astype(np.float32)
B = rng.standard_normal((4, 5)).astype(np.float32)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: xrt.ops.matmul(A, B.astype(np.float64)), DTypeError,
         "matmul: argument 'b' expected dtype float32 (same as 'a'), got float64"),
        (lambda: xrt.ops.matmul(A.astype(bool), B.astype(bool)), DTypeError, "argument 'a' expected a floating or integer"),
        (lambda: xrt.ops.sin_affine(np.arange(3), 1.0, 0.0), DTypeError, "sin_affine: argument 'x' expected a floating"),
        (lambda: xrt.ops.sin_affine(A, A.astype(np.float16)), DTypeError, "argument 'a' expected dtype float32"),
        (lambda: xrt.ops.softmax(np.arange(4)), DTypeError, "softmax: argument 'x' expected a floating"),
        (lambda: xrt.ops.sum(A.astype(np.complex64)), DTypeError, "sum: argument 'x' expected a floating, integer or bool"),
        (lambda: xrt.ops.attention(A, A, A, attn_mask=np.ones((3, 3), np.int8)), DTypeError,
         "attention: argument 'attn_mask' expected bool or float32"),
        (lambda: xrt.ops.layer_norm(A, 4, weight=np.ones(4)), DTypeError, "argument 'weight' expected dtype float32"),
    ],
)  # fmt: skip
def test_wrong_dtype(call, error, message):
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        call()


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: xrt.ops.matmul(A, A), "matmul: argument 'b' expected 4 rows to match the 4 columns of 'a'"),
        (lambda: xrt.ops.matmul(np.ones((2, 3, 4)), np.ones((5, 4, 2))), "argument 'b' expected a shape broadcastable"),
        (lambda: xrt.ops.matmul(np.float32(2.0), A), "matmul: argument 'a' expected at least 1 dimension"),
        (lambda: xrt.ops.sin_affine(A, np.ones(5, np.float32)), "sin_affine: argument 'a' expected a shape broadcastable"),
        (lambda: xrt.ops.sum(A, axis=2), r"sum: argument 'axis' expected a value in \[-2, 2\)"),
        (lambda: xrt.ops.softmax(A, axis=-3), "softmax: argument 'axis' expected a value in"),
        (lambda: xrt.ops.layer_norm(A, 5), r"layer_norm: argument 'x' expected trailing dimensions \(5,\)"),
        (lambda: xrt.ops.layer_norm(A, 4, bias=np.ones(3, np.float32)), "argument 'bias' expected shape"),
        (lambda: xrt.ops.attention(A, B, B), "attention: argument 'k' expected last dim 4"),
        (lambda: xrt.ops.attention(A, A, A[:2]), "argument 'v' expected 3 rows"),
        (lambda: xrt.ops.attention(A, A, A, attn_mask=np.ones((2, 3), bool)), "argument 'attn_mask'"),
    ],
)  # fmt: skip
def test_shape_mismatch(call, message):
    with pytest.raises(ShapeError, match=message):
        call()


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: xrt.ops.layer_norm(np.ones((3, 0), np.float32), 0), "normalized_shape' expected at least one element"),
        (lambda: xrt.ops.rms_norm(np.ones((2, 0), np.float32), (0,)), "at least one element"),
        (lambda: xrt.ops.attention(*(np.ones((2, 0, 4), np.float32),) * 0, np.ones((2, 3, 4), np.float32),
                                   np.ones((2, 0, 4), np.float32), np.ones((2, 0, 4), np.float32)),
         "attention: argument 'k' expected at least one key"),
        (lambda: xrt.ops.attention(np.ones((3, 0), np.float32), np.ones((3, 0), np.float32),
                                   np.ones((3, 2), np.float32)), "argument 'q' expected a head dim E >= 1"),
    ],
)  # fmt: skip
def test_zero_size_where_the_op_is_undefined(call, message):
    with pytest.raises(ShapeError, match=message):
        call()


def test_zero_size_where_the_op_is_defined():
    np.testing.assert_array_equal(xrt.ops.matmul(np.ones((3, 0), np.float32), np.ones((0, 2), np.float32)),
                                  np.zeros((3, 2)))  # fmt: skip
    np.testing.assert_array_equal(xrt.ops.sum(np.ones((4, 0)), axis=-1), np.zeros(4))
    assert xrt.ops.softmax(np.ones((0, 3), np.float32)).shape == (0, 3)
    assert xrt.ops.sin_affine(np.ones((2, 0, 3)), 2.0).shape == (2, 0, 3)


def test_overlapping_output_is_rejected():
    buffer = rng.standard_normal(40).astype(np.float32)
    x = buffer[:20]
    with pytest.raises(LayoutError, match="sin_affine: argument 'out' overlaps input 'x'; expected no overlap, or"):
        xrt.ops.sin_affine(x, 2.0, out=buffer[5:25])  # shifted view: partial overlap
    a = np.ones((4, 4), np.float32)
    with pytest.raises(LayoutError, match=r"matmul: argument 'out' overlaps input 'a'; expected no overlap$"):
        xrt.ops.matmul(a, a.copy(), out=a)  # matmul forbids even exact aliasing
    with pytest.raises(LayoutError, match="overlaps input 'b'"):
        xrt.ops.matmul(a.copy(), a, out=a.T)
    with pytest.raises(LayoutError, match="sum: argument 'out' overlaps input 'x'"):
        xrt.ops.sum(a, axis=0, out=a[0])
    interleaved = np.zeros(20, np.float32)  # x = even elements, out = odd ones: bounds overlap, memory does not
    xrt.ops.sin_affine(interleaved[::2], 1.0, 1.0, out=interleaved[1::2])
    np.testing.assert_allclose(interleaved[1::2], np.sin(1.0), rtol=1e-6)


def test_exact_inplace_is_allowed_where_the_schema_says_so():
    x = rng.standard_normal((5, 6)).astype(np.float32)
    expected = np.sin(3.0 * x.astype(np.float64) - 1.0).astype(np.float32)
    assert xrt.ops.sin_affine(x, 3.0, -1.0, out=x) is x
    np.testing.assert_array_equal(x, expected)


@pytest.mark.parametrize(
    ("out", "error", "message"),
    [
        (np.empty((3, 6), np.float32), ShapeError, r"matmul: argument 'out' expected shape \(3, 5\)"),
        (np.empty((3, 5), np.float64), DTypeError, "matmul: argument 'out' expected dtype float32"),
        ([[0.0] * 5] * 3, ArgumentError, "matmul: argument 'out' expected an array, got list"),
    ],
)
def test_bad_out_argument(out, error, message):
    with pytest.raises(error, match=message):
        xrt.ops.matmul(A, B, out=out)


def test_device_mismatch_is_named():
    with pytest.raises(
        DeviceMismatchError, match="matmul: argument 'b' expected device cpu \\(like 'a'\\), got cuda:0"
    ):
        xrt.explain("matmul", TensorSpec((2, 2)), TensorSpec((2, 2), device="cuda:0"), show=False)


def test_device_mismatch_with_torch_tensors():
    torch = pytest.importorskip("torch")
    with pytest.raises(DeviceMismatchError, match="argument 'b' expected device cpu"):
        xrt.ops.matmul(np.ones((2, 2), np.float32), torch.ones(2, 2, device="meta"))
    assert "torch" in sys.modules


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: xrt.ops.sum(A, axis="rows"), "sum: argument 'axis' expected an int, got 'rows'"),
        (lambda: xrt.ops.sum(A, axis=(0, -2)), "sum: argument 'axis' expected distinct axes"),
        (lambda: xrt.ops.sum(A, keepdims="yes"), "argument 'keepdims' expected a bool"),
        (lambda: xrt.ops.attention(A, A, A, attn_mask=np.ones((3, 3), bool), is_causal=True), "not both"),
        (lambda: xrt.ops.attention(A, A, A, scale=float("nan")), "argument 'scale' expected a finite number"),
        (lambda: xrt.ops.layer_norm(A, 4, eps=-1.0), "argument 'eps' expected a finite number >= 0"),
        (lambda: xrt.ops.layer_norm(A, "4"), "argument 'normalized_shape' expected an int or a tuple"),
        (lambda: xrt.ops.matmul(None, A), "matmul: argument 'a' expected an array, got None"),
        (lambda: xrt.ops.matmul(2.0, A), "matmul: argument 'a' expected an array, got Python float"),
    ],
)
def test_bad_arguments(call, message):
    with pytest.raises(ArgumentError, match=message):
        call()


def test_kernel_failure_becomes_launch_error_naming_op_kernel_and_config():
    def broken(args):
        raise FloatingPointError("overflow in tile 3")

    registry = make_toy_registry()
    registry.register_kernel(kernel("toy", "broken", backend="cpu")(broken))
    with pytest.raises(LaunchError) as info:
        Dispatcher(registry).run("toy", (np.ones(3),))
    message = str(info.value)
    assert "toy: kernel 'broken' [cpu] failed (launch config grid=(1,) block=(1,)" in message
    assert "FloatingPointError: overflow in tile 3" in message
    assert isinstance(info.value.__cause__, FloatingPointError)


def test_every_error_is_an_xpuruntime_error_and_a_builtin_kind():
    for error, builtin in [(ShapeError, ValueError), (DTypeError, TypeError), (LayoutError, ValueError),
                           (DeviceMismatchError, ValueError), (ArgumentError, ValueError), (LaunchError, RuntimeError)]:  # fmt: skip
        assert issubclass(error, XpuRuntimeError) and issubclass(error, builtin)
