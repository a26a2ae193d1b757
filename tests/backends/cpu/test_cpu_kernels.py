"""The CPU kernels at the edges: float32 extremes, non-native byte order and unaligned outputs, outputs that are
an input's own view, integer sums that must not wrap."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import xpuruntime as xrt
from xpuruntime.ops.attention import reference as attention_reference
from xpuruntime.ops.fused_elementwise import reference as fused_reference
from xpuruntime.ops.norm import layer_norm_reference

TOLERANCE = {"float16": 2e-3, "float32": 2e-5, "float64": 1e-12}

rng = np.random.default_rng(7)


@pytest.fixture(params=["numpy", "torch"])
def gelu_path(request, monkeypatch):
    """The float32 GELU runs on PyTorch's kernel where PyTorch is loaded, else on NumPy passes: both, here. The
    default registry is found first, with PyTorch importable: found while it is hidden, it would lack the
    PyTorch backend's kernels for the rest of the process (tests run after this one failed for it)."""
    xrt.default_dispatcher()
    if request.param == "numpy":
        monkeypatch.setitem(sys.modules, "torch", None)  # sys.modules.get("torch") is None: not loaded
    else:
        pytest.importorskip("torch")
    return request.param


def test_gelu_of_huge_finite_values_is_finite_and_exact(gelu_path):
    """NumPy: relu(x) written as x/2 + |x|/2 must not overflow where (x + |x|)/2 would (x > 1.7e38 in fp32);
    PyTorch: its x * (1 + erf) / 2 overflows there, and min(gelu, |x|) mends it."""
    x = np.array([3e38, -3e38, 1.7e38, -2.5, 0.0, 2.5, 1e-30, np.nan], np.float32)
    program = (("gelu", ("in", 0)),)
    got = xrt.ops.fused_elementwise(program, x, dtype="float32")
    ref = fused_reference(x, program=program, dtype="float64")
    assert np.all(np.isfinite(got[:7])), got
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7)


def test_gelu_of_random_rows_matches_float64_on_both_paths(gelu_path):
    """Bias + GELU over blocks of rows (the fused program's chunks), each path against the float64 reference."""
    x = rng.standard_normal((5, 40_003)).astype(np.float32) * 4
    b = rng.standard_normal(40_003).astype(np.float32)
    program = (("add", ("in", 0), ("in", 1)), ("gelu", ("t", 0)))
    got = xrt.ops.fused_elementwise(program, x, b, dtype="float32")
    np.testing.assert_allclose(got, fused_reference(x, b, program=program, dtype="float64"), rtol=2e-6, atol=2e-6)


def test_bias_gelu_in_row_blocks_matches_the_reference():
    """Long programs run over blocks of rows; the blocks must cover every element exactly once."""
    x = rng.standard_normal((3, 70_001)).astype(np.float32) * 3
    b = rng.standard_normal(70_001).astype(np.float32)
    program = (("add", ("in", 0), ("in", 1)), ("gelu", ("t", 0)))
    out = np.full_like(x, np.nan)
    xrt.ops.fused_elementwise(program, x, b, dtype="float32", out=out)
    np.testing.assert_allclose(out, fused_reference(x, b, program=program, dtype="float64"), rtol=2e-6, atol=2e-6)


def test_attention_with_huge_values_stays_finite():
    """Normalizing after the PV product must not overflow when v is huge but finite."""
    q = rng.standard_normal((2, 5, 8)).astype(np.float32)
    k = rng.standard_normal((2, 7, 8)).astype(np.float32)
    v = (rng.standard_normal((2, 7, 8)) * 1e37).astype(np.float32)
    with xrt.kernel_policy(attention="math"):
        got = xrt.ops.attention(q, k, v)
    ref = attention_reference(q, k, v)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_attention_with_large_scores_takes_the_max_subtracting_path():
    """Scores above the skip-the-max threshold (60) still give the float64 answer."""
    q = (rng.standard_normal((1, 4, 16)) * 10).astype(np.float32)
    k = (rng.standard_normal((1, 6, 16)) * 10).astype(np.float32)
    v = rng.standard_normal((1, 6, 16)).astype(np.float32)
    with xrt.kernel_policy(attention="math"):
        got = xrt.ops.attention(q, k, v)
    np.testing.assert_allclose(got, attention_reference(q, k, v), rtol=1e-4, atol=1e-4)


def _decoder_mask(batch: int, seq: int, kind: str, rng: np.random.Generator) -> np.ndarray:
    """A causal mask with left padding (rows after the first padded): a padded query row sees no key. `kind`
    "float": additive, float32.min where hidden (as Hugging Face builds it); "bool": True where visible."""
    visible = np.broadcast_to(np.tril(np.ones((seq, seq), bool)), (batch, 1, seq, seq)).copy()
    for row in range(1, batch):
        visible[row, :, :, : int(rng.integers(1, seq // 2 + 1))] = False
    if kind == "bool":
        return visible
    return np.where(visible, 0.0, np.finfo(np.float32).min).astype(np.float32)


@pytest.mark.parametrize("kind", ["float", "bool", "keys only"])
def test_attention_with_rows_the_mask_hides_computes_the_scores_once(kind, monkeypatch):
    """Query rows that see no key (a decoder's padded rows) go straight to the row-max path: the scores are
    computed once, and the answer is float64's (the uniform average under float32.min, NaN under a boolean
    mask). A padding mask over keys only (an encoder's) hides no row and skips the row max."""
    import xpuruntime.backends.cpu.attention as cpu_attention

    calls = []
    scores = cpu_attention._masked_scores
    monkeypatch.setattr(cpu_attention, "_masked_scores", lambda *a, **kw: calls.append(1) or scores(*a, **kw))
    q, k, v = (rng.standard_normal((3, 2, 9, 8)).astype(np.float32) for _ in range(3))
    if kind == "keys only":
        mask = np.where(np.arange(9) < 6, 0.0, -1e9).astype(np.float32)[None, None, None, :]
    else:
        mask = _decoder_mask(3, 9, kind, rng)
    with xrt.kernel_policy(attention="math", strict=True):
        got = xrt.ops.attention(q, k, v, mask)
    want = attention_reference(q, k, v, mask)
    assert calls == [1]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert kind != "bool" or np.isnan(want).any()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_layer_norm_backward_of_a_row_with_nearly_equal_values() -> None:
    """Variance below eps: the gradient cancels hard; float32 statistics were off by 1e-3 relative
    (the row hypothesis found)."""
    dy = np.array([-1.9312029, 1.3191638], np.float32)
    x = np.array([0.31602243, 0.31184763], np.float32)
    w = np.array([-0.38486296, 0.5592245], np.float32)
    dx, dw, db = xrt.ops.layer_norm_backward(dy, x, 2, w, 1e-5)
    x64, dy64, w64 = (a.astype(np.float64) for a in (x, dy, w))
    centered = x64 - x64.mean()
    rstd = 1.0 / np.sqrt(np.mean(centered**2) + 1e-5)
    xhat, g = centered * rstd, dy64 * w64
    np.testing.assert_allclose(dx, rstd * (g - g.mean() - xhat * np.mean(g * xhat)), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(dw, dy64 * xhat, rtol=1e-6)
    np.testing.assert_allclose(db, dy64, rtol=1e-7)


@pytest.mark.parametrize("op,kernel", [("attention", "math"), ("attention", "chunked"), ("attention_forward", "math")])
def test_attention_with_a_scale_that_overflows_float32_scores(op, kernel):
    """scale * q.k beyond float32's range (hypothesis found scale=2.7e38): every score of a row became
    -inf and the row NaN, though the softmax is finite; such scores are computed in float64."""
    q, k, v = (rng.standard_normal((3, 5, 4)).astype(np.float32) for _ in range(3))
    scale = 2.7e38
    inputs = (q, k, v, None) if op == "attention" else (q, k, v, None, np.full((3, 5), np.nan, np.float32))
    attrs = (False, scale) if op == "attention" else (False, scale, False)
    with xrt.kernel_policy(strict=True, **{op: kernel}):
        got = xrt.dispatch.run(op, inputs, attrs)
    ref = attention_reference(q, k, v, scale=scale)
    assert np.isfinite(got).all(), got
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")  # NumPy says so for the 0/0 row
@pytest.mark.parametrize("dtype", [np.float32, np.float64, ">f8"])
def test_layer_norm_adds_eps_in_the_accumulation_dtype(dtype):
    """An eps below float32's smallest subnormal is 0 for float32 inputs (as in PyTorch): a constant row is
    then 0/0 in the kernel and in the reference alike; float64 inputs (either byte order) keep it."""
    x = np.array([[0.25], [-1.5]], dtype)
    got = xrt.ops.layer_norm(x, (1,), eps=5e-324)
    want = xrt.default_dispatcher().registry.op("layer_norm").reference(x, (1,), None, None, 5e-324)
    if np.dtype(dtype).type is np.float64:
        np.testing.assert_array_equal(want, 0.0)
        np.testing.assert_array_equal(got, 0.0)
    else:
        assert np.isnan(want).all() and np.isnan(got).all()


def _big_endian(a: np.ndarray) -> np.ndarray:
    return a.astype(a.dtype.newbyteorder(">"))


@pytest.mark.parametrize(("dtype", "out_dtype"), [(np.float32, ">f4"), (np.uint64, ">u8"), (np.int32, ">i8")])
def test_sum_into_a_non_native_byte_order_output(dtype, out_dtype):
    x = _big_endian(rng.integers(0, 5, (3, 4)).astype(dtype))
    out = np.empty(3, out_dtype)
    assert xrt.ops.sum(x, axis=1, out=out) is out
    np.testing.assert_array_equal(out, x.astype(np.float64).sum(axis=1))


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_softmax_and_chunked_attention_of_non_native_byte_order_arrays(dtype):
    x = _big_endian(rng.standard_normal((3, 4)).astype(dtype))
    ref = np.exp(x.astype(np.float64) - x.astype(np.float64).max(-1, keepdims=True))
    np.testing.assert_allclose(xrt.ops.softmax(x), ref / ref.sum(-1, keepdims=True), rtol=2e-3, atol=1e-3)
    q, k, v = (_big_endian(rng.standard_normal(s).astype(dtype)) for s in ((1, 1), (1, 1, 1), (5, 1, 1)))
    with xrt.kernel_policy(attention="chunked", strict=True):
        got = xrt.ops.attention(q, k, v)
    np.testing.assert_allclose(got, np.broadcast_to(v.astype(np.float64), (5, 1, 1)), rtol=2e-3)


def test_gemv_writes_an_unaligned_output():
    a, b = rng.standard_normal((1, 4)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)
    raw = np.empty(4 * 3 + 1, np.uint8)
    out = raw[1:].view(np.float32).reshape(1, 3)
    assert not out.flags.aligned
    with xrt.kernel_policy(matmul="gemv", strict=True):
        xrt.ops.matmul(a, b, out=out)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-5)


def test_gemv_writes_a_non_native_byte_order_output():
    a, b = rng.standard_normal((1, 4)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)
    out = np.empty((1, 3), dtype=">f4")  # float32 by name, big-endian in memory
    with xrt.kernel_policy(matmul="gemv", strict=True):
        assert xrt.ops.matmul(a, b, out=out) is out
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-6)


def test_uint64_sums_do_not_wrap():
    assert xrt.ops.sum(np.array([2**64 - 1], np.uint64)) == 2**64 - 1
    assert xrt.ops.sum(np.array([2**63, 2**62], np.uint64)).dtype == np.uint64


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 33),
    dtype=st.sampled_from(["float32", "float64", "float16"]),
    target=st.sampled_from(["weight", "bias", "x_is_weight"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_layer_norm_out_may_be_the_very_view_of_weight_or_bias(n, dtype, target, seed):
    """The in-place rule lets `out` be exactly any input's view; with a 1-d x that includes weight and bias,
    which the kernel must not overwrite before it reads them."""
    rng = np.random.default_rng(seed)
    x, w, b = (rng.standard_normal(n).astype(dtype) for _ in range(3))
    if target == "x_is_weight":
        w = x
    want = layer_norm_reference(x, (n,), w, b)
    out = {"weight": w, "bias": b, "x_is_weight": x}[target]
    got = xrt.ops.layer_norm(x, (n,), w, b, out=out)
    assert got is out
    np.testing.assert_allclose(got, want, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype] * 4)
