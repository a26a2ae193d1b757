"""The torch backend's candidates for the fused transformer ops (PyTorch's unfused forms) on CPU tensors,
through their launch functions, against the float64 references; the gradient buffers they fill too. On a
GPU they run through the dispatcher in tests/backends/triton/test_fused_kernels.py's comparisons (explain)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from test_torch_backend import launch_on_cpu, rand, reference  # noqa: E402

import xpuruntime as xrt  # noqa: E402
from xpuruntime.ops.linear_cross_entropy import gradients_reference  # noqa: E402


def _tokens(*values: int) -> torch.Tensor:
    return torch.tensor(values)


CASES = [
    ("rms_norm", (rand(3, 8), rand(8)), ((8,), 1e-6, 0.0, "llama")),
    ("rms_norm", (rand(3, 8), rand(8)), ((8,), 1e-6, 1.0, "torch")),
    ("rms_norm", (rand(3, 8), None), ((8,), 1e-6, 0.0, "llama")),
    ("add_rms_norm", (rand(3, 8), rand(3, 8), rand(8), torch.empty(3, 8)), (1e-6, 0.0, "llama")),
    ("add_layer_norm", (rand(2, 3, 8), rand(2, 3, 8), rand(8), rand(8), torch.empty(2, 3, 8)), (1e-5,)),
    ("add_rms_norm_backward", (rand(3, 8), rand(3, 8), rand(3, 8), rand(8)), (1e-6, 0.5, "torch")),
    ("add_rms_norm_backward", (rand(3, 8), None, rand(3, 8), None), (1e-6, 0.0, "llama")),
    ("add_layer_norm_backward", (rand(3, 8), None, rand(3, 8), None), (1e-5,)),
    ("swiglu", (rand(3, 8), rand(3, 8)), ()),
    ("geglu", (rand(3, 8), None), ("tanh",)),
    ("swiglu_backward", (rand(3, 8), rand(3, 8), rand(3, 8)), ()),
    ("geglu_backward", (rand(3, 4), rand(3, 8), None), ("none",)),
    ("rotary_embedding", (rand(2, 4, 5, 8), rand(2, 2, 5, 8), rand(1, 5, 6), rand(1, 5, 6), None), (1, False)),
    (
        "rotary_embedding",
        (rand(2, 5, 4, 8), rand(2, 5, 2, 8), rand(11, 8), rand(11, 8), torch.randint(-1, 12, (2, 5))),
        (2, True),
    ),
    (
        "rotary_embedding_backward",
        (rand(2, 4, 5, 8), rand(2, 2, 5, 8), rand(1, 5, 8), rand(1, 5, 8), None),
        (1, False),
    ),
    (
        "linear_cross_entropy",
        (rand(6, 8), rand(11, 8), _tokens(1, 2, -100, 3, 12, 4), rand(11), None, None, None),
        (-100, 0.1, "mean", 1e-3),
    ),
    (
        "linear_cross_entropy",
        (rand(2, 3, 8), rand(11, 8), torch.randint(0, 11, (2, 3)), None, None, None, None),
        (-100, 0.0, "none", 0.0),
    ),
    (
        "linear_cross_entropy_backward",
        (rand(6), rand(6, 8), rand(11, 8), _tokens(1, 2, -100, 3, 5, 4), rand(11), None, None),
        (-100, 0.1, "none", 0.0),
    ),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_torch_kernel_matches_reference(case):
    op, inputs, attrs = CASES[case]
    got = launch_on_cpu(op, inputs, attrs).double().numpy()
    want = reference(op, inputs, attrs)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got[~np.isnan(want)], want[~np.isnan(want)], rtol=2e-5, atol=2e-6)


def test_torch_cross_entropy_fills_the_gradient_buffers():
    h, w, b, t = rand(7, 8), rand(11, 8), rand(11), _tokens(1, 2, -100, 3, 5, 4, 10)
    buffers = (torch.full((7, 8), float("nan")), torch.full((11, 8), float("nan")), torch.full((11,), float("nan")))
    launch_on_cpu("linear_cross_entropy", (h, w, t, b, *buffers), (-100, 0.1, "sum", 1e-2))
    want = gradients_reference(1.0, h.double().numpy(), w.double().numpy(), t.numpy(), b.double().numpy(), -100, 0.1,
                               "sum", 1e-2)  # fmt: skip
    for got, exp in zip(buffers, want):
        np.testing.assert_allclose(got.double().numpy(), exp, rtol=2e-5, atol=2e-6)


def test_explain_shows_the_fused_kernels_beside_pytorch():
    def cuda(*shape: int, dtype: str = "bfloat16") -> xrt.TensorSpec:
        return xrt.TensorSpec(shape, dtype, device="cuda:0")

    q, k, cos = cuda(8, 16, 1024, 64), cuda(8, 4, 1024, 64), cuda(1, 1024, 64)
    names = {cand.kernel.name for cand in xrt.explain("rotary_embedding", q, k, cos, cos, show=False).candidates}
    assert {"torch", "triton", "numpy"} <= names
    explanation = xrt.explain("linear_cross_entropy", cuda(8192, 1024), cuda(32000, 1024), cuda(8192, dtype="int64"),
                              show=False)  # fmt: skip
    assert {"torch", "triton"} <= {cand.kernel.name for cand in explanation.candidates}
