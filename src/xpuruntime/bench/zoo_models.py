"""The model zoo: public architectures with random weights (no downloads), their ONNX exports with either
PyTorch exporter, and random inputs for them. The zoo tests use the tiny sizes; the zoo benchmark the real ones.

    spec = ZOO["bert"]                                   # ResNet-50, MobileNetV3, ViT-B/16, BERT, GPT-2, Llama
    model, example = spec.build("tiny")                  # an eval-mode torch module and its example inputs
    data = export(model, example, spec, "dynamo", 18)     # ONNX bytes ("dynamo": torch.export; "torchscript")
    feed = spec.feed("tiny", batch=2, rng=rng)           # random NumPy inputs, valid for the model

The vision models are written here with torch.nn layers (the same layer graphs as torchvision's, which need not be
installed); BERT, GPT-2 and Llama are `transformers` classes built from configs. Every parameter and buffer is
random (biases, norm scales and batch-norm statistics included), so a wrong bias or scale cannot hide behind
zeros and ones. PyTorch and transformers are imported only when a model is built.
"""

from __future__ import annotations

import io
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

EXPORTERS = ("dynamo", "torchscript")
VOCAB = {"tiny": 96, "real": 30522}


@dataclass(frozen=True)
class ZooModel:
    """One architecture: `make(size)` -> eval-mode torch module; `inputs` its input names; `feed` random inputs."""

    name: str
    make: Callable[[str], Any]
    inputs: tuple[str, ...]
    dynamic: dict[str, dict[int, str]]  # dims that vary between signatures, per input
    feed: Callable[..., dict[str, np.ndarray]]  # (size, batch, rng, seq=None) -> NumPy inputs
    kind: str  # "vision" or "text"

    def build(self, size: str = "tiny", seed: int = 0) -> tuple[Any, tuple]:
        """The module with random weights and example inputs (torch tensors) for export."""
        import torch

        torch.manual_seed(seed)
        model = self.make(size)
        randomize(model, seed)
        example = self.feed(size, batch=2, rng=np.random.default_rng(seed))
        return model, tuple(torch.from_numpy(example[name]) for name in self.inputs)


def randomize(model: Any, seed: int = 0) -> None:
    """Random biases, norm scales around 1 and batch-norm statistics (inits leave them 0 and 1)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=generator) * 0.1)
            elif p.dim() == 1:  # norm scales
                p.copy_(1.0 + torch.randn(p.shape, generator=generator) * 0.1)
        for name, b in model.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(torch.randn(b.shape, generator=generator) * 0.1)
            elif name.endswith("running_var"):
                b.copy_(0.5 + torch.rand(b.shape, generator=generator))
    model.eval()


# -- vision models ----------------------------------------------------------------------------------------------
def _conv_bn(nn: Any, cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, act: Any = None) -> Any:
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, *([act] if act is not None else []))


def resnet50(size: str) -> Any:
    """ResNet-50 (bottleneck blocks 3-4-6-3, widths 64-512 x4); tiny: one block per stage, widths / 8."""
    from torch import nn

    blocks, base = ((3, 4, 6, 3), 64) if size == "real" else ((1, 1, 1, 1), 8)

    class Bottleneck(nn.Module):
        def __init__(self, cin: int, width: int, stride: int) -> None:
            super().__init__()
            cout = width * 4
            self.body = nn.Sequential(
                _conv_bn(nn, cin, width, 1, act=nn.ReLU()), _conv_bn(nn, width, width, 3, stride, act=nn.ReLU()),
                _conv_bn(nn, width, cout, 1),
            )  # fmt: skip
            self.skip = _conv_bn(nn, cin, cout, 1, stride) if stride != 1 or cin != cout else nn.Identity()

        def forward(self, x: Any) -> Any:
            return (self.body(x) + self.skip(x)).relu()

    layers: list[Any] = [_conv_bn(nn, 3, base, 7, 2, act=nn.ReLU()), nn.MaxPool2d(3, 2, 1)]
    cin = base
    for stage, count in enumerate(blocks):
        for i in range(count):
            layers.append(Bottleneck(cin, base * 2**stage, 2 if i == 0 and stage > 0 else 1))
            cin = base * 2**stage * 4
    head = [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 1000 if size == "real" else 10)]
    return nn.Sequential(*layers, *head)


def mobilenet_v3(size: str) -> Any:
    """MobileNetV3-Large (inverted residuals, depthwise convs, squeeze-excite, hardswish); tiny: 4 blocks, / 4."""
    from torch import nn

    # kernel, expanded, out, squeeze-excite, hardswish, stride (the paper's table for Large)
    table = [
        (3, 16, 16, 0, 0, 1), (3, 64, 24, 0, 0, 2), (3, 72, 24, 0, 0, 1), (5, 72, 40, 1, 0, 2), (5, 120, 40, 1, 0, 1),
        (5, 120, 40, 1, 0, 1), (3, 240, 80, 0, 1, 2), (3, 200, 80, 0, 1, 1), (3, 184, 80, 0, 1, 1),
        (3, 184, 80, 0, 1, 1), (3, 480, 112, 1, 1, 1), (3, 672, 112, 1, 1, 1), (5, 672, 160, 1, 1, 2),
        (5, 960, 160, 1, 1, 1), (5, 960, 160, 1, 1, 1),
    ]  # fmt: skip
    div = 1
    if size != "real":
        table, div = [table[1], table[3], table[4], table[6]], 4

    class SqueezeExcite(nn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            squeezed = max(8, c // 4)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc1, self.fc2 = nn.Conv2d(c, squeezed, 1), nn.Conv2d(squeezed, c, 1)

        def forward(self, x: Any) -> Any:
            return x * nn.functional.hardsigmoid(self.fc2(self.fc1(self.pool(x)).relu()))

    class Block(nn.Module):
        def __init__(self, cin: int, k: int, exp: int, cout: int, se: int, hs: int, stride: int) -> None:
            super().__init__()
            act = nn.Hardswish() if hs else nn.ReLU()
            layers = [] if exp == cin else [_conv_bn(nn, cin, exp, 1, act=act)]
            layers += [_conv_bn(nn, exp, exp, k, stride, groups=exp, act=act)]
            layers += [SqueezeExcite(exp)] if se else []
            layers += [_conv_bn(nn, exp, cout, 1)]
            self.body, self.residual = nn.Sequential(*layers), stride == 1 and cin == cout

        def forward(self, x: Any) -> Any:
            return x + self.body(x) if self.residual else self.body(x)

    layers: list[Any] = [_conv_bn(nn, 3, 16 // div, 3, 2, act=nn.Hardswish())]
    cin = 16 // div
    for k, exp, cout, se, hs, stride in table:
        layers.append(Block(cin, k, exp // div, cout // div, se, hs, stride))
        cin = cout // div
    last, hidden = 960 // div, 1280 // div
    head = [_conv_bn(nn, cin, last, 1, act=nn.Hardswish()), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
            nn.Linear(last, hidden), nn.Hardswish(), nn.Linear(hidden, 1000 if size == "real" else 10)]  # fmt: skip
    return nn.Sequential(*layers, *head)


def vit_b16(size: str) -> Any:
    """ViT-B/16 (16x16 patches, 12 pre-norm layers, width 768, 12 heads, class token); tiny: 2 layers, 32 wide."""
    import torch
    from torch import nn

    width, depth, heads, image = (768, 12, 12, 224) if size == "real" else (32, 2, 4, 32)
    patches = (image // 16) ** 2

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(width, eps=1e-6), nn.LayerNorm(width, eps=1e-6)
            self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

        def forward(self, x: Any) -> Any:
            b, n, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).reshape(b, n, 3, heads, width // heads).permute(2, 0, 3, 1, 4)
            attn = nn.functional.scaled_dot_product_attention(q, k, v)
            x = x + self.proj(attn.transpose(1, 2).reshape(b, n, width))
            return x + self.mlp(self.ln2(x))

    class ViT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.patch = nn.Conv2d(3, width, 16, 16)
            self.cls = nn.Parameter(torch.randn(1, 1, width) * 0.02)
            self.pos = nn.Parameter(torch.randn(1, patches + 1, width) * 0.02)
            self.layers = nn.Sequential(*(Layer() for _ in range(depth)))
            self.ln, self.head = nn.LayerNorm(width, eps=1e-6), nn.Linear(width, 1000 if size == "real" else 10)

        def forward(self, x: Any) -> Any:
            x = self.patch(x).flatten(2).transpose(1, 2)
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
            return self.head(self.ln(self.layers(x))[:, 0])

    return ViT()


def _image_size(name: str, size: str) -> int:
    return 224 if size == "real" else 32 if name == "vit" else 40


def _image_feed(name: str) -> Callable[..., dict[str, np.ndarray]]:
    def feed(size: str, batch: int, rng: np.random.Generator, seq: int | None = None) -> dict[str, np.ndarray]:
        side = _image_size(name, size) if seq is None or name == "vit" else seq
        return {"pixels": rng.standard_normal((batch, 3, side, side)).astype(np.float32)}

    return feed


# -- transformers --------------------------------------------------------------------------------------------------
def _last_hidden(model: Any, names: tuple[str, ...]) -> Any:
    """A transformers model as a module of named tensor inputs returning last_hidden_state (no cache)."""
    from torch import nn

    extra = {} if "token_type_ids" in names else {"use_cache": False}

    class LastHidden(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any = None) -> Any:
            types = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
            return self.model(input_ids=input_ids, attention_mask=attention_mask, **types, **extra).last_hidden_state

    return LastHidden()


def bert(size: str) -> Any:
    """BERT-base (12 layers, 768 wide, 12 heads, erf GELU, token types); tiny: 2 layers, 32 wide, 4 heads."""
    from transformers import BertConfig, BertModel

    dims = {} if size == "real" else {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                                      "intermediate_size": 64, "max_position_embeddings": 64}  # fmt: skip
    model = BertModel(BertConfig(vocab_size=VOCAB[size], **dims), add_pooling_layer=False)
    return _last_hidden(model, ZOO["bert"].inputs)


def gpt2(size: str) -> Any:
    """GPT-2 small (12 layers, 768 wide, tanh GELU, causal); tiny: 2 layers, 32 wide, 4 heads."""
    from transformers import GPT2Config, GPT2Model

    dims = {"vocab_size": 50257} if size == "real" else {"vocab_size": VOCAB["tiny"], "n_embd": 32, "n_layer": 2,
                                                          "n_head": 4, "n_positions": 64}  # fmt: skip
    return _last_hidden(GPT2Model(GPT2Config(**dims)), ZOO["gpt2"].inputs)


def llama(size: str) -> Any:
    """A Llama (RMSNorm, rotary embeddings, SwiGLU, grouped-query attention): real 8 layers, 1024 wide, 16/4
    heads (the project's training anchor); tiny: 2 layers, 32 wide, 4/2 heads."""
    from transformers import LlamaConfig, LlamaModel

    dims = (
        {"vocab_size": 32000, "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8,
         "num_attention_heads": 16, "num_key_value_heads": 4}
        if size == "real"
        else {"vocab_size": VOCAB["tiny"], "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}
    )  # fmt: skip
    return _last_hidden(LlamaModel(LlamaConfig(**dims)), ZOO["llama"].inputs)


def _text_feed(names: tuple[str, ...], vocab_of: Callable[[str], int], left_pad: bool) -> Callable[..., dict]:
    def feed(size: str, batch: int, rng: np.random.Generator, seq: int | None = None) -> dict[str, np.ndarray]:
        seq = seq or (7 if size == "tiny" else 128)
        mask = np.ones((batch, seq), np.int64)
        for row in range(1, batch):  # rows after the first are padded (left for decoders, as they generate)
            pad = int(rng.integers(1, max(seq // 2, 1) + 1))
            if left_pad:
                mask[row, :pad] = 0
            else:
                mask[row, seq - pad :] = 0
        feed = {"input_ids": rng.integers(0, vocab_of(size), (batch, seq)).astype(np.int64), "attention_mask": mask}
        if "token_type_ids" in names:
            feed["token_type_ids"] = (np.arange(seq)[None, :] >= seq // 2).astype(np.int64).repeat(batch, 0)
        return feed

    return feed


TEXT_DYNAMIC = {0: "batch", 1: "sequence"}
_BERT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
_DECODER_INPUTS = ("input_ids", "attention_mask")
ZOO: dict[str, ZooModel] = {
    "resnet50": ZooModel("resnet50", resnet50, ("pixels",), {"pixels": {0: "batch", 2: "height", 3: "width"}},
                         _image_feed("resnet50"), "vision"),
    "mobilenet_v3": ZooModel("mobilenet_v3", mobilenet_v3, ("pixels",),
                             {"pixels": {0: "batch", 2: "height", 3: "width"}}, _image_feed("mobilenet_v3"), "vision"),
    "vit_b16": ZooModel("vit_b16", vit_b16, ("pixels",), {"pixels": {0: "batch"}}, _image_feed("vit"), "vision"),
    "bert": ZooModel("bert", bert, _BERT_INPUTS, dict.fromkeys(_BERT_INPUTS, TEXT_DYNAMIC),
                     _text_feed(_BERT_INPUTS, VOCAB.__getitem__, left_pad=False), "text"),
    "gpt2": ZooModel("gpt2", gpt2, _DECODER_INPUTS, dict.fromkeys(_DECODER_INPUTS, TEXT_DYNAMIC),
                     _text_feed(_DECODER_INPUTS, lambda s: 50257 if s == "real" else VOCAB[s], left_pad=True), "text"),
    "llama": ZooModel("llama", llama, _DECODER_INPUTS, dict.fromkeys(_DECODER_INPUTS, TEXT_DYNAMIC),
                      _text_feed(_DECODER_INPUTS, lambda s: 32000 if s == "real" else VOCAB[s], left_pad=True), "text"),
}  # fmt: skip


# -- export --------------------------------------------------------------------------------------------------------
def export(
    model: Any, example: tuple, spec: ZooModel, exporter: str, opset: int, program: Any = None, optimize: bool = True
) -> bytes:
    """ONNX bytes of `model` with dynamic dims as `spec` says. `exporter` "dynamo" (torch.onnx.export's default,
    through torch.export; pass `program`, from `exported_program`, to reuse one trace for several opsets) or
    "torchscript" (dynamo=False). `optimize=False` turns the exporter's own graph optimization off (constant
    folding, which folds BatchNormalization into Conv, among others), as some users export."""
    import torch

    if exporter not in EXPORTERS:
        raise ValueError(f"export: exporter expected one of {EXPORTERS}, got {exporter!r}")
    names = list(spec.inputs)
    dynamic = {**spec.dynamic, "output": {0: "batch"}}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            buffer = io.BytesIO()
            torch.onnx.export(model, example, buffer, input_names=names, output_names=["output"], dynamo=False,
                              dynamic_axes=dynamic, opset_version=opset, do_constant_folding=optimize)  # fmt: skip
            return buffer.getvalue()
        program = program if program is not None else exported_program(model, example, spec)
        onnx_program = torch.onnx.export(program, example, input_names=names, output_names=["output"], dynamo=True,
                                         opset_version=opset, verbose=False, optimize=optimize)  # fmt: skip
        return onnx_program.model_proto.SerializeToString()


def exported_program(model: Any, example: tuple, spec: ZooModel) -> Any:
    """torch.export's trace of `model` with the dims `spec` names dynamic (their ranges as the model allows)."""
    import torch

    dynamic = torch.export.Dim.DYNAMIC
    shapes = tuple(dict.fromkeys(spec.dynamic.get(name, {}), dynamic) for name in spec.inputs)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        return torch.export.export(model, example, dynamic_shapes=shapes, strict=False)


def max_abs_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| (inf when shapes differ or NaN appears where the reference has none)."""
    if got.shape != want.shape:
        return math.inf
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if np.any(np.isnan(got) != np.isnan(want)):
        return math.inf
    both = ~np.isnan(want)
    return float(np.abs(got[both] - want[both]).max(initial=0.0))
