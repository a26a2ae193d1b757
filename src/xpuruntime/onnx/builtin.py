"""A BERT-style encoder built with onnx.helper (random weights): the CLI's default model and the CPU
benchmark's subject, with the patterns exporters emit (attention with a mask, erf GELU, layer norm)."""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def encoder_model(
    layers: int = 2, hidden: int = 128, heads: int = 4, ffn: int = 512, vocab: int = 1000, seed: int = 0
) -> onnx.ModelProto:
    """Inputs input_ids, attention_mask (int64 [batch, seq]); output last_hidden_state [batch, seq, hidden]."""
    rng = np.random.default_rng(seed)
    inits: dict[str, np.ndarray] = {}
    nodes: list[onnx.NodeProto] = []

    def const(name: str, value: np.ndarray) -> str:
        inits[name] = np.asarray(value)
        return name

    def weight(name: str, *shape: int) -> str:
        return const(name, (rng.standard_normal(shape) / math.sqrt(shape[0])).astype(np.float32))

    def node(op: str, inputs: list[str], output: str, **attrs: object) -> str:
        nodes.append(helper.make_node(op, inputs, [output], name=output, **attrs))
        return output

    def linear(x: str, name: str, k: int, n: int) -> str:
        mm = node("MatMul", [x, weight(f"{name}.w", k, n)], f"{name}.mm")
        return node("Add", [mm, const(f"{name}.b", rng.standard_normal(n).astype(np.float32) * 0.1)], name)

    def layer_norm(x: str, name: str) -> str:
        scale = const(f"{name}.g", (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32))
        bias = const(f"{name}.b", (0.1 * rng.standard_normal(hidden)).astype(np.float32))
        return node("LayerNormalization", [x, scale, bias], name, axis=-1, epsilon=1e-12)

    hd = hidden // heads
    const("heads_shape", np.array([0, 0, heads, hd], np.int64))
    const("hidden_shape", np.array([0, 0, hidden], np.int64))
    const("mask_axes", np.array([1, 2], np.int64))
    const("one", np.array(1.0, np.float32))
    const("big_negative", np.array(-10000.0, np.float32))
    const("sqrt_hd", np.array(math.sqrt(hd), np.float32))
    const("sqrt2", np.array(math.sqrt(2.0), np.float32))
    const("half", np.array(0.5, np.float32))
    const("zero", np.array(0, np.int64))
    const("step", np.array(1, np.int64))
    tok = node("Gather", [weight("tok_emb", vocab, hidden), "input_ids"], "tok")
    shape = node("Shape", ["input_ids"], "ids_shape")
    seq = node("Gather", [shape, "step"], "seq_len")
    positions = node("Range", ["zero", seq, "step"], "positions")
    pos = node("Gather", [weight("pos_emb", 512, hidden), positions], "pos")
    x = layer_norm(node("Add", [tok, pos], "emb"), "emb_ln")
    m = node("Cast", [node("Unsqueeze", ["attention_mask", "mask_axes"], "mask4")], "maskf", to=TensorProto.FLOAT)
    mask = node("Mul", [node("Sub", ["one", m], "mask_inv"), "big_negative"], "mask_add")
    for i in range(layers):
        p = f"l{i}"

        def heads_of(t: str, perm: list[int], name: str) -> str:
            return node("Transpose", [node("Reshape", [t, "heads_shape"], f"{name}.r")], name, perm=perm)

        q = heads_of(linear(x, f"{p}.q", hidden, hidden), [0, 2, 1, 3], f"{p}.qh")
        kt = heads_of(linear(x, f"{p}.k", hidden, hidden), [0, 2, 3, 1], f"{p}.kt")
        v = heads_of(linear(x, f"{p}.v", hidden, hidden), [0, 2, 1, 3], f"{p}.vh")
        scores = node(
            "Add", [node("Div", [node("MatMul", [q, kt], f"{p}.qk"), "sqrt_hd"], f"{p}.scaled"), mask], f"{p}.masked"
        )
        probs = node("Softmax", [scores], f"{p}.probs", axis=-1)
        ctx = node("Transpose", [node("MatMul", [probs, v], f"{p}.ctx")], f"{p}.ctx_t", perm=[0, 2, 1, 3])
        ctx = node("Reshape", [ctx, "hidden_shape"], f"{p}.ctx_r")
        x = layer_norm(node("Add", [x, linear(ctx, f"{p}.o", hidden, hidden)], f"{p}.res1"), f"{p}.ln1")
        h = linear(x, f"{p}.up", hidden, ffn)
        erf = node("Erf", [node("Div", [h, "sqrt2"], f"{p}.h_s")], f"{p}.erf")
        gelu = node("Mul", [node("Mul", [h, node("Add", [erf, "one"], f"{p}.erf1")], f"{p}.hm"), "half"], f"{p}.gelu")
        x = layer_norm(node("Add", [x, linear(gelu, f"{p}.down", ffn, hidden)], f"{p}.res2"), f"{p}.ln2")
    nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="output"))
    ids = [
        helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"]) for n in ("input_ids", "attention_mask")
    ]
    out = helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "seq", hidden])
    graph = helper.make_graph(nodes, "encoder", ids, [out], [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def encoder_inputs(batch: int, seq: int, vocab: int = 1000, seed: int = 0) -> dict[str, np.ndarray]:
    """Random token ids and a mask with the last quarter of some rows padded."""
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), np.int64)
    mask[: batch // 2 + 1, seq - seq // 4 :] = 0
    return {"input_ids": rng.integers(0, vocab, (batch, seq)).astype(np.int64), "attention_mask": mask}
