"""The model zoo as the tests use it: every (model, exporter, opset) exported once per test session at the tiny
size, sessions that skip only for the ops other work is adding, and the signatures each model is run at."""

from __future__ import annotations

import functools
import re

import numpy as np
import pytest

from xpuruntime.bench.zoo_models import ZOO, export, exported_program
from xpuruntime.onnx import InferenceSession, SessionOptions, UnsupportedModelError

OPSETS = (17, 18, 23)  # 23: the newest both exporters and onnx write (Attention, RMSNormalization, RotaryEmbedding)
# Ops the zoo's exports need that are still being added (helpers onnx-core and onnx-suite): a model needing one of
# these is skipped with its name, anything else that fails to load fails the test.
PENDING_OPS = frozenset({
    "Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "BatchNormalization", "GatherND", "Attention",
    "RMSNormalization", "RotaryEmbedding", "HardSwish", "HardSigmoid",
})  # fmt: skip


def signatures(name: str) -> list[tuple[int, int | None]]:
    """Two input signatures per model: (batch, sequence length or image side; None for the default)."""
    return [(2, None), (3, 12)] if ZOO[name].kind == "text" else [(1, None), (2, 48 if name != "vit_b16" else None)]


@functools.cache
def built(name: str) -> tuple:
    """The tiny model with random weights and its example inputs (built once)."""
    return ZOO[name].build("tiny")


@functools.cache
def _program(name: str) -> object:
    model, example = built(name)
    return exported_program(model, example, ZOO[name])


@functools.cache
def exported(name: str, exporter: str, opset: int, optimize: bool = True) -> bytes:
    """The tiny model's ONNX bytes (the dynamo exporter's torch.export trace is shared by all opsets)."""
    pytest.importorskip("transformers")
    model, example = built(name)
    program = _program(name) if exporter == "dynamo" else None
    return export(model, example, ZOO[name], exporter, opset, program=program, optimize=optimize)


def feed(name: str, batch: int, side: int | None, seed: int = 0) -> dict[str, np.ndarray]:
    return ZOO[name].feed("tiny", batch, np.random.default_rng(seed), side)


def session(data: bytes, level: str = "all", **kwargs: object) -> InferenceSession:
    """Our session, or a skip naming the pending ops the model needs (other load errors propagate)."""
    try:
        return InferenceSession(data, SessionOptions(graph_optimization_level=level), **kwargs)
    except UnsupportedModelError as exc:
        listed = set(re.findall(r"(?:unsupported |; )([A-Za-z]+) \(nodes", str(exc)))
        if listed and listed <= PENDING_OPS:
            pytest.skip(f"needs {sorted(listed)}, still being added")
        raise
