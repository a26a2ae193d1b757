"""Property tests: every op in `xpuruntime.ops`, through every CPU kernel, against its float64 reference.

Inputs are random views (contiguous, offset, windowed, strided, reversed, transposed, broadcast, 0-size
dims) drawn by `strategies.views`; values come from `np.random.default_rng(seed)` with a hypothesis-drawn
seed. Every test may also pass an `out=` view into a bigger buffer pre-filled with a poison value (NaN,
+inf where the reference itself has NaN, the most negative value for integers) and then checks that
every element of the view was written and nothing outside it changed. NaN (and inf) must appear exactly
where the reference has it.

Tolerances (|got - ref| <= tol, elementwise, ref in float64):
- sin_affine: float32 <= 2 ULP of the float64 reference rounded to float32, float16 <= 1 ULP, float64
  1e-12 absolute (outputs lie in [-1, 1]).
- sum: rtol * sum(|x|) over the same axes, 1e-12 / 1e-6 (float64 / float32); float16 accumulates wider
  (1e-6 * sum|x|) and rounds once: + 2^-11 * |ref|.
- matmul: rtol * (|a| @ |b|), the natural scale of the rounding error of a dot product: 1e-12 / 1e-5
  (float64 / float32: TF32's 2^-11 would fail it; an absolute bound would not hold for long rows of
  broadcast values, which hypothesis finds); float16 accumulates in
  float32 (1e-5 * |a| @ |b|) and rounds the result once: + 2^-11 * |ref|.
- softmax, layer_norm, rms_norm, attention: 1e-5 relative/absolute for float32 computed in float32, with
  the op's conditioning where it matters (layer_norm: max|x| / sqrt(var + eps) per row); float16 computes
  in float32 and rounds once, so it gets exactly that rounding, 2^-11 * |ref|, on top of the float32
  allowance (anything computed in float16 on the way shows up as a failure).
- float16 results may be subnormal: everywhere one subnormal step (5.96e-8) absolute is added.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from strategies import (
    FLOAT_DTYPES,
    LAYOUTS,
    WRITABLE_LAYOUTS,
    Layout,
    OutBuffer,
    booleans,
    broadcastable_shapes,
    describe_view,
    integers,
    make_view,
    out_buffers,
    poison_for,
    rarely,
    seeds,
    shapes,
    uniform,
    views,
    views_of,
    writable_views,
)

import xpuruntime as xrt
from xpuruntime.ops.attention import reference as attention_reference
from xpuruntime.ops.elementwise import reference as sin_affine_reference
from xpuruntime.ops.matmul import reference as matmul_reference
from xpuruntime.ops.norm import layer_norm_reference, rms_norm_reference
from xpuruntime.ops.reduction import reference as sum_reference
from xpuruntime.ops.softmax import reference as softmax_reference
from xpuruntime.registry import default_registry

SUPPRESS = [HealthCheck.too_slow, HealthCheck.data_too_large]
# Soak testing: XPURUNTIME_TEST_EXAMPLES_SCALE=20 runs every property with 20x the examples.
EXAMPLES_SCALE = float(os.environ.get("XPURUNTIME_TEST_EXAMPLES_SCALE", "1"))


def examples(n: int) -> settings:
    return settings(max_examples=max(1, round(n * EXAMPLES_SCALE)), deadline=None, suppress_health_check=SUPPRESS)


FP16_HALF_ULP = 2.0**-11  # relative rounding error of a float16 normal number
FP16_SUBNORMAL = float(np.finfo(np.float16).smallest_subnormal)  # 2x the absolute error below normals


def out_rounding(dtype: str) -> tuple[float, float]:
    """(relative, absolute) error of rounding an exact value once into `dtype`: for float16 (which the
    kernels compute in float32) half an ULP, 2^-11 relative, and a subnormal step absolute. float32 and
    float64 results are not rounded again, their compute tolerance covers them."""
    if dtype == "float16":
        return FP16_HALF_ULP, FP16_SUBNORMAL
    return 0.0, 0.0


# -- running and checking -----------------------------------------------------------------------------


def call(op: str, kernel: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run `fn` with a strict policy that forces `kernel` for `op` (fails instead of falling back).

    The policy replaces whatever is in force, so a global policy set elsewhere cannot leak in.
    """
    with xrt.kernel_policy(xrt.KernelPolicy({op: kernel}, strict=True)):
        return fn(*args, **kwargs)


def run_op(
    data: st.DataObject, op: str, kernel: str, fn: Callable[..., Any], args: tuple, kwargs: dict,
    ref: np.ndarray, out_dtype: str,
) -> tuple[np.ndarray, str]:  # fmt: skip
    """Call the op, half the time into a poisoned `out=` view; returns the result and how it was made."""
    if np.isnan(ref).any():
        event("reference has NaN")
    if not data.draw(st.booleans(), label="pass out="):
        result = call(op, kernel, fn, *args, **kwargs)
        assert isinstance(result, np.ndarray), type(result)
        return result, "returned"
    buf: OutBuffer = data.draw(out_buffers(ref.shape, out_dtype, poison_for(out_dtype, ref)), label="out")
    event(f"poisoned out=: {buf.layout.kind}")
    result = call(op, kernel, fn, *args, out=buf.view, **kwargs)
    assert result is buf.view, "an op called with out= must return that very array"
    assert buf.untouched_outside(), f"{op}/{kernel} wrote outside its out= view ({buf.layout.describe()})"
    return result, f"out= {buf.layout.describe()} {describe_view(buf.view)}"


def assert_close(got: np.ndarray, ref: np.ndarray, tol: Any, what: str) -> None:
    """|got - ref| <= tol elementwise; NaN and +-inf must sit exactly where the reference has them."""
    got64 = np.asarray(got).astype(np.float64)
    ref = np.asarray(ref, np.float64)
    assert got64.shape == ref.shape, f"{what}: shape {got64.shape}, reference {ref.shape}"
    nan_got, nan_ref = np.isnan(got64), np.isnan(ref)
    if not np.array_equal(nan_got, nan_ref):
        where = np.argwhere(nan_got != nan_ref)[:5].tolist()
        raise AssertionError(
            f"{what}: NaN pattern differs ({int(nan_got.sum())} NaN in result, {int(nan_ref.sum())} in "
            f"reference); first differences at {where}"
        )
    inf_ref = np.isinf(ref)
    if not np.array_equal(np.isinf(got64), inf_ref) or not np.array_equal(got64[inf_ref], ref[inf_ref]):
        raise AssertionError(f"{what}: infinities differ from the reference")
    finite = ~(nan_ref | inf_ref)
    err = np.abs(np.subtract(got64, ref, where=finite, out=np.zeros_like(ref)))
    tol = np.broadcast_to(np.asarray(tol, np.float64), ref.shape)
    assert not np.isnan(tol[finite]).any(), f"{what}: the test's tolerance is NaN (it would pass anything)"
    bad = err > tol
    if bad.any():
        i = tuple(np.argwhere(bad)[0])
        worst = np.unravel_index(np.argmax(np.where(bad, err / np.maximum(tol, 1e-300), 0)), ref.shape)
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {ref.size} elements out of tolerance; first at {i}: got {got64[i]!r} "
            f"want {ref[i]!r} (err {err[i]:.3g} > tol {tol[i]:.3g}); worst at {tuple(worst)}: err "
            f"{err[worst]:.3g} tol {tol[worst]:.3g}"
        )


def ulp_distance(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """ULPs between two float16/float32 arrays of the same dtype (-0.0 and +0.0 are 0 apart)."""
    assert got.dtype == want.dtype and got.dtype in (np.float16, np.float32)
    bits = 8 * got.dtype.itemsize
    itype = np.dtype(f"int{bits}")
    magnitude_mask = (1 << (bits - 1)) - 1

    def ordered(x: np.ndarray) -> np.ndarray:
        # IEEE floats are sign-magnitude: map them onto a line of integers that preserves order
        i = np.ascontiguousarray(x).view(itype).astype(np.int64)
        magnitude = i & magnitude_mask
        return np.where(i < 0, -magnitude, magnitude)

    return np.abs(ordered(got) - ordered(want))


def context(**arrays: Any) -> str:
    return "; ".join(f"{name}={describe_view(x)}" for name, x in arrays.items())


# -- sanity of the strategies themselves --------------------------------------------------------------


@examples(100)
@given(
    data=st.data(),
    shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5),
    dtype=st.sampled_from([*FLOAT_DTYPES, "int32", "bool"]),
)
def test_views_have_the_requested_shape_dtype_and_nonzero_values(data, shape, dtype):
    x = data.draw(views(shape, dtype), label="x")
    assert x.shape == shape and x.dtype == np.dtype(dtype)
    assert x.size == 0 or x.any(), "views must never be all zeros"
    out_dtype = "int64" if dtype == "bool" else dtype  # no op outputs bool, and a bool has no poison
    out = data.draw(out_buffers(shape, out_dtype, poison_for(out_dtype)), label="out")
    assert out.view.flags.writeable and int(out.inside.sum()) == out.view.size
    assert out.untouched_outside()


def test_layout_kinds_produce_what_they_say():
    rng = np.random.default_rng(0)
    shape = (3, 4, 5)
    cases = {
        "offset": Layout("offset", (0, 1, 2), (1, 1, 1), (0, 0, 0), (0, 0, 0), flat_offset=2),
        "strided": Layout("strided", (0, 1, 2), (1, 2, 3), (0, 1, 0), (0, 0, 0)),
        "reversed": Layout("reversed", (0, 1, 2), (1, -1, 1), (0, 0, 0), (0, 0, 0)),
        "transposed": Layout("transposed", (2, 0, 1), (1, 1, 1), (0, 0, 0), (0, 0, 0)),
        "broadcast": Layout("broadcast", (0, 1, 2), (1, 1, 1), (0, 0, 0), (0, 0, 0), frozenset({1})),
    }
    made = {kind: make_view(rng, shape, "float32", layout) for kind, layout in cases.items()}
    assert made["offset"].flags.c_contiguous and made["offset"].base is not None
    assert made["offset"].__array_interface__["data"][0] != made["offset"].base.__array_interface__["data"][0]
    assert not made["strided"].flags.c_contiguous
    assert made["reversed"].strides[1] < 0
    assert not made["transposed"].flags.c_contiguous and not made["transposed"].flags.f_contiguous
    assert made["broadcast"].strides[1] == 0
    assert set(LAYOUTS) - set(WRITABLE_LAYOUTS) == {"broadcast", "mixed"}


@pytest.mark.parametrize(
    "op, reference",
    [
        ("sin_affine", sin_affine_reference),
        ("sum", sum_reference),
        ("matmul", matmul_reference),
        ("softmax", softmax_reference),
        ("layer_norm", layer_norm_reference),
        ("rms_norm", rms_norm_reference),
        ("attention", attention_reference),
    ],
)
def test_tested_references_are_the_schemas(op, reference):
    assert default_registry().op(op).reference is reference


def cpu_kernels(op: str) -> tuple[str, ...]:
    """The op's CPU kernels, from the registry: a new one is property-tested without editing a list."""
    return tuple(k.name for k in default_registry().kernels_for(op) if k.backend == "cpu")


# -- sin_affine ---------------------------------------------------------------------------------------

SIN_SHAPES = broadcastable_shapes(3, max_dims=4, max_side=5)


def sin_operand(shape: tuple[int, ...], dtype: str, low: float, high: float) -> st.SearchStrategy:
    """An array view, or a Python float / int (the schema lets a and b be scalars)."""
    return st.one_of(
        views(shape, dtype, uniform(low, high)),
        views(shape, dtype, uniform(low, high)),
        st.floats(low, high),
        st.integers(int(low), int(high)),
    )


def check_sin_affine(got: np.ndarray, ref: np.ndarray, dtype: str, what: str) -> None:
    assert got.dtype == np.dtype(dtype), what
    assert not np.isnan(ref).any()
    if dtype == "float64":
        assert_close(got, ref, 1e-12, what)
        return
    want = ref.astype(dtype)
    assert not np.isnan(got).any(), f"{what}: NaN in result"
    ulps = ulp_distance(got, want)
    limit = 2 if dtype == "float32" else 1
    if ulps.size and ulps.max() > limit:
        i = np.unravel_index(np.argmax(ulps), ulps.shape)
        raise AssertionError(
            f"{what}: {int(ulps.max())} ULP from the float64 reference at {i} (limit {limit}): "
            f"got {got[i]!r}, want {want[i]!r}"
        )


@examples(300)
@given(data=st.data(), dtype=st.sampled_from(FLOAT_DTYPES), operand_shapes=SIN_SHAPES)
def test_sin_affine_matches_reference(data, dtype, operand_shapes):
    xs, as_, bs = operand_shapes.input_shapes
    x = data.draw(views(xs, dtype, uniform(-4, 4)), label="x")
    a = data.draw(sin_operand(as_, dtype, -3, 3), label="a")
    b = data.draw(sin_operand(bs, dtype, -2, 2), label="b")
    ref = sin_affine_reference(x, a, b)
    got, how = run_op(data, "sin_affine", "numpy", xrt.ops.sin_affine, (x, a, b), {}, ref, dtype)
    check_sin_affine(got, ref, dtype, f"sin_affine {how}; {context(x=x, a=a, b=b)}")


@examples(150)
@given(
    data=st.data(), dtype=st.sampled_from(FLOAT_DTYPES), operand_shapes=SIN_SHAPES,
    target=st.sampled_from(["x", "x", "a", "b"]),
)  # fmt: skip
def test_sin_affine_in_place_equals_out_of_place(data, dtype, operand_shapes, target):
    """`out` may be exactly an input's view (the schema is in-place capable); usually out=x."""
    full = np.broadcast_shapes(*operand_shapes.input_shapes)
    shape_of = dict(zip("xab", operand_shapes.input_shapes))
    shape_of[target] = full
    operands = {}
    for name, low, high in (("x", -4, 4), ("a", -3, 3), ("b", -2, 2)):
        if name == target:
            operands[name] = data.draw(writable_views(full, dtype, uniform(low, high)), label=name)
        elif name == "x":
            operands[name] = data.draw(views(shape_of[name], dtype, uniform(low, high)), label=name)
        else:
            operands[name] = data.draw(sin_operand(shape_of[name], dtype, low, high), label=name)
    x, a, b = operands["x"], operands["a"], operands["b"]
    ref = sin_affine_reference(x, a, b)
    expected = call("sin_affine", "numpy", xrt.ops.sin_affine, x, a, b).copy()
    alias = operands[target]
    result = call("sin_affine", "numpy", xrt.ops.sin_affine, x, a, b, out=alias)
    assert result is alias
    what = f"sin_affine in place (out={target}); {context(x=x, a=a, b=b)}"
    np.testing.assert_array_equal(result, expected, err_msg=what)
    check_sin_affine(result, ref, dtype, what)


# -- sum ----------------------------------------------------------------------------------------------

SUM_SHAPES = shapes(max_dims=4, max_side=7)


@st.composite
def sum_axes(draw: st.DrawFn, ndim: int) -> int | tuple[int, ...] | None:
    """None, one axis (negative or not), or a tuple of distinct axes (possibly empty)."""
    kinds = ["none", "int", "tuple"] if ndim else ["none", "tuple"]
    kind = draw(st.sampled_from(kinds))
    if kind == "none":
        return None
    if kind == "int":
        return draw(st.integers(-ndim, ndim - 1))
    axes = draw(st.lists(st.integers(0, ndim - 1), unique=True, max_size=ndim)) if ndim else []
    return tuple(a - ndim if draw(st.booleans()) else a for a in axes)


@examples(300)
@given(data=st.data(), dtype=st.sampled_from(FLOAT_DTYPES), shape=SUM_SHAPES, keepdims=st.booleans())
def test_sum_matches_reference(data, dtype, shape, keepdims):
    x = data.draw(views(shape, dtype), label="x")
    axis = data.draw(sum_axes(len(shape)), label="axis")
    ref = sum_reference(x, axis, keepdims)
    magnitude = sum_reference(np.abs(x), axis, keepdims)
    got, how = run_op(data, "sum", "numpy", xrt.ops.sum, (x, axis, keepdims), {}, ref, dtype)
    assert got.dtype == np.dtype(dtype)
    # accumulation error scales with sum|x|; float16 is accumulated wider and rounded once at the end
    rtol = {"float64": 1e-12, "float32": 1e-6, "float16": 1e-6}[dtype]
    rtol_out, atol = out_rounding(dtype)
    what = f"sum axis={axis} keepdims={keepdims} {how}; {context(x=x)}"
    assert_close(got, ref, rtol * magnitude + rtol_out * np.abs(ref) + atol, what)


@examples(200)
@given(
    data=st.data(), dtype=st.sampled_from(["int32", "bool", "int8", "uint8", "int64"]), shape=SUM_SHAPES,
    keepdims=st.booleans(),
)  # fmt: skip
def test_integer_and_bool_sum_is_exact_int64(data, dtype, shape, keepdims):
    info = None if dtype == "bool" else np.iinfo(dtype)
    if info is None:
        fill = booleans(0.5)
    elif dtype == "int64":
        fill = integers(-(2**40), 2**40)
    else:  # the full range: a sum of int32 values overflows int32 quickly, never int64 here
        fill = integers(int(info.min), int(info.max))
    x = data.draw(views(shape, dtype, fill), label="x")
    axis = data.draw(sum_axes(len(shape)), label="axis")
    ref = sum_reference(x, axis, keepdims)
    assert ref.dtype == np.int64
    got, how = run_op(data, "sum", "numpy", xrt.ops.sum, (x, axis, keepdims), {}, ref, "int64")
    assert got.dtype == np.int64, got.dtype
    np.testing.assert_array_equal(got, ref, err_msg=f"sum axis={axis} {how}; {context(x=x)}")


# -- matmul -------------------------------------------------------------------------------------------

MATMUL_KERNELS = cpu_kernels("matmul")
SMALL_SIZES = st.integers(0, 9)


@st.composite
def matmul_shapes(
    draw: st.DrawFn, gemv: bool = False, sizes: st.SearchStrategy[int] = SMALL_SIZES
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shapes of a and b: 2-D, batched (broadcast batch dims, size 0 and 1 included), 1-D operands.
    With `gemv`, only what the GEMV kernel takes: no batch, and a vector operand or M == 1 or N == 1."""
    m, n, k = draw(sizes), draw(sizes), draw(sizes)
    if gemv:
        mode = draw(st.sampled_from(["a_vector", "b_vector", "both_vectors", "m1", "n1"]))
        batch_a = batch_b = ()
        m, n = (1 if mode == "m1" else m), (1 if mode == "n1" else n)
    else:
        mode = draw(st.sampled_from(["2d", "batched", "batched", "a_vector", "b_vector", "both_vectors"]))
        batches = draw(broadcastable_shapes(2, max_dims=3, max_side=3))
        batch_a, batch_b = batches.input_shapes if mode != "2d" else ((), ())
    a_vector = mode in ("a_vector", "both_vectors")
    b_vector = mode in ("b_vector", "both_vectors")
    a_shape = (k,) if a_vector else (*batch_a, m, k)
    b_shape = (k,) if b_vector else (*batch_b, k, n)
    return a_shape, b_shape


def check_matmul(data: st.DataObject, kernel: str, a: np.ndarray, b: np.ndarray, dtype: str) -> None:
    ref = matmul_reference(a, b)
    magnitude = matmul_reference(np.abs(a), np.abs(b))
    got, how = run_op(data, "matmul", kernel, xrt.ops.matmul, (a, b), {}, ref, dtype)
    what = f"matmul/{kernel} {how}; {context(a=a, b=b)}"
    assert got.dtype == np.dtype(dtype), what
    event(f"matmul: {'vector' if a.ndim == 1 else 'matrix'} @ {'vector' if b.ndim == 1 else 'matrix'}")
    if max(a.ndim, b.ndim) > 2:
        event("matmul: batched" + (", broadcast batch" if a.shape[:-2] != b.shape[:-2] else ""))
    if a.shape[-1] == 0:  # K == 0: an empty sum, exactly zero
        event("matmul: K == 0")
        assert got.size == 0 or not got.any(), f"{what}: K=0 must give zeros"
    # dot-product rounding scales with |a| @ |b|; float16 accumulates in float32 and rounds once at the end
    rtol = 1e-12 if dtype == "float64" else 1e-5
    rtol_out, atol = out_rounding(dtype)
    assert_close(got, ref, rtol * magnitude + rtol_out * np.abs(ref) + atol, what)


@pytest.mark.parametrize("kernel", MATMUL_KERNELS)
@examples(200)
@given(data=st.data(), dtype=st.sampled_from(FLOAT_DTYPES))
def test_matmul_matches_reference(kernel, data, dtype):
    a_shape, b_shape = data.draw(matmul_shapes(gemv=kernel == "gemv"), label="shapes")
    a = data.draw(views(a_shape, dtype), label="a")
    b = data.draw(views(b_shape, dtype), label="b")
    check_matmul(data, kernel, a, b, dtype)


@pytest.mark.parametrize("kernel", MATMUL_KERNELS)
@examples(16)
@given(data=st.data(), dtype=st.sampled_from(FLOAT_DTYPES))
def test_matmul_across_tile_boundaries(kernel, data, dtype):
    """Sizes around the blocked kernel's tiles (BM = BN = 128, BK = 256): several tiles and a ragged one."""
    sizes = st.sampled_from([1, 2, 127, 129, 131])
    a_shape, b_shape = data.draw(matmul_shapes(gemv=kernel == "gemv", sizes=sizes), label="shapes")
    k = data.draw(st.sampled_from([0, 3, 255, 257, 520, 700]), label="k")
    a_shape = (*a_shape[:-1], k)
    b_shape = (k,) if len(b_shape) == 1 else (*b_shape[:-2], k, b_shape[-1])
    batch = np.broadcast_shapes(a_shape[:-2], b_shape[:-2])
    m, n = (a_shape[-2] if len(a_shape) > 1 else 1), (b_shape[-1] if len(b_shape) > 1 else 1)
    if math.prod(batch) * m * n * k > 5e7:  # keep the run short: drop the batch dims of the biggest cases
        a_shape, b_shape = a_shape[-2:], b_shape[-2:]
    a = data.draw(views(a_shape, dtype), label="a")
    b = data.draw(views(b_shape, dtype), label="b")
    check_matmul(data, kernel, a, b, dtype)


@examples(60)
@given(data=st.data(), dtype=st.sampled_from(["int32", "int8", "int64", "uint8"]))
def test_integer_matmul_is_exact(data, dtype):
    """numpy_blas also takes integers (result in the input dtype); values small enough not to overflow."""
    a_shape, b_shape = data.draw(matmul_shapes(), label="shapes")
    fill = integers(0, 3) if dtype == "uint8" else integers(-3, 3)
    a = data.draw(views(a_shape, dtype, fill), label="a")
    b = data.draw(views(b_shape, dtype, fill), label="b")
    ref = matmul_reference(a, b)
    got, how = run_op(data, "matmul", "numpy_blas", xrt.ops.matmul, (a, b), {}, ref, dtype)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, ref, err_msg=f"matmul {how}; {context(a=a, b=b)}")


# -- softmax ------------------------------------------------------------------------------------------


def softmax_fill(spread: float, shift: float, p_neg_inf: float) -> Any:
    """shift + U(-spread, spread), with -inf at a fraction of positions (all of them: NaN rows)."""

    def fill(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        values = shift + rng.uniform(-spread, spread, size=shape)
        return np.where(rng.random(shape) < p_neg_inf, -np.inf, values)

    return fill


@st.composite
def softmax_inputs(draw: st.DrawFn, dtype: str, writable: bool = False) -> tuple[np.ndarray, int]:
    shape = draw(shapes(min_dims=1, max_dims=4, max_side=7), label="shape")
    axis = draw(st.integers(-len(shape), len(shape) - 1), label="axis")
    spread = draw(st.sampled_from([1.0, 8.0] if dtype == "float16" else [1.0, 8.0, 30.0]))
    shift = draw(st.sampled_from([0.0, 0.0, 500.0, -500.0]))  # stability: no exp overflow/underflow
    p_neg_inf = draw(st.sampled_from([0.0, 0.0, 0.3, 0.8, 1.0]))
    fill = softmax_fill(spread, shift, p_neg_inf)
    strategy = writable_views(shape, dtype, fill) if writable else views(shape, dtype, fill)
    return draw(strategy, label="x"), axis


def softmax_tolerance(ref: np.ndarray, x: np.ndarray, axis: int, dtype: str) -> np.ndarray:
    """float32/float64 round x - max (|x - max| up to 2 * spread) before exp(): a relative error of
    eps * |x - max| per element, plus a few eps for exp, sum and divide."""
    x64 = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        gap = np.nan_to_num(np.abs(x64 - x64.max(axis=axis, keepdims=True)), nan=0.0, posinf=0.0)
    eps = np.finfo(np.float64 if dtype == "float64" else np.float32).eps
    rtol_out, atol = out_rounding(dtype)
    with np.errstate(invalid="ignore"):  # NaN rows stay NaN here; assert_close only checks finite positions
        return (16 * eps * (1 + gap) + rtol_out) * np.abs(ref) + 4 * eps + atol  # outputs lie in [0, 1]


@examples(120)
@given(data=st.data(), dtype=st.sampled_from(FLOAT_DTYPES))
def test_softmax_matches_reference(data, dtype):
    x, axis = data.draw(softmax_inputs(dtype))
    ref = softmax_reference(x, axis)
    got, how = run_op(data, "softmax", "numpy", xrt.ops.softmax, (x, axis), {}, ref, dtype)
    assert got.dtype == np.dtype(dtype)
    if x.size:
        assert_close(got, ref, softmax_tolerance(ref, x, axis, dtype), f"softmax axis={axis} {how}; {context(x=x)}")


def assert_same_result(in_place: np.ndarray, out_of_place: np.ndarray, what: str) -> None:
    """In-place and out-of-place runs of one kernel: the same up to summation order (a few ULP)."""
    eps = float(np.finfo(in_place.dtype).eps)
    assert_close(in_place, out_of_place, 4 * eps * np.abs(out_of_place.astype(np.float64)), what)


@examples(60)
@given(data=st.data(), dtype=st.sampled_from(FLOAT_DTYPES))
def test_softmax_in_place_equals_out_of_place(data, dtype):
    x, axis = data.draw(softmax_inputs(dtype, writable=True))
    ref = softmax_reference(x, axis)
    expected = call("softmax", "numpy", xrt.ops.softmax, x, axis).copy()
    result = call("softmax", "numpy", xrt.ops.softmax, x, axis, out=x)
    assert result is x
    what = f"softmax in place axis={axis}; {context(x=x)}"
    assert_same_result(result, expected, what)
    if x.size:
        assert_close(result, ref, softmax_tolerance(ref, x, axis, dtype), what)


# -- layer_norm and rms_norm --------------------------------------------------------------------------

NORM_EPS = {"layer_norm": [None, 1e-5, 1e-3, 1e-8], "rms_norm": [None, 1e-6, 1e-3, 0.0]}


@st.composite
def norm_inputs(draw: st.DrawFn, op: str, dtype: str, writable: bool = False) -> dict[str, Any]:
    batch = draw(shapes(max_dims=2, max_side=4), label="batch dims")
    dims = draw(hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=8), label="normalized dims")
    normalized_shape: int | tuple[int, ...] = dims
    if len(dims) == 1 and draw(st.booleans()):
        normalized_shape = dims[0]
    spread = draw(st.sampled_from([1.0, 0.01, 30.0]))
    shift = draw(st.sampled_from([0.0, 0.5, -3.0]))
    fill = uniform(shift - spread, shift + spread)
    shape = (*batch, *dims)
    x = draw(writable_views(shape, dtype, fill) if writable else views(shape, dtype, fill), label="x")
    weight = draw(st.none() | views(dims, dtype, uniform(-2, 2)), label="weight")
    case = {"x": x, "normalized_shape": normalized_shape, "weight": weight}
    if op == "layer_norm":
        case["bias"] = draw(st.none() | views(dims, dtype, uniform(-1, 1)), label="bias")
    eps = draw(st.sampled_from(NORM_EPS[op]), label="eps")
    if eps is not None:
        case["eps"] = eps
    return case


def norm_reference_and_tolerance(op: str, case: dict[str, Any], dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """The reference and an error bound: rtol * (|ref| + condition * |weight| + |bias|) + final rounding.

    layer_norm's condition is max|x| / sqrt(var + eps) per row: x - mean, computed in float32, carries an
    absolute error of ~eps * max|x|, which the division by the standard deviation magnifies. rms_norm is
    well conditioned (|x| / rms <= sqrt(n)); its condition is 1.
    """
    x = case["x"].astype(np.float64)
    dims = case["normalized_shape"]
    axes = tuple(range(x.ndim - (1 if isinstance(dims, int) else len(dims)), x.ndim))
    weight = 1.0 if case["weight"] is None else np.abs(case["weight"].astype(np.float64))
    if op == "layer_norm":
        ref = layer_norm_reference(**case)
        eps = case.get("eps", 1e-5)
        variance = x.var(axis=axes, keepdims=True) if x.size else np.zeros(())
        peak = np.abs(x).max(axis=axes, keepdims=True) if x.size else np.zeros(())
        condition = 1 + peak / np.sqrt(variance + eps)
        bias = 0.0 if case.get("bias") is None else np.abs(case["bias"].astype(np.float64))
    else:
        ref = rms_norm_reference(**case)
        condition, bias = 1.0, 0.0
    rtol = 1e-12 if dtype == "float64" else 1e-5
    rtol_out, atol = out_rounding(dtype)
    with np.errstate(invalid="ignore"):
        tol = rtol * (np.abs(ref) + condition * weight + bias) + rtol_out * np.abs(ref) + atol
    return ref, np.nan_to_num(tol)


NORM_OPS = {"layer_norm": xrt.ops.layer_norm, "rms_norm": xrt.ops.rms_norm}


@pytest.mark.parametrize("op", sorted(NORM_OPS))
@examples(80)
@given(data=st.data(), dtype=st.sampled_from(FLOAT_DTYPES))
def test_norm_matches_reference(op, data, dtype):
    case = data.draw(norm_inputs(op, dtype))
    ref, tol = norm_reference_and_tolerance(op, case, dtype)
    got, how = run_op(data, op, "numpy", NORM_OPS[op], (), case, ref, dtype)
    assert got.dtype == np.dtype(dtype)
    what = f"{op} normalized_shape={case['normalized_shape']} eps={case.get('eps')} {how}; " + context(
        **{k: v for k, v in case.items() if isinstance(v, np.ndarray)}
    )
    assert_close(got, ref, tol, what)


@pytest.mark.parametrize("op", sorted(NORM_OPS))
@examples(50)
@given(data=st.data(), dtype=st.sampled_from(FLOAT_DTYPES))
def test_norm_in_place_equals_out_of_place(op, data, dtype):
    case = data.draw(norm_inputs(op, dtype, writable=True))
    ref, tol = norm_reference_and_tolerance(op, case, dtype)
    expected = call(op, "numpy", NORM_OPS[op], **case).copy()
    x = case["x"]
    result = call(op, "numpy", NORM_OPS[op], **case, out=x)
    assert result is x
    what = f"{op} in place; {context(x=x)}"
    assert_same_result(result, expected, what)
    assert_close(result, ref, tol, what)


# -- attention ----------------------------------------------------------------------------------------

ATTENTION_KERNELS = cpu_kernels("attention")
BLOCK_K = 256  # the chunked kernel's largest key block (and 128 for queries)


@st.composite
def attention_mask(
    draw: st.DrawFn, batch: tuple[int, ...], L: int, S: int, dtype: str, patterns: tuple[str, ...]
) -> np.ndarray:
    """A bool (keep) or float (additive) mask broadcastable to (*batch, L, S): random, with rows that see
    nothing, with whole key blocks hidden for some rows, with -inf entries (float)."""
    full = (*batch, L, S)
    shape = tuple(1 if draw(st.integers(0, 3)) == 3 else n for n in full)  # mostly full size
    shape = shape[draw(st.integers(0, len(batch))) :]  # may drop leading batch dims
    rng = np.random.default_rng(draw(seeds))
    kind = draw(st.sampled_from(["bool", "float"]), label="mask kind")
    pattern = draw(st.sampled_from(patterns), label="mask pattern")
    keep = rng.random(shape) < draw(st.sampled_from([0.7, 0.95, 0.2]))
    rows = rng.random((*shape[:-1], 1)) < 0.4  # the rows a pattern applies to
    if pattern == "hidden rows":
        keep &= ~rows
    elif pattern == "hidden key blocks":
        cols = np.arange(shape[-1])
        first = rng.integers(0, 2)  # hide the first key block, or everything after it
        hidden = (cols < BLOCK_K) if first == 0 else (cols >= BLOCK_K)
        if shape[-1] <= BLOCK_K:  # short sequences: hide a random run of keys instead
            lo = rng.integers(0, shape[-1] + 1)
            hidden = (cols >= lo) & (cols < lo + rng.integers(1, shape[-1] + 2))
        keep &= ~(rows & hidden)
    if kind == "bool":
        values = keep
    else:
        values = np.where(keep, rng.uniform(-2, 2, size=shape), -np.inf).astype(dtype)
    return draw(views_of(values), label="attn_mask")


@st.composite
def attention_inputs(draw: st.DrawFn, dtype: str, big: bool = False) -> dict[str, Any]:
    if big:  # several query blocks (128) and key blocks (256) for the chunked kernel
        batches = draw(hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=1, min_side=1, max_side=2))
        L = draw(st.sampled_from([1, 127, 129, 300]), label="L")
        S = draw(st.sampled_from([300, 257, 255]), label="S")
        E, Ev = draw(st.integers(1, 4), label="E"), draw(st.integers(1, 4), label="Ev")
    else:
        batches = draw(broadcastable_shapes(3, max_dims=2, max_side=3))
        L = 0 if rarely(draw) else draw(st.integers(1, 9), label="L")
        # S == 0 is allowed only with L == 0 (softmax over no keys is undefined); try it often then
        S = 0 if L == 0 and draw(st.booleans()) else draw(st.integers(1, 9), label="S")
        E, Ev = draw(st.integers(1, 8), label="E"), draw(st.integers(1, 8), label="Ev")
    bq, bk, bv = batches.input_shapes
    batch = np.broadcast_shapes(bq, bk, bv)
    qk_range = draw(st.sampled_from([1.0, 3.0]))
    case: dict[str, Any] = {
        "q": draw(views((*bq, L, E), dtype, uniform(-qk_range, qk_range)), label="q"),
        "k": draw(views((*bk, S, E), dtype, uniform(-qk_range, qk_range)), label="k"),
        "v": draw(views((*bv, S, Ev), dtype), label="v"),
    }
    if big:  # mostly masks that hide a whole key block from some rows
        masking = draw(st.sampled_from(["mask", "mask", "causal", "mask", "none"]), label="masking")
        patterns: tuple[str, ...] = ("hidden key blocks", "hidden key blocks", "hidden rows")
    else:
        masking = draw(st.sampled_from(["mask", "causal", "mask", "none"]), label="masking")
        patterns = ("hidden key blocks", "hidden rows", "random")
    if masking == "causal":
        case["is_causal"] = True
    elif masking == "mask":
        case["attn_mask"] = draw(attention_mask(batch, L, S, dtype, patterns))
    scale = draw(st.none() | st.floats(0.05, 2.0), label="scale")
    if scale is not None:
        case["scale"] = scale
    return case


def check_attention(data: st.DataObject, kernel: str, case: dict[str, Any], dtype: str) -> None:
    ref = attention_reference(**case)
    mask = case.get("attn_mask")
    event(f"attention mask: {'causal' if case.get('is_causal') else 'none' if mask is None else mask.dtype}")
    if ref.size == 0:
        event("attention: empty output")
    S = case["k"].shape[-2]
    if mask is not None and S > BLOCK_K:  # some row sees nothing in one key block but something elsewhere
        seen = np.broadcast_to(mask != (False if mask.dtype == bool else -np.inf), (*ref.shape[:-1], S))
        block_hidden = ~seen[..., :BLOCK_K].any(-1) | ~seen[..., BLOCK_K:].any(-1)
        if (block_hidden & seen.any(-1)).any():
            event("attention: a key block hidden for a row that sees other keys")
    got, how = run_op(data, "attention", kernel, xrt.ops.attention, (), case, ref, dtype)
    assert got.dtype == np.dtype(dtype)
    arrays = {k: v for k, v in case.items() if isinstance(v, np.ndarray)}
    what = f"attention/{kernel} is_causal={case.get('is_causal', False)} scale={case.get('scale')} {how}; " + context(
        **arrays
    )
    # outputs are convex combinations of v's rows: errors scale with max|v| (float32 rounding of scores,
    # exp and the running rescaling); float16 rounds the float32 result once more
    v_max = float(np.abs(case["v"]).max(initial=0))
    rtol = 1e-12 if dtype == "float64" else 1e-5
    rtol_out, atol = out_rounding(dtype)
    assert_close(got, ref, rtol * v_max + rtol_out * np.abs(ref) + atol, what)


@pytest.mark.parametrize("kernel", ATTENTION_KERNELS)
@examples(100)
@given(data=st.data(), dtype=st.sampled_from(FLOAT_DTYPES))
def test_attention_matches_reference(kernel, data, dtype):
    check_attention(data, kernel, data.draw(attention_inputs(dtype)), dtype)


@pytest.mark.parametrize("kernel", ATTENTION_KERNELS)
@examples(24)
@given(data=st.data(), dtype=st.sampled_from(FLOAT_DTYPES))
def test_attention_long_sequences(kernel, data, dtype):
    """L and S past the chunked kernel's blocks (128 queries x 256 keys), masks hiding whole blocks."""
    check_attention(data, kernel, data.draw(attention_inputs(dtype, big=True)), dtype)


# -- regressions: one small, fixed case per bug these properties found ----------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_regression_sin_affine_0d_input_with_scalar_a_and_b(dtype):
    """float32/float16 computed x*a into a NumPy scalar for 0-d inputs, then failed to write into it."""
    x = np.array(0.5, dtype)
    got = call("sin_affine", "numpy", xrt.ops.sin_affine, x, 2.0, 0.25)
    assert got.shape == () and got.dtype == np.dtype(dtype)
    check_sin_affine(got, sin_affine_reference(x, 2.0, 0.25), dtype, "0-d sin_affine")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_regression_sin_affine_b_broadcasts_beyond_x_times_a(dtype):
    """float32/float16 sized the work array by x*a, too small when b adds dimensions."""
    x, b = np.linspace(-1, 1, 3).astype(dtype), np.linspace(0, 1, 6).astype(dtype).reshape(2, 3)
    got = call("sin_affine", "numpy", xrt.ops.sin_affine, x, 2.0, b)
    check_sin_affine(got, sin_affine_reference(x, 2.0, b), dtype, "sin_affine with a wider b")


def test_regression_sin_affine_float64_out_is_b():
    """The schema lets `out` be any input's view; float64 wrote x*a into out=b before reading b."""
    x, a, b = np.linspace(-1, 1, 5), np.linspace(0.5, 2, 5), np.linspace(1, 3, 5)
    ref = sin_affine_reference(x, a, b)
    got = call("sin_affine", "numpy", xrt.ops.sin_affine, x, a, b, out=b)
    assert got is b
    check_sin_affine(got, ref, "float64", "sin_affine(out=b)")


@pytest.mark.parametrize("k", [0, 3])
def test_regression_blocked_matmul_vector_at_vector(k):
    """The blocked kernel expanded a 0-d output with expand_dims(-2), which raises."""
    a, b = np.arange(k, dtype=np.float32), np.ones(k, np.float32)
    got = call("matmul", "blocked", xrt.ops.matmul, a, b)
    assert got.shape == () and got == matmul_reference(a, b)


def test_regression_softmax_float16_subtracts_in_float32():
    """x - max was computed in float16 (then widened), an error of up to 2^-11 * |x - max| in exp's argument."""
    x = np.array([1.0009765625, -7.3, -3.1], np.float16)
    ref = softmax_reference(x)
    got = call("softmax", "numpy", xrt.ops.softmax, x)
    assert_close(got, ref, softmax_tolerance(ref, x, -1, "float16"), "fp16 softmax")


@pytest.mark.parametrize("kernel", ATTENTION_KERNELS)
def test_regression_attention_accepts_a_bool_mask(kernel):
    """Kernels listed only float dtypes, and the registry checks every tensor's dtype: a bool mask (which the
    schema accepts) left no kernel to run."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.uniform(-1, 1, (2, 4, 3)).astype(np.float32) for _ in range(3))
    mask = np.tril(np.ones((4, 4), bool))
    got = call("attention", kernel, xrt.ops.attention, q, k, v, mask)
    assert_close(got, attention_reference(q, k, v, mask), 1e-5, f"attention/{kernel} with a bool mask")


@pytest.mark.parametrize("kernel", ATTENTION_KERNELS)
@pytest.mark.parametrize("q_shape, kv_shape", [((2, 0, 4), (2, 0, 4)), ((0, 5, 4), (0, 6, 4))])
def test_regression_attention_empty(kernel, q_shape, kv_shape):
    """L == S == 0 made `math` (and the reference) take max() over no keys; a 0-size batch gave `chunked` no
    workspace, which it then used."""
    q, k = np.ones(q_shape, np.float32), np.ones(kv_shape, np.float32)
    v = np.ones((*kv_shape[:-1], 3), np.float32)
    ref = attention_reference(q, k, v)
    got = call("attention", kernel, xrt.ops.attention, q, k, v)
    assert got.shape == ref.shape == (*q_shape[:-1], 3)
