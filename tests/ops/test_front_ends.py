"""The ops' front ends take what NumPy users pass: array-likes, NumPy scalars and 0-d arrays where Python
values go, lists for tuples, matrices; and they fill the schema's defaults."""

from __future__ import annotations

import numpy as np
import pytest

import xpuruntime as xrt
from xpuruntime.abi import TensorSpec
from xpuruntime.ops.attention_backward import gradients_reference
from xpuruntime.ops.norm_backward import layer_norm_backward_reference, rms_norm_backward_reference

rng = np.random.default_rng(11)
X = rng.standard_normal((3, 4)).astype(np.float32)


def test_backward_front_ends_take_array_likes_like_every_other_front_end():
    rng = np.random.default_rng()
    x, dy, w = rng.standard_normal((3, 5)), rng.standard_normal((3, 5)), rng.standard_normal(5)
    dx, dw, db = xrt.ops.layer_norm_backward(dy.tolist(), x.tolist(), 5, w.tolist())
    want = layer_norm_backward_reference(dy, x, 5, w)
    np.testing.assert_allclose(np.concatenate([dx, dw[None], db[None]]), want, rtol=1e-12, atol=1e-12)
    dx, dw = xrt.ops.rms_norm_backward(dy.tolist(), x.tolist(), [5], w.tolist())
    want = rms_norm_backward_reference(dy, x, 5, w)
    np.testing.assert_allclose(np.concatenate([dx, dw[None]]), want, rtol=1e-12, atol=1e-12)

    q, k, v = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 5, 3))
    out, lse = xrt.ops.attention_forward(q, k, v)
    do = rng.standard_normal(out.shape)
    grads = xrt.ops.attention_backward(do.tolist(), q.tolist(), k.tolist(), v.tolist(), out, lse)
    for got, want in zip(grads, gradients_reference(do, q, k, v)):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)  # lse is float32 by design


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_numpy_values_work_where_python_values_do():
    np.testing.assert_allclose(xrt.ops.attention(X, X, X, scale=np.array(0.5)), xrt.ops.attention(X, X, X, scale=0.5))
    np.testing.assert_array_equal(xrt.ops.sum(X, axis=np.array([0])), xrt.ops.sum(X, axis=0))
    np.testing.assert_array_equal(xrt.ops.sum(X, axis=[0, 1]), xrt.ops.sum(X, axis=(0, 1)))
    np.testing.assert_allclose(xrt.ops.layer_norm(X, [4]), xrt.ops.layer_norm(X, (4,)))
    np.testing.assert_array_equal(
        xrt.ops.sin_affine(X, np.float64(2.0), np.float32(1.0)), xrt.ops.sin_affine(X, 2.0, 1.0)
    )
    matrix = np.asmatrix(X)
    np.testing.assert_array_equal(xrt.ops.sum(matrix, axis=0), X.sum(axis=0, dtype=np.float64).astype(np.float32))


def test_rms_norm_default_eps_for_bfloat16_needs_no_numpy_support():
    explanation = xrt.explain("rms_norm", TensorSpec((4, 8), "bfloat16"), normalized_shape=8, show=False)
    assert explanation.ctx.attrs["eps"] == 2.0**-7
