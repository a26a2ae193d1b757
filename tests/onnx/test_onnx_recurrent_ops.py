"""RNN, GRU, LSTM, LinearAttention and CausalConvWithState on random inputs: against onnxruntime (the ONNX
reference, or a float64 formula of our own, where onnxruntime does not run them), on the CPU and through the
GPU path's PyTorch functions (CPU tensors); the batch-first layout, sequence lengths, states carried across
calls, and the load-time refusals."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx_models import make, onnxruntime, randn, reference, run_on, same, vi

from xpuruntime.graph.ir import GraphError
from xpuruntime.onnx import InferenceSession, UnsupportedModelError

F, I32 = TensorProto.FLOAT, TensorProto.INT32
PATHS = ("numpy", "torch")
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def rnn_model(op: str, direction: str, layout: int, shapes: dict, attrs: dict) -> object:
    names = ["x", "w", "r", "b", "lens", "h0"] + (["c0", "p"] if op == "LSTM" else [])
    outputs = ["y", "y_h"] + (["y_c"] if op == "LSTM" else [])
    node = helper.make_node(op, names, outputs, hidden_size=3, direction=direction, layout=layout, **attrs)
    inputs = [vi(n, shapes[n], I32 if n == "lens" else F) for n in names]
    return make([node], inputs, [vi(o, None) for o in outputs], opset=22)


def rnn_feed(op: str, direction: str, layout: int, rng: np.random.Generator) -> dict:
    steps, batch, size, hidden, dirs = 5, 3, 4, 3, 2 if direction == "bidirectional" else 1
    gates = GATES[op]
    state = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    feed = {
        "x": randn(rng, *((batch, steps, size) if layout else (steps, batch, size))) / 3,
        "w": randn(rng, dirs, gates * hidden, size) / 3, "r": randn(rng, dirs, gates * hidden, hidden) / 3,
        "b": randn(rng, dirs, 2 * gates * hidden) / 3, "lens": np.array([5, 2, 4], np.int32),
        "h0": randn(rng, *state) / 3,
    }  # fmt: skip
    if op == "LSTM":
        feed |= {"c0": randn(rng, *state) / 3, "p": randn(rng, dirs, 3 * hidden) / 3}
    return feed


EXTRA = {
    "RNN": {"activations": ["LeakyRelu", "HardSigmoid"], "activation_alpha": [0.2, 0.3], "activation_beta": [0.4]},
    "GRU": {"linear_before_reset": 1, "clip": 0.8},
    "LSTM": {"input_forget": 1, "clip": 0.9},
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_recurrent_cells_match_onnxruntime(path: str, op: str, direction: str, torch_session, rng) -> None:
    for attrs in ({}, EXTRA[op]):
        if op == "RNN" and attrs and direction != "bidirectional":
            attrs = {"activations": ["LeakyRelu"], "activation_alpha": [0.2]}
        feed = rnn_feed(op, direction, 0, rng)
        model = rnn_model(op, direction, 0, {k: list(v.shape) for k, v in feed.items()}, attrs)
        same(run_on(path, torch_session, model, feed), onnxruntime(model, feed), atol=1e-5)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_batch_first_layout_is_the_transposed_sequence_first_one(path: str, op: str, torch_session, rng) -> None:
    """onnxruntime refuses layout=1: it must equal layout=0 on transposed inputs and outputs."""
    feed = rnn_feed(op, "bidirectional", 1, rng)
    model = rnn_model(op, "bidirectional", 1, {k: list(v.shape) for k, v in feed.items()}, {})
    first = {k: (v.swapaxes(0, 1) if k in ("x", "h0", "c0") else v) for k, v in feed.items()}
    want = onnxruntime(rnn_model(op, "bidirectional", 0, {k: list(v.shape) for k, v in first.items()}, {}), first)
    y, *states = run_on(path, torch_session, model, feed)
    same(
        [y.transpose(1, 2, 0, 3), *(s.swapaxes(0, 1) for s in states)], want, atol=1e-5
    )  # (B, S, D, H) -> (S, D, B, H)


def test_recurrent_refusals() -> None:
    bad = helper.make_node("RNN", ["x", "w", "r"], ["y"], hidden_size=3, activations=["Gelu"])
    model = make([bad], [vi("x", [2, 1, 4]), vi("w", [1, 3, 4]), vi("r", [1, 3, 3])], [vi("y", None)], opset=22)
    with pytest.raises(UnsupportedModelError, match=r"\(RNN\): activations \['Gelu'\]"):
        InferenceSession(model.SerializeToString())


def linear_attention_model(rule: str, q_heads: int, kv_heads: int, past: bool, per_dim_decay: bool) -> object:
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    names = ["q", "k", "v", "past" if past else "", "decay" if gated else "", "beta" if delta else ""]
    while not names[-1]:
        names.pop()
    node = helper.make_node("LinearAttention", names, ["y", "state"], q_num_heads=q_heads, kv_num_heads=kv_heads,
                            update_rule=rule)  # fmt: skip
    shapes = {"q": [2, 5, q_heads * 4], "k": [2, 5, kv_heads * 4], "v": [2, 5, kv_heads * 3],
              "past": [2, kv_heads, 4, 3], "decay": [2, 5, kv_heads * (4 if per_dim_decay else 1)],
              "beta": [2, 5, kv_heads]}  # fmt: skip
    inputs = [vi(n, shapes[n]) for n in names if n]
    return make([node], inputs, [vi("y", None), vi("state", None)], opset=27)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
def test_linear_attention_matches_the_reference(path: str, rule: str, torch_session, rng) -> None:
    for q_heads, kv_heads, past, per_dim in ((2, 2, False, True), (4, 2, True, False), (3, 1, True, True)):
        model = linear_attention_model(rule, q_heads, kv_heads, past, per_dim)
        feed = {i.name: randn(rng, *[d.dim_value for d in i.type.tensor_type.shape.dim]) / 4 for i in model.graph.input}
        if "decay" in feed:
            feed["decay"] = -np.abs(feed["decay"])  # log-space decay
        same(run_on(path, torch_session, model, feed), reference(model, feed), atol=1e-5)


def test_linear_rule_is_causal_linear_attention(rng) -> None:
    """Without gates the recurrence is scale * (q S0 + tril(q k^T) v): checked in float64."""
    model = linear_attention_model("linear", 2, 2, True, False)
    feed = {
        "q": randn(rng, 2, 5, 8),
        "k": randn(rng, 2, 5, 8),
        "v": randn(rng, 2, 5, 6),
        "past": randn(rng, 2, 2, 4, 3),
    }
    heads = lambda x, d: x.astype(np.float64).reshape(2, 5, 2, d).transpose(0, 2, 1, 3)  # noqa: E731
    q, k, v = heads(feed["q"], 4), heads(feed["k"], 4), heads(feed["v"], 3)
    s0 = feed["past"].astype(np.float64)
    out = (q @ s0 + np.tril(q @ k.swapaxes(-1, -2)) @ v) / 2.0
    state = s0 + k.swapaxes(-1, -2) @ v
    y, got_state = run_on("numpy", None, model, feed)
    same([y, got_state], [out.transpose(0, 2, 1, 3).reshape(2, 5, 6).astype(np.float32), state.astype(np.float32)],
         atol=1e-4, rtol=1e-4)  # fmt: skip


def test_linear_attention_refusals() -> None:
    model = linear_attention_model("gated", 2, 2, False, False)
    model.graph.node[0].input[4] = ""  # gated without a decay
    with pytest.raises(GraphError, match="update_rule 'gated' needs decay"):
        InferenceSession(model.SerializeToString())
    model = linear_attention_model("linear", 3, 2, False, False)
    with pytest.raises(GraphError, match="q_num_heads 3 must be a positive multiple of kv_num_heads 2"):
        InferenceSession(model.SerializeToString())


def causal_conv_model(k: int, activation: str) -> object:
    node = helper.make_node("CausalConvWithState", ["x", "w", "b", "past"], ["y", "state"], activation=activation)
    inputs = [vi("x", [2, 3, None]), vi("w", [3, 1, k]), vi("b", [3]), vi("past", [2, 3, k - 1])]
    return make([node], inputs, [vi("y", None), vi("state", None)], opset=27)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("activation", ["none", "silu"])
def test_causal_conv_carries_its_state_across_calls(path: str, activation: str, torch_session, rng) -> None:
    """Two calls on halves of a sequence, the state handed on, equal one call on all of it (and the reference)."""
    for k in (1, 4):
        model = causal_conv_model(k, activation)
        x, w, b = randn(rng, 2, 3, 9), randn(rng, 3, 1, k), randn(rng, 3)
        start = np.zeros((2, 3, k - 1), np.float32)
        whole = run_on(path, torch_session, model, {"x": x, "w": w, "b": b, "past": start})
        same(whole, reference(model, {"x": x, "w": w, "b": b, "past": start}), atol=1e-5)
        y1, state = run_on(path, torch_session, model, {"x": x[..., :4], "w": w, "b": b, "past": start})
        y2, last = run_on(path, torch_session, model, {"x": x[..., 4:], "w": w, "b": b, "past": state})
        same([np.concatenate([y1, y2], -1), last], whole, atol=1e-5)
