"""Models exported from PyTorch (an MLP and a BERT-style encoder with an attention mask, dynamic batch and
sequence length) give onnxruntime's outputs on the CPU at every optimization level and two signatures."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

from xpuruntime.graph.passes import optimize  # noqa: E402
from xpuruntime.onnx import InferenceSession, SessionOptions  # noqa: E402
from xpuruntime.onnx.semantics import ONNX_SEMANTICS  # noqa: E402

LEVELS = ("disabled", "basic", "extended", "all")


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(24, 48), torch.nn.ReLU(), torch.nn.Linear(48, 40), torch.nn.GELU(), torch.nn.Linear(40, 10)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.net(x), dim=-1)


class Layer(torch.nn.Module):
    """One HF-BERT-style encoder layer (post-norm), written as eager code that exporters decompose."""

    def __init__(self, hidden: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.q, self.k, self.v = (torch.nn.Linear(hidden, hidden) for _ in range(3))
        self.o = torch.nn.Linear(hidden, hidden)
        self.ln1, self.ln2 = torch.nn.LayerNorm(hidden), torch.nn.LayerNorm(hidden)
        self.up, self.down = torch.nn.Linear(hidden, ffn), torch.nn.Linear(ffn, hidden)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        return x.view(b, s, self.heads, self.head_dim).permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim) + mask
        ctx = torch.matmul(torch.softmax(scores, dim=-1), v).permute(0, 2, 1, 3)
        ctx = ctx.reshape(x.shape[0], x.shape[1], -1)
        x = self.ln1(x + self.o(ctx))
        return self.ln2(x + self.down(torch.nn.functional.gelu(self.up(x))))


class Encoder(torch.nn.Module):
    def __init__(self, vocab: int = 100, hidden: int = 32, heads: int = 4, ffn: int = 64, layers: int = 2) -> None:
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, hidden)
        self.pos = torch.nn.Embedding(64, hidden)
        self.ln = torch.nn.LayerNorm(hidden)
        self.layers = torch.nn.ModuleList(Layer(hidden, heads, ffn) for _ in range(layers))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        x = self.ln(self.tok(input_ids) + self.pos(positions))
        mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
        for layer in self.layers:
            x = layer(x, mask)
        return x


def export(model: torch.nn.Module, args: tuple, names: list[str], dynamic: dict) -> bytes:
    model.eval()
    buffer = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(
            model, args, buffer, input_names=names, output_names=["out"], dynamic_axes=dynamic, opset_version=17,
            dynamo=False,
        )  # fmt: skip
    return buffer.getvalue()


@pytest.fixture(scope="module")
def mlp_model() -> bytes:
    torch.manual_seed(0)
    return export(MLP(), (torch.randn(3, 24),), ["x"], {"x": {0: "batch"}, "out": {0: "batch"}})


@pytest.fixture(scope="module")
def encoder_model() -> bytes:
    torch.manual_seed(0)
    ids, mask = torch.randint(0, 100, (2, 7)), torch.ones(2, 7, dtype=torch.int64)
    dynamic = {
        "input_ids": {0: "batch", 1: "seq"},
        "attention_mask": {0: "batch", 1: "seq"},
        "out": {0: "batch", 1: "seq"},
    }
    return export(Encoder(), (ids, mask), ["input_ids", "attention_mask"], dynamic)


def encoder_feed(rng: np.random.Generator, batch: int, seq: int) -> dict[str, np.ndarray]:
    mask = np.ones((batch, seq), np.int64)
    mask[:, seq - seq // 3 :] = rng.integers(0, 2, (batch, seq // 3))  # some padded keys
    return {"input_ids": rng.integers(0, 100, (batch, seq)).astype(np.int64), "attention_mask": mask}


@pytest.mark.parametrize("level", LEVELS)
def test_mlp_matches_onnxruntime(mlp_model: bytes, level: str) -> None:
    rng = np.random.default_rng(1)
    reference = ort.InferenceSession(mlp_model, providers=["CPUExecutionProvider"])
    session = InferenceSession(mlp_model, SessionOptions(graph_optimization_level=level))
    for batch in (5, 1):
        feed = {"x": rng.standard_normal((batch, 24)).astype(np.float32)}
        (want,) = reference.run(None, feed)
        (got,) = session.run(None, feed)
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)


@pytest.mark.parametrize("level", LEVELS)
def test_encoder_matches_onnxruntime(encoder_model: bytes, level: str) -> None:
    rng = np.random.default_rng(2)
    reference = ort.InferenceSession(encoder_model, providers=["CPUExecutionProvider"])
    session = InferenceSession(encoder_model, SessionOptions(graph_optimization_level=level))
    for batch, seq in ((2, 9), (3, 16), (2, 9)):
        feed = encoder_feed(rng, batch, seq)
        (want,) = reference.run(None, feed)
        (got,) = session.run(None, feed)
        assert got.shape == want.shape == (batch, seq, 32)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)


def test_encoder_fusions_at_level_all(encoder_model: bytes) -> None:
    """The encoder's attention, layer norms, linears and elementwise chains become xrt ops."""
    session = InferenceSession(encoder_model)
    ops = session.graph.op_counts()
    assert ops.get("attention") == 2
    assert "Softmax" not in ops and "Erf" not in ops
    session.run(None, encoder_feed(np.random.default_rng(3), 2, 5))
    text = session.explain()
    assert "attention/" in text and "matmul/" in text and "fused_elementwise/" in text
    gpu_graph, _ = optimize(session.original, 99, session.dispatcher, "cuda", ONNX_SEMANTICS)
    counts = gpu_graph.op_counts()  # per layer: q, k, v packed into one linear (split after), o, up, down
    assert counts.get("linear", 0) == 8 and counts.get("Split", 0) >= 2, counts  # bias in the GEMM
