"""Benchmark rows: InferenceSession on a BERT-style encoder beside onnxruntime (CPU) and PyTorch eager
(GPU, CUDA graphs on for ours). Full timing tables come from benchmarks/inference_{cpu,gpu}.py."""

from __future__ import annotations

from . import Row, Setup


def _needs_onnxruntime() -> str | None:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return "needs onnxruntime (the reference runtime; a test dependency)"
    return None


def _needs_cuda() -> str | None:
    try:
        import torch
    except ImportError:
        return "needs PyTorch"
    return None if torch.cuda.is_available() else "needs a CUDA device"


def _cpu_encoder(batch: int, seq: int) -> Setup:
    import numpy as np
    import onnxruntime as ort

    from ..onnx import InferenceSession
    from ..onnx.builtin import encoder_inputs, encoder_model

    data = encoder_model().SerializeToString()
    feed = encoder_inputs(batch, seq)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    reference = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    session = InferenceSession(data)

    def check() -> str | None:
        err = float(np.abs(session.run(None, feed)[0] - reference.run(None, feed)[0]).max())
        return None if err <= 1e-4 else f"max abs error {err:.2e} > 1e-4"

    return Setup(ours=lambda: session.run(None, feed), anchor=lambda: reference.run(None, feed), check=check,
                 note="built-in encoder (2 layers, hidden 128); onnxruntime with 1 intra-op thread")  # fmt: skip


def _gpu_encoder(dtype: str, batch: int, seq: int) -> Setup:
    import torch

    from ..onnx import InferenceSession
    from ..onnx.builtin import encoder_inputs, encoder_model

    data = encoder_model(layers=6, hidden=384, heads=12, ffn=1536).SerializeToString()
    session = InferenceSession(data, device="cuda")
    feed = {k: torch.from_numpy(v).cuda() for k, v in encoder_inputs(batch, seq).items()}
    cpu = InferenceSession(data)

    def check() -> str | None:
        want = cpu.run(None, {k: v.cpu().numpy() for k, v in feed.items()})[0]
        err = float((session.run(None, feed)[0].cpu() - torch.from_numpy(want)).abs().max())
        return None if err <= 1e-3 else f"max abs error {err:.2e} > 1e-3"

    return Setup(ours=lambda: session.run(None, feed), check=check,
                 note="built-in encoder, MiniLM shape; eager/compile anchors: benchmarks/inference_gpu.py")  # fmt: skip


ROWS = [
    Row("encoder B1 S64 (CPU) vs onnxruntime", "inference", lambda: _cpu_encoder(1, 64), target=1 / 1.5,
        units="ms", requires=_needs_onnxruntime),
    Row("encoder B8 S128 (CPU) vs onnxruntime", "inference", lambda: _cpu_encoder(8, 128), target=1 / 1.5,
        units="ms", requires=_needs_onnxruntime),
    Row("encoder fp32 B32 S128 (GPU, CUDA graphs)", "inference", lambda: _gpu_encoder("float32", 32, 128),
        units="ms", requires=_needs_cuda),
]  # fmt: skip
