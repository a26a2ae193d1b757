"""The programs the elementwise-fusion pass writes run in the Triton fused_elementwise kernel (the one
the GPU uses), here through Triton's interpreter: an encoder's session with the policy naming the Triton
kernels gives the NumPy session's outputs. Without a GPU this module reruns itself under TRITON_INTERPRET=1."""

from __future__ import annotations

import numpy as np
import pytest
from triton_harness import INTERPRET, ON_GPU, rerun_under_interpreter

from xpuruntime.onnx import InferenceSession
from xpuruntime.onnx.builtin import encoder_inputs, encoder_model

if not (INTERPRET or ON_GPU):

    def test_fused_programs_under_interpreter() -> None:
        rerun_under_interpreter(__file__)


@pytest.mark.skipif(not INTERPRET, reason="runs under TRITON_INTERPRET=1 (the GPU is covered by test_inference_gpu)")
def test_fused_programs_run_in_the_triton_kernel() -> None:
    data = encoder_model(layers=1, hidden=32, heads=2, ffn=64, vocab=50).SerializeToString()
    reference = InferenceSession(data)
    session = InferenceSession(data, policy="fused_elementwise=triton,strict=true")
    feed = encoder_inputs(2, 5, vocab=50)
    np.testing.assert_allclose(session.run(None, feed)[0], reference.run(None, feed)[0], rtol=1e-5, atol=1e-5)
    steps = [line for line in session.explain().splitlines() if "fused_elementwise" in line and "->" in line]
    assert steps and all("fused_elementwise/triton [triton] (policy)" in line for line in steps), steps
