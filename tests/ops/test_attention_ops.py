"""attention_forward / attention_backward on the CPU against float64 references, their errors, and the
autotune selection mode."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import xpuruntime as xrt
from xpuruntime.autotune import STORE
from xpuruntime.dispatch import default_dispatcher, run
from xpuruntime.errors import ArgumentError, DTypeError, ShapeError
from xpuruntime.ops.attention_backward import gradients_reference, unpack
from xpuruntime.ops.attention_backward import reference as backward_reference
from xpuruntime.ops.attention_forward import lse_reference
from xpuruntime.ops.attention_forward import reference as forward_reference
from xpuruntime.policy import current_policy

TOL = {"float16": 5e-3, "float32": 1e-5, "float64": 1e-12}
LSE_DTYPE = {"float16": np.float32, "float32": np.float32, "float64": np.float64}  # float64 gradients need float64


def _inputs(rng, B, H, Hk, L, S, E, dtype, mask_kind=None, layout_bshd=False):
    q = rng.standard_normal((B, L, H, E)).astype(dtype).transpose(0, 2, 1, 3) if layout_bshd else None
    if q is None:
        q = rng.standard_normal((B, H, L, E)).astype(dtype)
    k = rng.standard_normal((B, Hk, S, E)).astype(dtype)
    v = rng.standard_normal((B, Hk, S, E)).astype(dtype)
    mask = None
    if mask_kind == "bool":
        mask = rng.random((1, H, L, S)) > 0.3
    elif mask_kind == "add":
        mask = rng.standard_normal((L, S)).astype(dtype)
    return q, k, v, mask


def _close(got, ref, dtype, what, floor=0.0):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert got.shape == ref.shape, what
    assert np.array_equal(np.isnan(got), np.isnan(ref)), f"{what}: NaN positions differ"
    finite = ~np.isnan(ref)
    scale = max(float(np.abs(ref[finite]).max(initial=0.0)), 1.0)
    err = float(np.abs(got[finite] - ref[finite]).max(initial=0.0)) / scale
    tol = max(TOL[dtype], floor)
    assert err <= tol, f"{what}: error {err:.2e} > {tol:.0e}"


CASES = [  # B, H, Hk, L, S, E, causal, mask, dtype
    (2, 4, 4, 7, 9, 8, False, None, "float32"),
    (1, 4, 2, 9, 5, 16, True, None, "float64"),  # GQA, causal with L > S
    (2, 6, 2, 5, 11, 8, True, None, "float32"),  # GQA, causal with L < S
    (1, 2, 2, 13, 13, 4, False, "bool", "float16"),
    (2, 3, 3, 6, 7, 8, False, "add", "float32"),
    (1, 2, 1, 1, 1, 3, False, None, "float64"),
]


@pytest.mark.parametrize("case", CASES)
def test_forward_matches_reference(case) -> None:
    B, H, Hk, L, S, E, causal, mk, dtype = case
    rng = np.random.default_rng()
    q, k, v, mask = _inputs(rng, B, H, Hk, L, S, E, dtype, mk, layout_bshd=True)
    gqa = Hk != H
    out = np.full((B, H, L, E), np.nan, dtype)  # poisoned: unwritten elements would stay NaN
    result, lse = xrt.ops.attention_forward(q, k, v, mask, causal, None, gqa, out=out)
    assert result is out
    _close(out, forward_reference(q, k, v, mask, None, causal, None, gqa), dtype, "out")
    want = lse_reference(q, k, mask, causal, None, gqa)
    assert lse.dtype == LSE_DTYPE[dtype] and lse.shape == (B, H, L)
    _close(np.where(np.isinf(want), 0, lse), np.where(np.isinf(want), 0, want), "float32" if dtype == "float32"
           else dtype, "lse")  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_backward_matches_reference(case) -> None:
    B, H, Hk, L, S, E, causal, mk, dtype = case
    rng = np.random.default_rng()
    q, k, v, mask = _inputs(rng, B, H, Hk, L, S, E, dtype, mk)
    gqa = Hk != H
    out, lse = xrt.ops.attention_forward(q, k, v, mask, causal, None, gqa)
    do = rng.standard_normal(out.shape).astype(dtype)
    packed = np.full(q.size + k.size + v.size, np.nan, dtype)
    dq, dk, dv = xrt.ops.attention_backward(do, q, k, v, out, lse, mask, causal, None, gqa, grads_out=packed)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    for got, want, name in zip((dq, dk, dv), gradients_reference(do, q, k, v, mask, causal, None, gqa), "qkv"):
        _close(got, want, dtype, f"d{name}")
    _close(packed, backward_reference(do, q, k, v, out, lse, mask, causal, None, gqa), dtype, "packed")


def test_gradient_reference_matches_finite_differences() -> None:
    """The float64 backward reference is the derivative of the float64 forward reference (GQA, additive mask)."""
    rng = np.random.default_rng()
    q, k, v, _ = _inputs(rng, 1, 4, 2, 3, 4, 3, "float64")
    mask = rng.standard_normal((3, 4))
    do = rng.standard_normal((1, 4, 3, 3))

    def loss(q_, k_, v_):
        return float((forward_reference(q_, k_, v_, mask, None, False, 0.7, True) * do).sum())

    grads = gradients_reference(do, q, k, v, mask, False, 0.7, True)
    for x, g in zip((q, k, v), grads):
        numeric = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            e = np.zeros_like(x)
            e[idx] = 1e-6
            numeric[idx] = (loss(*(t + e if t is x else t for t in (q, k, v)))
                            - loss(*(t - e if t is x else t for t in (q, k, v)))) / 2e-6  # fmt: skip
        np.testing.assert_allclose(g, numeric, atol=1e-6, rtol=1e-5)


def test_rows_that_see_no_key() -> None:
    """Forward: NaN and lse = +inf, as PyTorch's math backend; backward: no gradient from those rows."""
    rng = np.random.default_rng()
    q, k, v, _ = _inputs(rng, 1, 2, 2, 4, 5, 8, "float32")
    mask = rng.random((4, 5)) > 0.2
    mask[1] = False
    mask[2, 0] = True
    out, lse = xrt.ops.attention_forward(q, k, v, mask)
    assert np.isnan(out[:, :, 1]).all() and not np.isnan(np.delete(out, 1, axis=2)).any()
    assert np.isinf(lse[:, :, 1]).all() and (lse[:, :, 1] > 0).all()
    do = rng.standard_normal(out.shape).astype(np.float32)
    dq, dk, dv = xrt.ops.attention_backward(do, q, k, v, out, lse, mask)
    assert not any(np.isnan(g).any() for g in (dq, dk, dv))
    assert (dq[:, :, 1] == 0).all()
    _close(dk, gradients_reference(do, q, k, v, mask)[1], "float32", "dk")


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 2), st.sampled_from([(1, 1), (2, 1), (4, 2), (3, 3)]), st.integers(1, 9), st.integers(1, 9),
    st.integers(1, 6), st.booleans(), st.sampled_from(["float32", "float64"]), st.integers(0, 2**32 - 1),
)  # fmt: skip
def test_property_forward_backward(B, heads, L, S, E, causal, dtype, seed) -> None:
    H, Hk = heads
    rng = np.random.default_rng(seed)
    q, k, v, _ = _inputs(rng, B, H, Hk, L, S, E, dtype)
    gqa = Hk != H
    out, lse = xrt.ops.attention_forward(q, k, v, None, causal, None, gqa)
    _close(out, forward_reference(q, k, v, None, None, causal, None, gqa), dtype, "out")
    do = rng.standard_normal(out.shape).astype(dtype)
    grads = xrt.ops.attention_backward(do, q, k, v, out, lse, None, causal, None, gqa)
    for got, want in zip(grads, gradients_reference(do, q, k, v, None, causal, None, gqa)):
        _close(got, want, dtype, "grad")


def _relative_errors(got, want) -> list[float]:
    return [float(np.abs(np.asarray(g, np.float64) - w).max() / np.abs(w).max()) for g, w in zip(got, want)]


@pytest.mark.parametrize("library", ["numpy", "torch"])
@pytest.mark.parametrize("mask_kind", [None, "bool", "add"])
def test_float64_gradients_keep_float64_precision(library, mask_kind) -> None:
    """float64 inputs get a float64 logsumexp, so their gradients match the float64 reference to ~1e-15, not to
    the ~1e-7 a float32 lse allowed (large scores: lse ~ 30, where float32 rounds by ~2e-6)."""
    rng = np.random.default_rng(7)
    q, k, v, mask = _inputs(rng, 2, 4, 2, 9, 11, 8, "float64", mask_kind)
    q = q * 2.5
    if mask_kind == "bool":
        mask[0, 1, 3] = False  # a row that sees no key: no gradient
    do = rng.standard_normal((2, 4, 9, 8))
    args = (q, k, v, mask, do)
    if library == "torch":
        torch = pytest.importorskip("torch")
        args = tuple(None if a is None else torch.from_numpy(a) for a in args)
    out, lse = xrt.ops.attention_forward(*args[:4], enable_gqa=True)
    assert str(lse.dtype).removeprefix("torch.") == "float64"
    want_lse = lse_reference(q, k, mask, False, None, True)
    finite = np.isfinite(want_lse)
    assert (np.asarray(lse)[~finite] == np.inf).all()
    assert np.abs(np.asarray(lse)[finite] - want_lse[finite]).max() <= 1e-13 * np.abs(want_lse[finite]).max()
    grads = xrt.ops.attention_backward(args[4], *args[:3], out, lse, args[3], enable_gqa=True)
    errors = _relative_errors(grads, gradients_reference(do, q, k, v, mask, False, None, True))
    assert max(errors) < 1e-12, errors


def test_float64_inputs_take_a_float32_lse_without_losing_precision() -> None:
    """A float32 lse with float64 inputs (a caller that allocates float32 whatever the inputs) is accepted by both
    ops; the backward renormalizes P's rows, so the gradients keep float64 precision. Other dtypes take float32
    only."""
    rng = np.random.default_rng(8)
    q, k, v, _ = _inputs(rng, 1, 2, 2, 6, 7, 4, "float64")
    q = q * 3.0
    do = rng.standard_normal((1, 2, 6, 4))
    lse32 = np.full((1, 2, 6), np.nan, np.float32)
    out = run("attention_forward", (q, k, v, None, lse32), (True, None, False))
    np.testing.assert_allclose(lse32, lse_reference(q, k, None, True), rtol=1e-6)
    grads = xrt.ops.attention_backward(do, q, k, v, out, lse32, is_causal=True)
    errors = _relative_errors(grads, gradients_reference(do, q, k, v, None, True))
    assert max(errors) < 1e-12, errors
    q32, k32, v32 = (t.astype(np.float32) for t in (q, k, v))
    with pytest.raises(DTypeError, match=r"'lse'.*float32 \(for 'q' of dtype float32\)"):
        run("attention_forward", (q32, k32, v32, None, np.zeros((1, 2, 6), np.float64)), (False, None, False))
    out32, lse = xrt.ops.attention_forward(q32, k32, v32)
    assert lse.dtype == np.float32
    with pytest.raises(DTypeError, match="'lse'"):
        xrt.ops.attention_backward(out32, q32, k32, v32, out32, lse.astype(np.float64))
    with pytest.raises(DTypeError, match=r"'lse'.*float64 or float32"):
        run("attention_forward", (q, k, v, None, np.zeros((1, 2, 6), np.float16)), (False, None, False))


def test_errors_name_the_argument() -> None:
    rng = np.random.default_rng()
    q, k, v, _ = _inputs(rng, 1, 4, 3, 5, 6, 8, "float32")
    with pytest.raises(ShapeError, match="'k'"):
        xrt.ops.attention_forward(q, k, v, enable_gqa=True)  # 3 key/value heads do not divide 4
    q, k, v, _ = _inputs(rng, 1, 4, 2, 5, 6, 8, "float32")
    with pytest.raises(ShapeError, match="'k'"):
        xrt.ops.attention_forward(q, k, v)  # GQA shapes without enable_gqa
    q, k, v, _ = _inputs(rng, 1, 2, 2, 5, 6, 8, "float32")
    with pytest.raises(ArgumentError, match="is_causal"):
        xrt.ops.attention_forward(q, k, v, np.ones((5, 6), bool), True)
    with pytest.raises(DTypeError, match="'lse'"):
        run("attention_forward", (q, k, v, None, np.zeros((1, 2, 5), np.float64)), (False, None, False))
    with pytest.raises(ShapeError, match="'lse'"):
        run("attention_forward", (q, k, v, None, np.zeros((1, 2, 4), np.float32)), (False, None, False))
    out, lse = xrt.ops.attention_forward(q, k, v)
    with pytest.raises(ShapeError, match="'grad_out'"):
        xrt.ops.attention_backward(out[..., :3, :], q, k, v, out, lse)
    with pytest.raises(DTypeError, match="'out'"):
        xrt.ops.attention_backward(out, q, k, v, out.astype(np.float64), lse)


def test_unpack_views_share_memory() -> None:
    packed = np.arange(2 * 3 + 4 + 4, dtype=np.float32)
    dq, dk, dv = unpack(packed, (2, 3), (2, 2), (1, 4))
    assert dq.base is packed and dv[0, 3] == packed[-1] and dk.shape == (2, 2)


# -- the autotune selection mode ---------------------------------------------------------------------


@pytest.fixture
def tuning_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XPURUNTIME_CACHE_DIR", str(tmp_path))
    from xpuruntime.runtime import tuning_cache

    monkeypatch.setattr(tuning_cache, "_default", None, raising=False)
    STORE.memory.clear()
    yield tmp_path
    STORE.memory.clear()


def test_autotune_times_candidates_logs_reason_and_caches_the_winner(tuning_dir) -> None:
    rng = np.random.default_rng()
    q, k, v, _ = _inputs(rng, 2, 4, 4, 33, 47, 16, "float32")
    xrt.enable_dispatch_logging()
    with xrt.kernel_policy(xrt.KernelPolicy(attention="autotune")):
        out = xrt.ops.attention(q, k, v)
        xrt.ops.attention(q, k, v)
    logs = [r for r in xrt.get_dispatch_logs() if r.op_name == "attention"]
    assert [r.reason for r in logs] == ["autotune", "autotune"] and [r.cache_hit for r in logs] == [False, True]
    assert logs[0].selected_kernel in ("math", "chunked")
    np.testing.assert_allclose(out, forward_reference(q, k, v), atol=1e-5)
    stored = list(tuning_dir.rglob("*.json"))
    assert len(stored) == 1
    entry = next(iter(STORE.memory.values()))
    assert entry["kernel"] == logs[0].selected_kernel and set(entry["times_us"]) == {"math", "chunked"}
    assert min(entry["times_us"], key=entry["times_us"].get) == entry["kernel"]


def test_autotune_reuses_a_stored_winner(tuning_dir, monkeypatch) -> None:
    """A winner already in the cache (another process's) is used without timing anything."""
    from xpuruntime import autotune

    rng = np.random.default_rng()
    q = rng.standard_normal((1, 2, 9, 8)).astype(np.float32)
    xrt.enable_dispatch_logging()
    with xrt.kernel_policy(xrt.KernelPolicy(attention="autotune")):
        xrt.ops.attention(q, q, q)
    first = xrt.get_dispatch_logs()[-1].selected_kernel
    loser = "chunked" if first == "math" else "math"
    key = next(iter(STORE.memory))
    STORE.put(key, {"kernel": loser, "times_us": {}})
    monkeypatch.setattr(autotune, "time_candidates", lambda *a: pytest.fail("timed again"))
    default_dispatcher().plans.clear()
    with xrt.kernel_policy(xrt.KernelPolicy(attention="autotune")):
        xrt.ops.attention(q, q, q)
    assert xrt.get_dispatch_logs()[-1].selected_kernel == loser


def test_autotune_option_covers_every_op_but_not_explicit_preferences(tuning_dir) -> None:
    rng = np.random.default_rng()
    a = rng.standard_normal((17, 9)).astype(np.float32)
    xrt.enable_dispatch_logging()
    with xrt.kernel_policy(xrt.KernelPolicy(autotune=True, attention="math")):
        xrt.ops.matmul(a, a.T)
        xrt.ops.attention(a[None], a[None], a[None])
    reasons = {r.op_name: r.reason for r in xrt.get_dispatch_logs()}
    assert reasons == {"matmul": "autotune", "attention": "policy"}


def test_autotune_policy_round_trips() -> None:
    p = xrt.KernelPolicy(attention="autotune", autotune=False)
    assert p.tunes("attention") and not p.tunes("matmul")
    assert xrt.KernelPolicy.from_dict(p.to_dict()) == p
    q = xrt.KernelPolicy.from_string("autotune=true,matmul=blocked")
    assert q.autotune and q.tunes("softmax") and q.preferences == {"matmul": "blocked"}
    assert p != xrt.KernelPolicy() and "attention='autotune'" in repr(p)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with xrt.kernel_policy(attention="autotune"), xrt.kernel_policy(matmul="blocked"):
            assert current_policy().tunes("attention")


def test_scale_default_is_inverse_sqrt_head_dim() -> None:
    rng = np.random.default_rng()
    q, k, v, _ = _inputs(rng, 1, 1, 1, 3, 4, 9, "float64")
    out, _ = xrt.ops.attention_forward(q, k, v)
    np.testing.assert_allclose(out, forward_reference(q, k, v, scale=1 / math.sqrt(9)), atol=1e-12)


@pytest.mark.parametrize("kernel", ["math", "chunked"])
@pytest.mark.parametrize("heads", [(4, 2), (6, 1), (3, 3)])
def test_attention_with_enable_gqa_matches_pytorch_sdpa(kernel, heads) -> None:
    """enable_gqa=True (as F.scaled_dot_product_attention's): k and v with fewer heads dividing q's, query head h
    reading key/value head h // (Hq // Hk), a bool mask and a poisoned out; against PyTorch's SDPA in float64."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    hq, hk = heads
    q = rng.standard_normal((2, hq, 5, 8)).astype(np.float32)
    k, v = (rng.standard_normal((2, hk, 7, d)).astype(np.float32) for d in (8, 6))
    mask = rng.random((2, 1, 5, 7)) > 0.3
    mask[..., 0] = True
    as64 = [torch.tensor(t, dtype=torch.float64) for t in (q, k, v)]
    want = torch.nn.functional.scaled_dot_product_attention(*as64, torch.tensor(mask), enable_gqa=True).numpy()
    out = np.full((2, hq, 5, 6), np.nan, np.float32)
    with xrt.kernel_policy(strict=True, attention=kernel):
        got = xrt.ops.attention(q, k, v, mask, scale=None, enable_gqa=True, out=out)
    assert got is out
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_attention_heads_that_do_not_divide_are_refused_naming_the_argument() -> None:
    """Without enable_gqa, k with fewer heads does not broadcast; with it, heads must divide q's."""
    rng = np.random.default_rng(8)
    q = rng.standard_normal((2, 4, 5, 8)).astype(np.float32)
    k3 = rng.standard_normal((2, 3, 7, 8)).astype(np.float32)
    k2 = rng.standard_normal((2, 2, 7, 8)).astype(np.float32)
    with pytest.raises(ShapeError, match="attention"):
        xrt.ops.attention(q, k2, k2)
    with pytest.raises(ShapeError, match=r"'k'.*dividing"):
        xrt.ops.attention(q, k3, k3, enable_gqa=True)


def test_bounded_mask_is_a_bool_promise_that_changes_no_result() -> None:
    """bounded_mask=True on a mask at or above mask_floor (HF's fill raised to it, left padding leaving rows that
    see no key) gives what the op gives without it on the CPU kernels, and the float64 reference of the original
    finfo.min mask; a value that is not a bool is refused naming the argument."""
    from xpuruntime.ops.attention import mask_floor, reference

    rng = np.random.default_rng(11)
    q, k, v = (rng.standard_normal((2, 3, 6, 8)).astype(np.float32) for _ in range(3))
    keep = np.tril(np.ones((6, 6), bool)) & (np.arange(6) >= np.array([[0], [3]])[:, None, :])[:, None]
    low = np.where(keep, 0.0, np.finfo(np.float32).min).astype(np.float32)
    bounded = np.maximum(low, np.float32(mask_floor("float32")))
    assert mask_floor("float32") == np.finfo(np.float32).min / 2 and mask_floor("bfloat16") < -1.69e38
    want = reference(q, k, v, low)
    assert np.isfinite(want).all()
    for kernel in ("math", "chunked"):
        with xrt.kernel_policy(strict=True, attention=kernel):
            got = xrt.ops.attention(q, k, v, bounded, bounded_mask=True)
            plain = xrt.ops.attention(q, k, v, bounded)
        np.testing.assert_array_equal(got, plain)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ArgumentError, match="bounded_mask"):
        xrt.ops.attention(q, k, v, bounded, bounded_mask="yes")
