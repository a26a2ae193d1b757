"""InferenceSession on a CUDA device: same outputs as onnxruntime (<= 1e-3) at two signatures, CUDA
tensors in and out, CUDA graphs captured for a static signature. Skipped without a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from xpuruntime.onnx import InferenceSession, SessionOptions
from xpuruntime.onnx.builtin import encoder_inputs, encoder_model

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def model() -> bytes:
    return encoder_model(layers=2, hidden=64, heads=4, ffn=128, vocab=100).SerializeToString()


@pytest.mark.parametrize("graphs", [True, False])
def test_encoder_matches_onnxruntime_on_gpu(model: bytes, graphs: bool) -> None:
    torch = pytest.importorskip("torch")
    ort = pytest.importorskip("onnxruntime")
    reference = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    session = InferenceSession(model, SessionOptions(enable_cuda_graph=graphs), device="cuda")
    for batch, seq in ((2, 9), (4, 16), (2, 9)):
        feed = encoder_inputs(batch, seq, vocab=100)
        want = reference.run(None, feed)[0]
        got = session.run(None, feed)[0]
        assert isinstance(got, np.ndarray)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-3)
        tensors = session.run(None, {k: torch.from_numpy(v).cuda() for k, v in feed.items()})[0]
        assert tensors.is_cuda
        np.testing.assert_allclose(tensors.cpu().numpy(), want, rtol=0, atol=1e-3)
    notes = {entry.note for entry in session.runner.cache.values()}
    assert notes == ({"CUDA graph captured"} if graphs else {"CUDA graph off"}), notes
    assert "[cpu]" not in session.explain()  # every kernel step runs on the GPU
