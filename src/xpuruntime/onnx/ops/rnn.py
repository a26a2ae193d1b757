"""Recurrent layers: RNN, GRU and LSTM (forward, reverse, bidirectional; sequence_lens; initial states;
LSTM peepholes and input_forget; GRU linear_before_reset; clip; layout 0 and 1; every activation ONNX names,
with its alpha and beta). NumPy, one time step after another (the GPU path runs them on the host)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ...errors import ShapeError
from ...graph.ir import Node
from ..errors import UnsupportedModelError
from .record import Fn, LoadContext, op


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


ACTIVATIONS: dict[str, tuple[int, Callable[..., np.ndarray]]] = {  # name -> (parameters, function)
    "relu": (0, lambda x: np.maximum(x, 0)),
    "tanh": (0, np.tanh),
    "sigmoid": (0, _sigmoid),
    "softsign": (0, lambda x: x / (1 + np.abs(x))),
    "softplus": (0, lambda x: np.logaddexp(0, x)),
    "affine": (2, lambda x, a, b: a * x + b),
    "leakyrelu": (1, lambda x, a: np.where(x >= 0, x, a * x)),
    "thresholdedrelu": (1, lambda x, a: np.where(x > a, x, 0)),
    "scaledtanh": (2, lambda x, a, b: a * np.tanh(b * x)),
    "hardsigmoid": (2, lambda x, a, b: np.clip(a * x + b, 0, 1)),
    "elu": (1, lambda x, a: np.where(x > 0, x, a * np.expm1(x))),
}
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
DEFAULTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}
DEFAULT_PARAMETERS = {"leakyrelu": [0.01], "thresholdedrelu": [1.0], "hardsigmoid": [0.2, 0.5], "elu": [1.0]}


def check_rnn(node: Node, ctx: LoadContext) -> None:
    names = node.attrs.get("activations") or []
    unknown = [a for a in names if str(a).lower() not in ACTIVATIONS]
    direction = node.attrs.get("direction", "forward")
    if unknown or direction not in ("forward", "reverse", "bidirectional"):
        raise UnsupportedModelError(
            f"{node.describe()}: activations {unknown} / direction {direction!r} are not supported; supported: "
            f"{sorted(ACTIVATIONS)}, forward / reverse / bidirectional"
        )


def _activations(node: Node, directions: int) -> list[list[Callable[[np.ndarray], np.ndarray]]]:
    """Per direction, the op's activation functions with their alpha and beta bound."""
    names = [str(a).lower() for a in (node.attrs.get("activations") or DEFAULTS[node.op] * directions)]
    alphas, betas = list(node.attrs.get("activation_alpha") or []), list(node.attrs.get("activation_beta") or [])
    bound = []
    for name in names:
        count, fn = ACTIVATIONS[name]
        params = DEFAULT_PARAMETERS.get(name, [1.0, 0.0])[:count]
        if count >= 1 and alphas:
            params[0] = alphas.pop(0)
        if count == 2 and betas:
            params[1] = betas.pop(0)
        bound.append(lambda x, fn=fn, params=tuple(params): fn(x, *params))
    per = len(names) // directions
    return [bound[d * per : (d + 1) * per] for d in range(directions)]


def _cell(node: Node, acts: list, gates: np.ndarray, h: np.ndarray, c: np.ndarray | None, w: dict) -> tuple:
    """One step of one direction: gates holds X_t W^T + Wb (batch, gates * hidden)."""
    clip = node.attrs.get("clip")

    def clipped(x: np.ndarray) -> np.ndarray:
        return np.clip(x, -clip, clip) if clip is not None else x

    r_weights, rb = w["R"], w["Rb"]
    if node.op == "RNN":
        return acts[0](clipped(gates + h @ r_weights.T + rb)), None
    if node.op == "GRU":
        hidden = h.shape[-1]
        rz = gates[:, : 2 * hidden] + h @ r_weights[: 2 * hidden].T + rb[: 2 * hidden]
        z, r = acts[0](clipped(rz[:, :hidden])), acts[0](clipped(rz[:, hidden:]))
        if node.attrs.get("linear_before_reset", 0):
            candidate = gates[:, 2 * hidden :] + r * (h @ r_weights[2 * hidden :].T + rb[2 * hidden :])
        else:
            candidate = gates[:, 2 * hidden :] + (r * h) @ r_weights[2 * hidden :].T + rb[2 * hidden :]
        new = acts[1](clipped(candidate))
        return (1 - z) * new + z * h, None
    hidden = h.shape[-1]
    pre = gates + h @ r_weights.T + rb
    p_i, p_o, p_f = w["P"]
    i = acts[0](clipped(pre[:, :hidden] + p_i * c))
    f = acts[0](clipped(pre[:, 2 * hidden : 3 * hidden] + p_f * c))
    if node.attrs.get("input_forget", 0):
        f = 1 - i
    candidate = acts[1](clipped(pre[:, 3 * hidden :]))
    c_new = f * c + i * candidate
    o = acts[0](clipped(pre[:, hidden : 2 * hidden] + p_o * c_new))
    return o * acts[2](c_new), c_new


def recurrent(node: Node, opset: int) -> Fn:
    hidden = node.attrs.get("hidden_size")
    direction = node.attrs.get("direction", "forward")
    directions = 2 if direction == "bidirectional" else 1
    batch_first = bool(node.attrs.get("layout", 0))
    n_gates = GATES[node.op]

    def run(x, weights, recurrence, bias=None, lengths=None, h0=None, c0=None, peep=None) -> tuple:
        xs = (x.transpose(1, 0, 2) if batch_first else x).astype(np.float64)
        seq, batch, _ = xs.shape
        size = hidden or weights.shape[1] // n_gates
        if weights.shape[:2] != (directions, n_gates * size):
            raise ShapeError(f"{node.op}: W {weights.shape} does not fit {directions} direction(s) of {size} units")
        lens = np.full(batch, seq) if lengths is None else np.asarray(lengths).reshape(-1).astype(np.int64)
        if h0 is not None and batch_first:
            h0 = h0.transpose(1, 0, 2)
        if c0 is not None and batch_first:
            c0 = c0.transpose(1, 0, 2)
        acts = _activations(node, directions)
        y = np.zeros((seq, directions, batch, size))
        last_h, last_c = np.zeros((directions, batch, size)), np.zeros((directions, batch, size))
        for d in range(directions):
            b = np.zeros(2 * n_gates * size) if bias is None else bias[d].astype(np.float64)
            w = {"R": recurrence[d].astype(np.float64), "Rb": b[n_gates * size :],
                 "P": np.zeros((3, size)) if peep is None else peep[d].astype(np.float64).reshape(3, size)}  # fmt: skip
            projected = xs @ weights[d].astype(np.float64).T + b[: n_gates * size]  # (seq, batch, gates)
            h = np.zeros((batch, size)) if h0 is None else h0[d].astype(np.float64)
            c = np.zeros((batch, size)) if c0 is None else c0[d].astype(np.float64)
            backward = direction == "reverse" or d == 1
            for t in range(seq):
                active = t < lens
                steps = np.where(backward, lens - 1 - t, t).clip(0, seq - 1)
                gates = projected[steps, np.arange(batch)]
                h_new, c_new = _cell(node, acts[d], gates, h, c, w)
                h = np.where(active[:, None], h_new, h)
                if c_new is not None:
                    c = np.where(active[:, None], c_new, c)
                y[steps[active], d, np.arange(batch)[active]] = h[active]
            last_h[d], last_c[d] = h, c
        dtype = x.dtype
        if batch_first:
            y, last_h, last_c = y.transpose(2, 0, 1, 3), last_h.transpose(1, 0, 2), last_c.transpose(1, 0, 2)
        results = (y.astype(dtype), last_h.astype(dtype))
        return (*results, last_c.astype(dtype)) if node.op == "LSTM" else results

    return run


for _name in GATES:
    op(_name, recurrent, tuple_output=True, host_inputs=(4,), check=check_rnn)
