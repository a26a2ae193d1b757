"""linear_cross_entropy and its backward through the CPU kernels, against F.cross_entropy(hidden @ W.T + b)
in float64 (ignore_index rows, every row ignored, label smoothing, mean / sum / none, z-loss), the gradients
against autograd and finite differences, the forward's in-pass gradients against the backward op, chunking
(several chunks of rows), out-of-range targets and errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numeric_grad import assert_gradient, numerical_vjp

import xpuruntime as xrt
from xpuruntime.backends.cpu import cross_entropy as cpu_kernel
from xpuruntime.errors import ArgumentError, DTypeError, ShapeError
from xpuruntime.ops.linear_cross_entropy import gradients_reference, reference

torch = pytest.importorskip("torch")
F = torch.nn.functional

TOL = {"float16": 3e-3, "float32": 2e-6, "float64": 1e-12}
OPTIONS = [  # label_smoothing, reduction, z_loss_scale, with bias
    (0.0, "mean", 0.0, False), (0.1, "mean", 1e-3, True), (0.0, "sum", 0.0, True), (0.2, "sum", 1e-2, False),
    (0.0, "none", 0.0, False), (0.1, "none", 1e-4, True),
]  # fmt: skip


def torch_loss(h, w, t, b, ignore_index, smoothing, reduction, z_loss_scale):
    """F.cross_entropy on the whole logits, plus the z-loss over the rows not ignored."""
    z = F.linear(h, w, b)
    loss = F.cross_entropy(z, t, ignore_index=ignore_index, reduction=reduction, label_smoothing=smoothing)
    valid = t != ignore_index
    z_loss = z_loss_scale * torch.logsumexp(z, -1) ** 2 * valid
    if reduction == "none":
        return loss + z_loss
    return loss + (z_loss.sum() / valid.sum() if reduction == "mean" else z_loss.sum())


def problem(rng, rows=29, hidden=12, vocab=41, ignored=0.2, dtype="float64", bias=False):
    h = rng.standard_normal((rows, hidden)).astype(dtype)
    w = (rng.standard_normal((vocab, hidden)) * 0.5).astype(dtype)
    t = rng.integers(0, vocab, rows)
    t[rng.random(rows) < ignored] = -100
    return h, w, t, rng.standard_normal(vocab).astype(dtype) if bias else None


@pytest.mark.parametrize(("smoothing", "reduction", "z_loss", "with_bias"), OPTIONS)
def test_reference_matches_pytorch(rng, smoothing, reduction, z_loss, with_bias):
    h, w, t, b = problem(rng, bias=with_bias)
    ht, wt = torch.tensor(h, requires_grad=True), torch.tensor(w, requires_grad=True)
    bt = None if b is None else torch.tensor(b, requires_grad=True)
    loss = torch_loss(ht, wt, torch.tensor(t), bt, -100, smoothing, reduction, z_loss)
    ref = reference(h, w, t, b, None, None, None, -100, smoothing, reduction, z_loss)
    np.testing.assert_allclose(ref, loss.detach().numpy(), rtol=1e-12, atol=1e-12)
    g = torch.randn(loss.shape, dtype=torch.float64)
    want = torch.autograd.grad(loss, [x for x in (ht, wt, bt) if x is not None], g)
    got = gradients_reference(g.numpy(), h, w, t, b, -100, smoothing, reduction, z_loss)
    for a, e in zip(got, want):
        np.testing.assert_allclose(a, e.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_gradients_reference_against_finite_differences(rng, reduction):
    h, w, t, b = problem(rng, rows=5, hidden=3, vocab=6, bias=True)
    g = rng.standard_normal(5) if reduction == "none" else np.asarray(1.7)
    f = lambda h_, w_, b_: reference(h_, w_, t, b_, None, None, None, -100, 0.1, reduction, 1e-2)  # noqa: E731
    dh, dw, db = gradients_reference(g, h, w, t, b, -100, 0.1, reduction, 1e-2)
    for i, (got, name) in enumerate(((dh, "hidden"), (dw, "weight"), (db, "bias"))):
        assert_gradient(got, numerical_vjp(f, (h, w, b), i, g), f"grad_{name}")


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize(("smoothing", "reduction", "z_loss", "with_bias"), OPTIONS)
def test_kernels_over_several_chunks(rng, monkeypatch, dtype, smoothing, reduction, z_loss, with_bias):
    monkeypatch.setattr(cpu_kernel, "CHUNK_ELEMENTS", 7 * 41)  # chunks of 7 rows: 5 chunks, the last short
    h, w, t, b = problem(rng, dtype=dtype, bias=with_bias)
    h3 = h.reshape(29, 1, 12)[:, :, ::-1]  # leading dims and a reversed view
    options = (-100, smoothing, reduction, z_loss)
    loss = xrt.ops.linear_cross_entropy(h3, w, t.reshape(29, 1), b, *options)
    ref = reference(h3, w, t.reshape(29, 1), b, None, None, None, *options)
    assert loss.dtype == (np.float64 if dtype == "float64" else np.float32) and loss.shape == ref.shape
    np.testing.assert_allclose(loss, ref, rtol=TOL[dtype], atol=TOL[dtype])
    g = rng.standard_normal(ref.shape)
    grads = xrt.ops.linear_cross_entropy_backward(g, h3, w, t.reshape(29, 1), b, *options)
    want = gradients_reference(g, h3, w, t.reshape(29, 1), b, *options)
    for got, exp, name in zip(grads, want, ("hidden", "weight", "bias")):
        if exp is not None and got is not None:
            scale = max(float(np.abs(exp).max()), 1e-30)
            assert float(np.abs(got.astype(np.float64) - exp).max()) / scale <= TOL[dtype] * 2, name
    if reduction != "none":  # the forward's in-pass gradients: those of an upstream gradient of 1
        loss2, *grads = xrt.ops.linear_cross_entropy_forward(h3, w, t.reshape(29, 1), b, *options)
        np.testing.assert_array_equal(loss2, loss)
        backward = xrt.ops.linear_cross_entropy_backward(np.ones(()), h3, w, t.reshape(29, 1), b, *options)
        for a, e in zip(grads, backward):
            if e is not None:
                np.testing.assert_allclose(a, e, rtol=TOL[dtype], atol=TOL[dtype])


def test_every_row_ignored(rng):
    h, w, t, _ = problem(rng, rows=6, ignored=1.0)
    assert np.isnan(xrt.ops.linear_cross_entropy(h, w, t))  # 0 / 0, as F.cross_entropy
    assert xrt.ops.linear_cross_entropy(h, w, t, reduction="sum") == 0.0
    loss, dh, dw, _ = xrt.ops.linear_cross_entropy_forward(h, w, t)
    assert np.isnan(loss) and not dh.any() and not dw.any()  # PyTorch's gradients are zeros too


def test_targets_out_of_range_give_nan(rng):
    h, w, t, _ = problem(rng, rows=6, ignored=0.0)
    t[2] = 41  # vocab is 41
    rows = xrt.ops.linear_cross_entropy(h, w, t, reduction="none")
    assert np.isnan(rows[2]) and not np.isnan(np.delete(rows, 2)).any()
    assert np.isnan(xrt.ops.linear_cross_entropy(h, w, t))
    dh = xrt.ops.linear_cross_entropy_backward(np.ones(6), h, w, t, reduction="none")[0]
    assert np.isnan(dh[2]).all() and not np.isnan(np.delete(dh, 2, axis=0)).any()


def test_torch_tensors_and_a_frozen_head(rng):
    h, w, t, _ = problem(rng)
    ht, wt, tt = torch.tensor(h), torch.tensor(w), torch.tensor(t)
    loss, dh, dw, db = xrt.ops.linear_cross_entropy_forward(ht, wt, tt, weight_grad=False)
    assert isinstance(loss, torch.Tensor) and dw is None and db is None
    hr = ht.clone().requires_grad_()
    want = torch.autograd.grad(F.cross_entropy(hr @ wt.T, tt), hr)[0]
    torch.testing.assert_close(dh, want, rtol=1e-12, atol=1e-12)


def test_errors(rng):
    h, w, t, b = problem(rng, dtype="float32", bias=True)
    with pytest.raises(ShapeError, match="linear_cross_entropy: argument 'weight' expected shape \\(V, 12\\)"):
        xrt.ops.linear_cross_entropy(h, w[:, :5], t)
    with pytest.raises(ShapeError, match="linear_cross_entropy: argument 'target' expected shape"):
        xrt.ops.linear_cross_entropy(h, w, t[:3])
    with pytest.raises(DTypeError, match="linear_cross_entropy: argument 'target' expected an integer dtype"):
        xrt.ops.linear_cross_entropy(h, w, t.astype(np.float32))
    with pytest.raises(DTypeError, match="linear_cross_entropy: argument 'weight' expected dtype float32"):
        xrt.ops.linear_cross_entropy(h, w.astype(np.float16), t)
    with pytest.raises(ArgumentError, match="argument 'label_smoothing' expected a number in \\[0, 1\\]"):
        xrt.ops.linear_cross_entropy(h, w, t, label_smoothing=1.5)
    with pytest.raises(ArgumentError, match="argument 'reduction' expected one of"):
        xrt.ops.linear_cross_entropy(h, w, t, reduction="batchmean")
    with pytest.raises(ArgumentError, match="argument 'reduction' expected 'mean' or 'sum' when gradient buffers"):
        xrt.ops.linear_cross_entropy_forward(h, w, t, reduction="none")
    with pytest.raises(ShapeError, match="linear_cross_entropy_backward: argument 'grad_loss' expected shape"):
        xrt.ops.linear_cross_entropy_backward(np.ones(3, np.float32), h, w, t)
    with pytest.raises(ArgumentError, match="argument 'z_loss_scale' expected a finite number >= 0"):
        xrt.ops.linear_cross_entropy(h, w, t, b, z_loss_scale=-1.0)
    for front_end in (xrt.ops.linear_cross_entropy_forward, xrt.ops.linear_cross_entropy_backward):
        args = (h, w, t) if front_end is xrt.ops.linear_cross_entropy_forward else (np.float32(1), h, w, t)
        with pytest.raises(ArgumentError, match="argument 'weight_grad' expected a bool, got array"):
            front_end(*args, weight_grad=np.array([], np.float64))  # was "truth value of an empty array"


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1), rows=st.integers(0, 9), hidden=st.integers(0, 6), vocab=st.integers(1, 9),
    smoothing=st.sampled_from([0.0, 0.3]), reduction=st.sampled_from(["mean", "sum", "none"]),
    z_loss=st.sampled_from([0.0, 1e-2]), dtype=st.sampled_from(["float32", "float64"]), chunk=st.integers(1, 30),
)  # fmt: skip
def test_property(seed, rows, hidden, vocab, smoothing, reduction, z_loss, dtype, chunk):
    """Any sizes (no rows, no hidden units), any chunking, ignore_index anywhere: the loss and gradients."""
    rng = np.random.default_rng(seed)
    h, w, t, b = problem(rng, rows, hidden, vocab, ignored=0.3, dtype=dtype, bias=bool(seed % 2))
    old, cpu_kernel.CHUNK_ELEMENTS = cpu_kernel.CHUNK_ELEMENTS, chunk
    try:
        options = (-100, smoothing, reduction, z_loss)
        loss = xrt.ops.linear_cross_entropy(h, w, t, b, *options)
        np.testing.assert_allclose(loss, reference(h, w, t, b, None, None, None, *options), rtol=1e-5, atol=1e-5)
        g = rng.standard_normal(np.shape(loss))
        grads = xrt.ops.linear_cross_entropy_backward(g, h, w, t, b, *options)
        for got, want in zip(grads, gradients_reference(g, h, w, t, b, *options)):
            if got is not None:
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    finally:
        cpu_kernel.CHUNK_ELEMENTS = old
