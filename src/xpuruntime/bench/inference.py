"""Inference: InferenceSession running a BERT-style encoder against onnxruntime on the CPU (one thread each),
and on the GPU against the same encoder in eager PyTorch and under torch.compile with CUDA graphs (ours
with its plan cache and CUDA graphs; the MiniLM shape of the design's anchor: 6 layers, hidden 384, 12 heads)."""

from __future__ import annotations

import io
import math
from typing import Any

from .common import close, needs_cuda, needs_onnxruntime
from .row import Row, Setup

MINILM = {"hidden": 384, "heads": 12, "ffn": 1536, "layers": 6}


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
                 note="built-in encoder (2 layers, hidden 128)")  # fmt: skip


def encoder_module(hidden: int, heads: int, ffn: int, layers: int, vocab: int = 30522) -> Any:
    """An HF-BERT-style post-norm encoder in eager PyTorch, written as exporters see it."""
    import torch
    from torch import nn

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.v, self.o = (nn.Linear(hidden, hidden) for _ in range(4))
            self.ln1, self.ln2 = nn.LayerNorm(hidden, eps=1e-12), nn.LayerNorm(hidden, eps=1e-12)
            self.up, self.down = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)

        def split(self, x: torch.Tensor) -> torch.Tensor:
            b, s, _ = x.shape
            return x.view(b, s, heads, hidden // heads).permute(0, 2, 1, 3)

        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hidden // heads) + mask
            ctx = torch.matmul(torch.softmax(scores, dim=-1), v).permute(0, 2, 1, 3).reshape(x.shape)
            x = self.ln1(x + self.o(ctx))
            return self.ln2(x + self.down(nn.functional.gelu(self.up(x))))

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, hidden), nn.Embedding(512, hidden)
            self.ln = nn.LayerNorm(hidden, eps=1e-12)
            self.layers = nn.ModuleList(Layer() for _ in range(layers))

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
            x = self.ln(self.tok(input_ids) + self.pos(positions))
            mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
            for layer in self.layers:
                x = layer(x, mask)
            return x

    return Encoder()


def _export(model: Any) -> bytes:
    import torch

    ids = torch.randint(0, 1000, (2, 8), device="cuda")
    mask = torch.ones(2, 8, dtype=torch.int64, device="cuda")
    dynamic = {n: {0: "batch", 1: "seq"} for n in ("input_ids", "attention_mask", "out")}
    buffer = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(model, (ids, mask), buffer, input_names=["input_ids", "attention_mask"],
                          output_names=["out"], dynamic_axes=dynamic, opset_version=17, dynamo=False)  # fmt: skip
    return buffer.getvalue()


def _gpu_encoder(dtype: str, batch: int, seq: int, anchor: str) -> Setup:
    """Ours (InferenceSession on the exported encoder, CUDA graphs) against the module itself, eager or under
    torch.compile with CUDA graphs (`anchor` "eager" or "compiled")."""
    import torch

    from ..onnx import InferenceSession

    torch.manual_seed(0)
    model = encoder_module(**MINILM).eval().to("cuda", getattr(torch, dtype))
    session = InferenceSession(_export(model), device="cuda")
    ids = torch.randint(0, 30522, (batch, seq), device="cuda")
    mask = torch.ones(batch, seq, dtype=torch.int64, device="cuda")
    mask[:, seq - seq // 4 :] = torch.randint(0, 2, (batch, seq // 4), device="cuda")  # ~1/8 of keys masked
    feed = {"input_ids": ids, "attention_mask": mask}
    module = model if anchor == "eager" else torch.compile(model, mode="reduce-overhead")

    def run_anchor() -> Any:
        with torch.no_grad():
            return module(ids, mask)

    def ours() -> Any:
        return session.run(None, feed)[0]

    tolerance = 1e-3 if dtype == "float32" else 2e-2
    return Setup(ours=ours, anchor=run_anchor, check=lambda: close(ours(), run_anchor(), tolerance),
                 note="ours: InferenceSession (plan cache, CUDA graphs)")  # fmt: skip


def _gpu_row(dtype: str, batch: int, seq: int, anchor: str, target: float | None) -> Row:
    short = "fp16" if dtype == "float16" else "fp32"
    what = {"eager": "eager PyTorch", "compiled": "torch.compile, CUDA graphs"}[anchor]
    return Row(f"MiniLM encoder {short} B{batch} S{seq} (GPU) vs {anchor}", "GPU", target=target, units="ms",
               setup=lambda: _gpu_encoder(dtype, batch, seq, anchor), requires=needs_cuda,
               anchor=f"the same encoder in {what}", doc="InferenceSession")  # fmt: skip


ROWS = [
    *(Row(f"encoder B{b} S{s} (CPU) vs onnxruntime", "CPU", lambda b=b, s=s: _cpu_encoder(b, s), target=1 / 1.5,
          units="ms", requires=needs_onnxruntime, anchor="onnxruntime, 1 thread",
          doc="InferenceSession, same outputs within 1e-4") for b, s in ((1, 64), (8, 128))),
    _gpu_row("float16", 32, 128, "eager", 1.5),
    _gpu_row("float16", 32, 128, "compiled", 1.0),
    _gpu_row("float16", 1, 128, "eager", 1.5),
    _gpu_row("float32", 32, 128, "eager", 1.5),
]  # fmt: skip
