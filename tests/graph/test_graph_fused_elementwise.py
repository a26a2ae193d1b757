"""fused_elementwise: random programs against the float64 reference, broadcasting, strided inputs,
0-size dims, mixed input dtypes, poisoned outputs, and clear errors for malformed programs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import xpuruntime as xrt
from xpuruntime.errors import ArgumentError, DTypeError, ShapeError
from xpuruntime.ops.fused_elementwise import BINARY, UNARY, reference

SAFE_UNARY = sorted(set(UNARY) - {"log", "sqrt", "rsqrt", "reciprocal"})  # total on all reals
TOL = {"float64": 1e-12, "float32": 2e-5, "float16": 4e-3}


@st.composite
def programs(draw: st.DrawFn, n_inputs: int) -> tuple:
    """A random program over n inputs whose values stay finite (bounded ops, no division)."""
    program: list[tuple] = []
    for index in range(draw(st.integers(1, 6))):
        refs = [("in", i) for i in range(n_inputs)] + [("t", j) for j in range(index)]
        ref = st.one_of(st.sampled_from(refs), st.floats(-2, 2, allow_nan=False).map(lambda v: ("c", v)))
        if draw(st.booleans()):
            op = draw(st.sampled_from(["add", "sub", "mul", "max", "min"]))
            program.append((op, draw(st.sampled_from(refs)), draw(ref)))
        else:
            program.append((draw(st.sampled_from(SAFE_UNARY)), draw(st.sampled_from(refs))))
    program.append(("tanh", ("t", len(program) - 1)))  # keep results bounded
    return tuple(program)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(["float32", "float64", "float16"]), n_inputs=st.integers(1, 3))
def test_random_programs_match_reference(data: st.DataObject, dtype: str, n_inputs: int) -> None:
    program = data.draw(programs(n_inputs))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    shapes = [(3, 5, 7), (5, 1), (7,)][:n_inputs]
    inputs = [rng.standard_normal(s).astype(dtype) for s in shapes]
    out = np.full((3, 5, 7), np.nan, dtype)
    xrt.ops.fused_elementwise(program, *inputs, dtype=dtype, out=out)
    want = reference(*inputs, program=program)
    np.testing.assert_allclose(out, want, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("op", ["gelu", "gelu_tanh", "erf", "tanh"])
def test_unary_of_a_broadcast_input_fills_the_whole_output(rng, op) -> None:
    """A unary op on an input smaller than the output (found by the property test above: float32 GELU through
    PyTorch's kernel with out= resized the output to the input's (5, 1) and left 104 of 105 elements unset)."""
    x = rng.standard_normal((5, 1)).astype(np.float32)
    program = ((op, ("in", 0)), ("add", ("t", 0), ("in", 1)))
    zero = np.zeros((3, 5, 7), np.float32)
    out = np.full((3, 5, 7), np.nan, np.float32)
    xrt.ops.fused_elementwise(program, x, zero, dtype="float32", out=out)
    np.testing.assert_allclose(out, reference(x, zero, program=program), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("op", sorted(UNARY))
def test_each_unary_op(op: str) -> None:
    x = np.random.default_rng(0).uniform(0.1, 3.0, (4, 9)).astype(np.float32)
    got = xrt.ops.fused_elementwise(((op, ("in", 0)),), x)
    np.testing.assert_allclose(got, reference(x, program=((op, ("in", 0)),)), rtol=3e-6, atol=2e-6)


@pytest.mark.parametrize("op", sorted(BINARY))
def test_each_binary_op(op: str) -> None:
    rng = np.random.default_rng(1)
    a, b = rng.uniform(0.5, 2.0, (6, 5)).astype(np.float32), rng.uniform(0.5, 2.0, (5,)).astype(np.float32)
    program = ((op, ("in", 0), ("in", 1)),)
    np.testing.assert_allclose(xrt.ops.fused_elementwise(program, a, b), reference(a, b, program=program), rtol=3e-6)


def test_strided_offset_views_mixed_dtypes_and_empty() -> None:
    rng = np.random.default_rng(2)
    base = rng.standard_normal((10, 12)).astype(np.float32)
    x = base[1:9:2, ::3]  # strided, offset
    ids = rng.integers(0, 5, (4, 1)).astype(np.int64)  # converted to the compute dtype when loaded
    mask = rng.random((1, 4)) < 0.5
    program = (("mul", ("in", 0), ("in", 1)), ("add", ("t", 0), ("in", 2)), ("gelu", ("t", 1)))
    got = xrt.ops.fused_elementwise(program, x, ids, mask, dtype="float32")
    np.testing.assert_allclose(got, reference(x, ids, mask, program=program), rtol=1e-5, atol=1e-6)
    empty = xrt.ops.fused_elementwise(program, np.zeros((0, 4), np.float32), ids[:0], mask)
    assert empty.shape == (0, 4)


def test_errors_name_the_problem() -> None:
    x = np.ones(3, np.float32)
    with pytest.raises(ArgumentError, match="instruction 0"):
        xrt.ops.fused_elementwise((("frobnicate", ("in", 0)),), x)
    with pytest.raises(ArgumentError, match="bad ref"):
        xrt.ops.fused_elementwise((("neg", ("in", 3)),), x)
    with pytest.raises(ArgumentError, match="bad ref"):
        xrt.ops.fused_elementwise((("neg", ("t", 0)),), x)
    with pytest.raises(ArgumentError, match="takes 2 ref"):
        xrt.ops.fused_elementwise((("add", ("in", 0)),), x)
    with pytest.raises(DTypeError, match="'dtype'"):
        xrt.ops.fused_elementwise((("neg", ("in", 0)),), x, dtype="int32")
    with pytest.raises(ShapeError, match="broadcastable"):
        xrt.ops.fused_elementwise((("add", ("in", 0), ("in", 1)),), x, np.ones(4, np.float32))


def test_one_plan_per_signature() -> None:
    x = np.ones((2, 3), np.float32)
    program = (("exp", ("in", 0)), ("mul", ("t", 0), ("c", 2.0)))
    dispatcher = xrt.default_dispatcher()
    first = dispatcher.plan("fused_elementwise", x, program=program, dtype="float32")
    assert dispatcher.plan("fused_elementwise", x, program=program, dtype="float32") is first
    assert first.kernel.name == "numpy_codegen" and first.kernel.fused
