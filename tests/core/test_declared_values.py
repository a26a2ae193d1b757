"""What users declare is checked where they declare it (issue 26, items 10 and 14): TensorSpec fields, a
kernel's dtypes, the result a `returns_output` kernel gives back, and float attributes beyond the float
range. Each gives an XpuRuntimeError naming the field or argument, never a raw TypeError/OverflowError and
never a silently wrong result."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_toy_registry

import xpuruntime as xrt
from xpuruntime.abi import TensorSpec
from xpuruntime.dispatch import Dispatcher
from xpuruntime.errors import ArgumentError, LaunchError, RegistrationError
from xpuruntime.registry import kernel

BAD_SPECS = [
    (dict(shape=(-2, 4)), "shape", "a sequence of sizes >= 0"),
    (dict(shape=(2.7, 3)), "shape", "a sequence of sizes >= 0"),
    (dict(shape="23"), "shape", "a sequence of sizes >= 0"),
    (dict(shape=("a", 3)), "shape", "a sequence of sizes >= 0"),
    (dict(shape=None), "shape", "a sequence of sizes >= 0"),
    (dict(shape=(True, 3)), "shape", "a sequence of sizes >= 0"),
    (dict(shape=(2, 3), dtype="float99"), "dtype", "one of bfloat16"),
    (dict(shape=(2, 3), dtype=None), "dtype", "a dtype name"),
    (dict(shape=(2, 3), strides=(1,)), "strides", "2 integers"),
    (dict(shape=(2, 3), strides=(1.5, 1)), "strides", "2 integers"),
    (dict(shape=(2, 3), device=0), "device", "a device name"),
    (dict(shape=(2, 3), itemsize=-4), "itemsize", "an integer >= 0"),
]


@pytest.mark.parametrize(("fields", "field", "expected"), BAD_SPECS)
def test_tensor_spec_refuses_bad_fields_naming_them(fields, field, expected):
    with pytest.raises(ArgumentError, match=rf"TensorSpec: argument '{field}' expected {expected}"):
        TensorSpec(**fields)


def test_tensor_spec_takes_what_it_always_took():
    assert TensorSpec([2, np.int64(3)]).shape == (2, 3)  # a list, NumPy integers
    assert TensorSpec(()).numel == 1 and TensorSpec((0, 5)).numel == 0
    assert TensorSpec((2, 3), "bfloat16").nbytes == 12
    assert TensorSpec((4,), "datetime64[s]", itemsize=8).nbytes == 32  # described from an array: any dtype


def test_explain_never_reports_a_negative_shape():
    with pytest.raises(ArgumentError, match="a sequence of sizes >= 0"):
        xrt.explain("softmax", TensorSpec((-2, 4)), show=False)


def test_kernel_dtypes_must_be_known_names():
    with pytest.raises(RegistrationError, match=r"unknown dtype 'float99'.*Did you mean .float"):
        xrt.kernel("matmul", "mine", backend="cpu", dtypes={"float99"})(lambda args: None)
    with pytest.raises(RegistrationError, match="unknown dtype 'fp32'"):
        xrt.kernel("matmul", "mine", backend="cpu", dtypes={"float32", "fp32"})(lambda args: None)
    assert xrt.kernel("matmul", "mine", backend="cpu", dtypes={"bfloat16"})(lambda args: None).dtypes == {"bfloat16"}


# -- what a returns_output kernel gives back -----------------------------------------------------------------

RETURNS = {
    "a list": lambda x: [1.0, 2.0, 3.0],
    "the wrong shape": lambda x: np.zeros((3, 3), np.float32),
    "the wrong dtype": lambda x: x.astype(np.float64),
    "a tensor on the CPU path": lambda x: __import__("torch").from_numpy(x.copy()),
    "a tuple the op does not take": lambda x: (x.copy(), x.copy()),
}


@pytest.mark.parametrize("what", sorted(RETURNS))
def test_a_returns_output_kernel_must_return_the_op_output(what):
    registry = make_toy_registry()
    if what == "a tensor on the CPU path":
        pytest.importorskip("torch")
    make = RETURNS[what]
    registry.register_kernel(
        kernel("toy", "liar", backend="cpu", priority=9, returns_output=True)(lambda args: make(args.inputs[0]))
    )
    x = np.random.rand(5).astype(np.float32)
    with pytest.raises(LaunchError, match=r"toy: kernel 'liar' \[cpu\] declares returns_output=True and must return "
                                          r"a float32 array of shape \(5,\) on cpu, got"):  # fmt: skip
        Dispatcher(registry).run("toy", (x,))


def test_a_right_result_passes_and_is_checked_once_per_plan():
    registry = make_toy_registry()
    results = [lambda x: x * 2, lambda x: [0.0]]  # the second call's answer is not checked (a plan-cache hit)
    registry.register_kernel(
        kernel("toy", "honest", backend="cpu", priority=9, returns_output=True)(
            lambda args: results.pop(0)(args.inputs[0])
        )
    )
    dispatcher = Dispatcher(registry)
    x = np.random.rand(5).astype(np.float32)
    np.testing.assert_array_equal(dispatcher.run("toy", (x,)), x * 2)
    assert dispatcher.run("toy", (x,)) == [0.0]  # the check costs nothing on a hit


# -- float attributes beyond the float range --------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda x: xrt.ops.layer_norm(x, 8, eps=10**400), "eps"),
        (lambda x: xrt.ops.rms_norm(x, 8, eps=10**400), "eps"),
        (lambda x: xrt.ops.layer_norm_backward(x, x, 8, eps=-(10**400)), "eps"),
        (lambda x: xrt.ops.attention(x[None], x[None], x[None], scale=10**400), "scale"),
        (lambda x: xrt.ops.attention_forward(x[None], x[None], x[None], scale=-(10**400)), "scale"),
    ],
)
def test_float_attributes_beyond_the_float_range_are_argument_errors(call, argument):
    x = np.random.rand(4, 8).astype(np.float32)
    with pytest.raises(ArgumentError, match=rf"argument '{argument}' expected a finite number"):
        call(x)


def test_a_python_int_scalar_beyond_the_float_range_is_an_argument_error():
    x = np.random.rand(4).astype(np.float32)
    np.testing.assert_allclose(xrt.ops.sin_affine(x, 2, 1), np.sin(2 * x + 1), rtol=1e-6)  # the plan for int scalars
    for a, b in ((10**400, 1), (2, -(10**400))):
        with pytest.raises(ArgumentError, match=r"sin_affine: argument 'a' or 'b' expected a number within the float"):
            xrt.ops.sin_affine(x, a, b)  # a plan-cache hit: the value is seen by the kernel only
