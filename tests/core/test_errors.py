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
    PolicyError,
    ShapeError,
    UnknownOpError,
    XpuRuntimeError,
)  # fmt: skip
from xpuruntime.policy import KernelPolicy
from xpuruntime.registry import kernel

rng = np.random.default_rng(7)
X = rng.standard_normal((3, 4)).astype(np.float32)
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


@pytest.mark.parametrize("dtype", [np.int32, np.int8, np.uint64, np.bool_, np.complex64, object])
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_norm_of_a_non_floating_dtype_is_a_dtype_error(op, dtype):
    x = np.ones((2, 8), dtype)
    with pytest.raises(DTypeError, match=f"{op}: argument 'x' expected a floating dtype"):
        getattr(xrt.ops, op)(x, 8)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: xrt.set_kernel_policy(42), PolicyError, "expected a KernelPolicy, a policy string, a mapping"),
        (lambda: xrt.explain("sum", rng.standard_normal(3), policy=42, show=False), PolicyError, "got 42"),
        (lambda: xrt.explain(None, rng.standard_normal(3), show=False), UnknownOpError, "op names are strings"),
        (lambda: xrt.explain(["sum"], rng.standard_normal(3), show=False), UnknownOpError, "op names are strings"),
        (lambda: KernelPolicy.from_dict({"preferences": "x"}), PolicyError, "'preferences' must be a mapping"),
        (lambda: KernelPolicy.from_dict(["matmul"]), PolicyError, "expected a mapping"),
        (lambda: KernelPolicy.from_dict({1: "blocked"}), PolicyError, "non-empty strings"),
        (lambda: KernelPolicy.from_string(None), PolicyError, "expected a string"),
        (lambda: KernelPolicy(validate="yes"), PolicyError, "argument 'validate'"),
        (
            lambda: xrt.ops.attention(*(rng.standard_normal((2, 3, 4)),) * 3, dropout_p=np.zeros(2)),
            ArgumentError,
            "attention: argument 'dropout_p' expected 0.0",
        ),
        (lambda: xrt.enable_dispatch_logging(max_records=-1), ArgumentError, "argument 'max_records'"),
        (lambda: xrt.enable_dispatch_logging(max_records=None), ArgumentError, "argument 'max_records'"),
        (lambda: xrt.enable_dispatch_logging(max_records=1.5), ArgumentError, "argument 'max_records'"),
        (lambda: xrt.ops.layer_norm(rng.standard_normal((2, 1)), True), ArgumentError, "'normalized_shape'"),
        (lambda: xrt.ops.rms_norm(rng.standard_normal((2, 1)), (True,)), ArgumentError, "'normalized_shape'"),
        (lambda: xrt.ops.sum("abc"), DTypeError, "sum: argument 'x' expected a floating, integer or bool dtype"),
    ],
)
def test_raw_python_exceptions_became_library_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()
    assert not xrt.dispatch_logging_enabled()


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda: xrt.MathMode.parse("x" * 100_000), PolicyError),
        (lambda: xrt.SyncPolicy.parse(_FailingIndex()), PolicyError),
        (lambda: KernelPolicy(strict=_FailingIndex()), PolicyError),
        (lambda: KernelPolicy.from_dict({"preferences": np.array([])}), PolicyError),
        (lambda: xrt.default_registry().kernels_for(_FailingIndex()), UnknownOpError),
        (lambda: xrt.record_range(42).__enter__(), ArgumentError),
    ],
)
def test_odd_values_in_the_public_api_are_library_errors(call, error):
    with pytest.raises(error) as info:
        call()
    assert len(str(info.value)) < 2_000


@pytest.mark.parametrize("dtype", ["int32", "bool", "uint8"])
def test_norm_backward_of_a_non_float_input_names_the_dtype_not_eps(dtype):
    x = np.random.default_rng().integers(0, 2, (3, 5)).astype(dtype)
    for backward in (xrt.ops.rms_norm_backward, xrt.ops.layer_norm_backward):
        with pytest.raises(DTypeError, match=rf"{backward.__name__}: argument 'x' expected a floating dtype"):
            backward(x, x, (5,))


def test_structured_field_views_are_rejected_naming_the_op_and_the_argument():
    records = np.zeros(7, dtype=[("a", "f4"), ("b", "i2")])
    records["a"] = np.random.default_rng().standard_normal(7)
    plain = np.ones(7, np.float32)
    with pytest.raises(LayoutError, match=r"^sin_affine: argument 'x': .*not a multiple of its itemsize 4"):
        xrt.ops.sin_affine(records["a"], 2.0)
    with pytest.raises(LayoutError, match=r"^softmax: argument 'out': .*not a multiple of its itemsize 4"):
        xrt.ops.softmax(plain, out=records["a"])


def test_a_fused_constant_beyond_the_float_range_is_an_argument_error():
    x = np.random.default_rng().standard_normal(5).astype(np.float32)
    program = (("mul", ("in", 0), ("c", 10**400)),)
    with pytest.raises(ArgumentError, match=r"fused_elementwise: argument 'program' instruction 0: bad ref") as info:
        xrt.ops.fused_elementwise(program, x)
    assert len(str(info.value)) < 400  # the 401-digit constant is not echoed in full


def _readonly(like: np.ndarray) -> np.ndarray:
    out = np.empty_like(like)
    out.setflags(write=False)
    return out


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: xrt.ops.softmax(X, out=1.0), "softmax: argument 'out' expected an array, got float"),
        (lambda: xrt.ops.softmax(TensorSpec((3, 4))), "softmax: argument 'x' expected an array, got a TensorSpec"),
        (lambda: xrt.ops.softmax([[1.0], [1.0, 2.0]]), "softmax: argument 'x' expected an array, got list"),
        (lambda: xrt.default_dispatcher().run("sum", (X,), (0, False, 1)), "sum: expected inputs"),
        (lambda: xrt.default_dispatcher().run("layer_norm", (X, None, None), ()), "layer_norm: expected inputs"),
        (lambda: xrt.default_dispatcher().plan("layer_norm", X), r"attribute\(s\) \['normalized_shape'\] have no default"),
        (lambda: xrt.ops.softmax(X, out=_readonly(X)), "softmax: argument 'out' expected a writable array"),
    ],
)  # fmt: skip
def test_odd_arguments_get_argument_errors(call, message):
    with pytest.raises(ArgumentError, match=message):
        call()


def test_trailing_attributes_with_defaults_may_be_left_out():
    """An op can gain an attribute without breaking callers of the positional form that pass the shorter tuple
    (rms_norm gained offset and casting after eps)."""
    run = xrt.default_dispatcher().run
    np.testing.assert_array_equal(run("sum", (X,), (0,)), run("sum", (X,), (0, False)))
    short = run("rms_norm", (X, None), ((4,), 1e-6))
    np.testing.assert_array_equal(short, run("rms_norm", (X, None), ((4,), 1e-6, 0.0, "torch")))


@pytest.mark.parametrize("value", [{0}, {0: 1}, slice(1)])  # slices are hashable from Python 3.12 on
def test_unhashable_or_odd_attributes_are_argument_errors(value):
    with pytest.raises(ArgumentError, match=r"sum: argument 'axis' expected (a number, bool, None or tuple|an int)"):
        xrt.ops.sum(X, axis=value)


def test_masked_arrays_and_dropout_are_refused_clearly():
    with pytest.raises(ArgumentError, match="softmax: argument 'x' is a masked array"):
        xrt.ops.softmax(np.ma.masked_array(X, mask=X > 0))
    with pytest.raises(ArgumentError, match=r"attention: argument 'dropout_p' expected 0.0"):
        xrt.ops.attention(X, X, X, dropout_p=0.1)


class _FailingIndex:
    def __index__(self) -> int:
        raise ValueError("no")


@pytest.mark.parametrize("bad", [np.array(2.5), _FailingIndex(), 2**70])
def test_odd_buffer_bounds_are_argument_errors(bad):
    with pytest.raises(ArgumentError, match="max_records"):
        xrt.enable_dispatch_logging(bad)
