"""CPU convolution regions run a 1x1 convolution over few pixels as a matrix product of the channels-last pixels
(torch.addmm), a residual Add (and the Relu after it) summed into it, where oneDNN's per-call cost would outweigh
the product (MobileNetV3 at batch 1). Checked against onnxruntime, with which steps the region made counted."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

from xpuruntime.onnx import InferenceSession  # noqa: E402
from xpuruntime.onnx.ops import conv_region  # noqa: E402

rng = np.random.default_rng(7)
C = 5  # input channels: odd, as the sizes below are


def _weights() -> dict[str, np.ndarray]:
    shapes = {"w0": (8, C, 3, 3), "b0": (8,), "w1": (12, 8, 1, 1), "b1": (12,), "w2": (8, 12, 1, 1), "b2": (8,),
              "w3": (8, 8, 1, 1), "w4": (8, 8, 1, 1), "b4": (8,), "w5": (8, 8, 1, 1), "wq": (8, 8, 1, 1),
              "ws": (8, 8, 1, 1), "bs": (8,)}  # fmt: skip
    return {name: (rng.standard_normal(shape) * 0.5).astype(np.float32) for name, shape in shapes.items()}


def residual_products_model() -> bytes:
    """A 3x3 Conv + HardSwish (h), then 1x1 convolutions: + Relu; + b, + h (its last reader: in place), Relu;
    no bias, + its own input (not in place); + b, + its own input; no bias, + an earlier value read last here (in
    place); a strided one (oneDNN), squeeze-excite and its Mul."""
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
        helper.make_node("HardSwish", ["c0"], ["h"]),
        helper.make_node("Conv", ["h", "w1", "b1"], ["p1"]),
        helper.make_node("Relu", ["p1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["p2"]),
        helper.make_node("Add", ["p2", "h"], ["a2"]),
        helper.make_node("Relu", ["a2"], ["s2"]),
        helper.make_node("Conv", ["s2", "w3"], ["p3"]),
        helper.make_node("Add", ["s2", "p3"], ["t3"]),
        helper.make_node("Conv", ["t3", "w4", "b4"], ["p4"]),
        helper.make_node("Add", ["p4", "t3"], ["y4"]),
        helper.make_node("Conv", ["y4", "w5"], ["p5"]),
        helper.make_node("Add", ["s2", "p5"], ["y5"]),
        helper.make_node("Conv", ["y5", "wq"], ["q"], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["q"], ["m"]),
        helper.make_node("Conv", ["m", "ws", "bs"], ["ps"]),
        helper.make_node("HardSigmoid", ["ps"], ["g"], alpha=1 / 6, beta=0.5),
        helper.make_node("Mul", ["q", "g"], ["y"]),
    ]
    inits = [numpy_helper.from_array(v, k) for k, v in _weights().items()]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", C, "h", "w"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "products", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _counting(monkeypatch: Any) -> tuple[Counter, list]:
    """Count the steps the region makes of each kind; the residual products' (in place, bias, Relu)."""
    made: Counter = Counter()
    residuals: list = []

    def wrap(name: str) -> None:
        inner = getattr(conv_region, name)

        def counted(*args: Any) -> Any:
            made[name] += 1
            if name == "_product_residual_step":
                conv, *_, in_place, relu = args
                residuals.append((in_place, bool(conv.b), relu))
            return inner(*args)

        monkeypatch.setattr(conv_region, name, counted)

    for name in ("_product_step", "_product_residual_step", "_onednn_step", "_onednn_residual_step"):
        wrap(name)
    return made, residuals


def _check(data: bytes, shape: tuple[int, ...]) -> None:
    session = InferenceSession(data)
    assert "ConvRegion" in session.graph.op_counts()
    reference = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for _ in range(2):  # the planning run, then the steps it made
        feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
        np.testing.assert_allclose(session.run(None, feeds)[0], reference.run(None, feeds)[0], rtol=1e-4, atol=1e-4)


def test_a_region_runs_pointwise_convolutions_over_few_pixels_as_matrix_products(monkeypatch) -> None:
    made, residuals = _counting(monkeypatch)
    _check(residual_products_model(), (1, C, 9, 7))
    assert made == {"_product_step": 2, "_product_residual_step": 4, "_onednn_step": 2}, made
    assert sorted(residuals) == [(False, False, False), (False, True, False), (True, False, False), (True, True, True)]


@pytest.mark.parametrize("shape", [(3, C, 20, 19), (2, C, 23, 23)])
def test_a_region_keeps_onednn_for_pointwise_convolutions_over_many_pixels(monkeypatch, shape) -> None:
    """Over PRODUCT_ROWS output pixels (a batch of 3 images of 20 x 19) the 1x1 convolutions stay oneDNN's; the
    squeeze-excite product over the pooled 1x1 image stays a product."""
    made, _ = _counting(monkeypatch)
    _check(residual_products_model(), shape)
    assert made == {"_product_step": 1, "_onednn_residual_step": 4, "_onednn_step": 3}, made


def test_the_product_threshold_counts_output_pixels_of_the_batch(monkeypatch) -> None:
    """The same images with PRODUCT_ROWS lowered below their pixel count: oneDNN again, outputs still equal."""
    monkeypatch.setattr(conv_region, "PRODUCT_ROWS", 2 * 9 * 7 - 1)
    made, _ = _counting(monkeypatch)
    _check(residual_products_model(), (2, C, 9, 7))
    assert made == {"_product_step": 1, "_onednn_residual_step": 4, "_onednn_step": 3}, made
    made.clear()
    _check(residual_products_model(), (1, C, 9, 7))
    assert made["_product_residual_step"] == 4, made
