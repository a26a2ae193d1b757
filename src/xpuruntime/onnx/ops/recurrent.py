"""Recurrent ONNX ops, which carry a state along the sequence: RNN, GRU and LSTM (every direction, layout,
sequence_lens, peepholes, clip and activation), the linear-attention family's LinearAttention (linear, gated,
delta and gated-delta rules, with grouped-query heads) and CausalConvWithState (a depthwise causal 1-D
convolution that hands its last k - 1 inputs on).

The recurrences run one time step at a time, each step vectorised over batch, heads and state, and are
written once for both paths (arrays.py); the convolution is one product over sliding windows (F.conv1d on
the GPU path).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...errors import ShapeError
from ...graph.ir import GraphError, Node
from ..errors import UnsupportedModelError
from .arrays import builders
from .record import F, Fn, LoadContext, op, to_host, torch

# -- LinearAttention ---------------------------------------------------------------------------------------------
RULES = ("linear", "gated", "delta", "gated_delta")


def _rule(node: Node) -> tuple[bool, bool]:
    """Whether the node's update rule decays the state (gated) and corrects it by what it recalls (delta)."""
    rule = node.attrs.get("update_rule", "gated_delta")
    return rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")


def check_linear_attention(node: Node, ctx: LoadContext) -> None:
    rule = node.attrs.get("update_rule", "gated_delta")
    if rule not in RULES:
        raise UnsupportedModelError(f"{node.describe()}: update_rule {rule!r} is not one of {list(RULES)}")
    q_heads, kv_heads = node.attrs["q_num_heads"], node.attrs["kv_num_heads"]
    if kv_heads <= 0 or q_heads <= 0 or q_heads % kv_heads:
        raise GraphError(f"{node.describe()}: q_num_heads {q_heads} must be a positive multiple of kv_num_heads "
                         f"{kv_heads}")  # fmt: skip
    gated, delta = _rule(node)
    given = [i < len(node.inputs) and bool(node.inputs[i]) for i in (4, 5)]
    for name, wanted, present in (("decay", gated, given[0]), ("beta", delta, given[1])):
        if wanted != present:
            raise GraphError(f"{node.describe()}: update_rule {rule!r} {'needs' if wanted else 'takes no'} {name}")


def _heads(x: Any, heads: int, name: str) -> Any:
    """(B, T, H * D) -> (B, H, T, D)."""
    if x.ndim != 3 or x.shape[-1] % heads:
        raise ShapeError(f"LinearAttention: {name} {tuple(x.shape)} must be (B, T, H * D) with H = {heads}")
    b, t, hd = x.shape
    return x.reshape(b, t, heads, hd // heads).swapaxes(1, 2)


def _per_step(x: Any, heads: int, width: int, name: str) -> Any:
    """decay or beta (B, T, H or H * width or 1) -> (B, H or 1, T, 1 or width)."""
    b, t, last = x.shape
    if last == heads * width and width > 1:
        return x.reshape(b, t, heads, width).swapaxes(1, 2)
    if last in (heads, 1):
        return x.reshape(b, t, last, 1).swapaxes(1, 2)
    raise ShapeError(f"LinearAttention: {name} {tuple(x.shape)} must end in {heads} (per head)"
                     + (f" or {heads * width} (per key dim)" if width > 1 else " or 1"))  # fmt: skip


class _Recurrence:
    """What LinearAttention's steps need, in 4-D, and the shapes checked alike on both paths."""

    def __init__(self, node: Node, q: Any, k: Any, v: Any, past: Any, decay: Any, beta: Any) -> None:
        self.q_heads, self.kv_heads = node.attrs["q_num_heads"], node.attrs["kv_num_heads"]
        self.q, self.k, self.v = (
            _heads(q, self.q_heads, "query"),
            _heads(k, self.kv_heads, "key"),
            _heads(v, self.kv_heads, "value"),
        )
        b, _, t, dk = self.q.shape
        if self.k.shape[:1] + self.k.shape[2:] != (b, t, dk) or self.v.shape[:3] != self.k.shape[:3]:
            raise ShapeError(f"LinearAttention: query {tuple(q.shape)}, key {tuple(k.shape)} and value "
                             f"{tuple(v.shape)} do not agree on batch, length and key dim")  # fmt: skip
        self.state_shape = (b, self.kv_heads, dk, self.v.shape[-1])
        if past is not None and tuple(past.shape) != self.state_shape:
            raise ShapeError(f"LinearAttention: past_state {tuple(past.shape)} must be {self.state_shape}")
        self.decay = None if decay is None else _per_step(decay, self.kv_heads, dk, "decay")
        self.beta = None if beta is None else _per_step(beta, self.kv_heads, 1, "beta")
        scale = node.attrs.get("scale", 0.0)
        self.scale = scale if scale else 1.0 / math.sqrt(dk)
        self.group = self.q_heads // self.kv_heads


def _linear_attention(
    xp: Any, node: Node, opset: int, q: Any, k: Any, v: Any, past: Any = None, decay: Any = None, beta: Any = None
) -> tuple:
    """S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - exp(g_t) S_{t-1}^T k_t))^T for gated delta (the other
    rules drop the decay, the correction or both); o_t = scale q_t^T S_t, each query head reading the state of
    its key-value head. Computed in float32 (float64 for float64 inputs)."""
    r = _Recurrence(node, q, k, v, past, decay, beta)
    compute = xp.compute_dtype(q)
    qs, ks, vs = (xp.cast(a, compute) for a in (r.q, r.k, r.v))
    gates = None if r.decay is None else xp.exp(xp.cast(r.decay, compute))
    betas = None if r.beta is None else xp.cast(r.beta, compute)
    state = xp.zeros(r.state_shape, compute, q) if past is None else xp.cast(past, compute)
    steps = []
    for t in range(qs.shape[2]):
        if gates is not None:
            state = state * gates[:, :, t, :, None]
        update = vs[:, :, t]
        if betas is not None:
            update = betas[:, :, t] * (update - xp.einsum("bhkv,bhk->bhv", state, ks[:, :, t]))
        state = state + ks[:, :, t, :, None] * update[:, :, None, :]
        read = xp.repeat(state, r.group, 1) if r.group > 1 else state
        steps.append(xp.einsum("bhk,bhkv->bhv", qs[:, :, t], read))
    out = xp.stack(steps, 2) * r.scale
    b, h, t, dv = out.shape
    y = xp.permute(out, (0, 2, 1, 3)).reshape(b, t, h * dv)
    return xp.cast(y, q.dtype), xp.cast(state, q.dtype if past is None else past.dtype)


op("LinearAttention", *builders(_linear_attention), tuple_output=True, check=check_linear_attention)


# -- CausalConvWithState -----------------------------------------------------------------------------------------
ACTIVATIONS = ("none", "silu", "swish")


def check_causal_conv(node: Node, ctx: LoadContext) -> None:
    if node.attrs.get("activation", "none") not in ACTIVATIONS:
        raise UnsupportedModelError(f"{node.describe()}: activation {node.attrs['activation']!r} is not one of "
                                    f"{list(ACTIVATIONS)}")  # fmt: skip


def _causal_shapes(x: Any, weight: Any, past: Any) -> int:
    """The kernel size, with the shapes checked: input (B, C, L), weight (C, 1, k), past_state (B, C, k - 1)."""
    if x.ndim != 3 or weight.ndim != 3 or tuple(weight.shape[:2]) != (x.shape[1], 1) or weight.shape[2] < 1:
        raise ShapeError(f"CausalConvWithState: input {tuple(x.shape)} must be (B, C, L) and weight "
                         f"{tuple(weight.shape)} (C, 1, k)")  # fmt: skip
    k = weight.shape[2]
    if past is not None and tuple(past.shape) != (x.shape[0], x.shape[1], k - 1):
        raise ShapeError(f"CausalConvWithState: past_state {tuple(past.shape)} must be "
                         f"{(x.shape[0], x.shape[1], k - 1)}")  # fmt: skip
    return k


def causal_conv(node: Node, opset: int) -> Fn:
    """y[b, c, t] = sum_j w[c, 0, j] * padded[b, c, t + j] (+ bias[c]), padded = past_state (or zeros) then the
    input; the present state is the last k - 1 columns of padded. SiLU on request."""
    silu = node.attrs.get("activation", "none") != "none"

    def run(x: np.ndarray, weight: np.ndarray, bias: Any = None, past: Any = None) -> tuple:
        k = _causal_shapes(x, weight, past)
        head = np.zeros((*x.shape[:2], k - 1), x.dtype) if past is None else past.astype(x.dtype, copy=False)
        padded = np.concatenate([head, x], axis=2)
        compute = np.float64 if x.dtype == np.float64 else np.float32
        windows = np.lib.stride_tricks.sliding_window_view(padded, k, axis=2)  # (B, C, L, k)
        y = np.einsum("bclk,ck->bcl", windows.astype(compute), weight[:, 0].astype(compute))
        if bias is not None:
            y = y + bias.astype(compute)[:, None]
        if silu:
            y = y / (1 + np.exp(-y))
        return y.astype(x.dtype), padded[:, :, padded.shape[2] - (k - 1) :].copy()

    return run


def causal_conv_torch(node: Node, opset: int) -> Fn:
    silu = node.attrs.get("activation", "none") != "none"

    def run(x: Any, weight: Any, bias: Any = None, past: Any = None) -> tuple:
        k = _causal_shapes(x, weight, past)
        head = x.new_zeros((*x.shape[:2], k - 1)) if past is None else past.to(x.dtype)
        padded = torch.cat([head, x], dim=2)
        y = F.conv1d(padded, weight.to(x.dtype), None if bias is None else bias.to(x.dtype), groups=x.shape[1])
        return F.silu(y) if silu else y, padded[:, :, padded.shape[2] - (k - 1) :].contiguous()

    return run


op("CausalConvWithState", causal_conv, causal_conv_torch, tuple_output=True, check=check_causal_conv)


# -- RNN, GRU and LSTM ------------------------------------------------------------------------------------------
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
DEFAULT_ACTIVATIONS = {"RNN": ("Tanh",), "GRU": ("Sigmoid", "Tanh"), "LSTM": ("Sigmoid", "Tanh", "Tanh")}
# activation -> (default alpha, default beta) for those taking them (None: takes none)
ACTIVATION_PARAMS: dict[str, tuple[float | None, float | None]] = {
    "Relu": (None, None), "Tanh": (None, None), "Sigmoid": (None, None), "Softsign": (None, None),
    "Softplus": (None, None), "Affine": (1.0, 0.0), "LeakyRelu": (0.01, None), "ThresholdedRelu": (1.0, None),
    "ScaledTanh": (1.0, 1.0), "HardSigmoid": (0.2, 0.5), "Elu": (1.0, None),
}  # fmt: skip


def _activation(xp: Any, name: str, alpha: float | None, beta: float | None) -> Any:
    table = {
        "Relu": xp.relu, "Tanh": xp.tanh, "Sigmoid": xp.sigmoid, "Softsign": xp.softsign, "Softplus": xp.softplus,
        "Affine": lambda x: alpha * x + beta,
        "LeakyRelu": lambda x: xp.where(x >= 0, x, alpha * x),
        "ThresholdedRelu": lambda x: xp.where(x > alpha, x, 0 * x),
        "ScaledTanh": lambda x: alpha * xp.tanh(beta * x),
        "HardSigmoid": lambda x: xp.clip(alpha * x + beta, 0, 1),
        "Elu": lambda x: xp.where(x > 0, x, alpha * (xp.exp(x) - 1)),
    }  # fmt: skip
    return table[name]


def _activation_specs(node: Node) -> list[tuple[str, float | None, float | None]]:
    """(name, alpha, beta) of every activation, per direction in turn; alphas and betas are taken in order
    by the activations that use them, defaults where the lists run out."""
    directions = 2 if node.attrs.get("direction", "forward") == "bidirectional" else 1
    names = list(node.attrs.get("activations") or DEFAULT_ACTIVATIONS[node.op] * directions)
    alphas, betas = list(node.attrs.get("activation_alpha") or ()), list(node.attrs.get("activation_beta") or ())
    specs = []
    for name in names:
        name = next((known for known in ACTIVATION_PARAMS if known.lower() == name.lower()), name)
        alpha, beta = ACTIVATION_PARAMS.get(name, (None, None))
        alpha = alphas.pop(0) if alpha is not None and alphas else alpha
        beta = betas.pop(0) if beta is not None and betas else beta
        specs.append((name, alpha, beta))
    return specs


def check_rnn(node: Node, ctx: LoadContext) -> None:
    direction = node.attrs.get("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise UnsupportedModelError(f"{node.describe()}: direction {direction!r} is not forward, reverse or "
                                    "bidirectional")  # fmt: skip
    specs = _activation_specs(node)
    unknown = [name for name, _, _ in specs if name not in ACTIVATION_PARAMS]
    wanted = len(DEFAULT_ACTIVATIONS[node.op]) * (2 if direction == "bidirectional" else 1)
    if unknown or len(specs) != wanted:
        raise UnsupportedModelError(f"{node.describe()}: activations {[s[0] for s in specs]}: expected {wanted} of "
                                    f"{sorted(ACTIVATION_PARAMS)}")  # fmt: skip


def _reverse_within(xp: Any, x: Any, lengths: Any) -> Any:
    """Each batch's first lengths[b] time steps in reverse order, the rest in place (x is (T, B, ...))."""
    steps, batch = x.shape[0], x.shape[1]
    t = np.arange(steps)[:, None]
    index = np.where(t < lengths[None, :], lengths[None, :] - 1 - t, t)
    return x[xp.from_host(index, x), xp.from_host(np.arange(batch)[None, :], x)]


class _Weights:
    """One direction's weights split by gate, transposed for x @ W."""

    def __init__(self, xp: Any, op: str, w: Any, r: Any, b: Any, p: Any, hidden: int, compute: Any) -> None:
        gates = GATES[op]
        self.w = xp.cast(w, compute).T  # (input, gates * hidden)
        self.r = [xp.cast(r[g * hidden : (g + 1) * hidden], compute).T for g in range(gates)]
        self.wb = None if b is None else xp.cast(b[: gates * hidden], compute)
        self.rb = None if b is None else [xp.cast(b[(gates + g) * hidden : (gates + g + 1) * hidden], compute)
                                          for g in range(gates)]  # fmt: skip
        self.p = None if p is None else [xp.cast(p[g * hidden : (g + 1) * hidden], compute) for g in range(3)]


def _cell(xp: Any, node: Node, weights: _Weights, acts: list, xw: Any, h: Any, c: Any, hidden: int) -> tuple:
    """One time step of the node's cell: the new hidden (and cell) state from the input's projection xw."""
    clip = node.attrs.get("clip")
    squash = (lambda v: xp.clip(v, -clip, clip)) if clip is not None else (lambda v: v)
    parts = [xw[:, g * hidden : (g + 1) * hidden] for g in range(GATES[node.op])]
    recur = [h @ rg + (0 if weights.rb is None else weights.rb[g]) for g, rg in enumerate(weights.r)]
    if node.op == "RNN":
        return acts[0](squash(parts[0] + recur[0])), None
    if node.op == "GRU":  # gates z, r, h
        f, g = acts
        z, rt = f(squash(parts[0] + recur[0])), f(squash(parts[1] + recur[1]))
        if node.attrs.get("linear_before_reset", 0):
            candidate = g(squash(parts[2] + rt * recur[2]))
        else:
            rb = 0 if weights.rb is None else weights.rb[2]
            candidate = g(squash(parts[2] + (rt * h) @ weights.r[2] + rb))
        return (1 - z) * candidate + z * h, None
    f, g, hact = acts  # LSTM: gates i, o, f, c; peepholes i, o, f
    peep = weights.p or [0, 0, 0]
    i = f(squash(parts[0] + recur[0] + peep[0] * c))
    forget = 1 - i if node.attrs.get("input_forget", 0) else f(squash(parts[2] + recur[2] + peep[2] * c))
    c = forget * c + i * g(squash(parts[3] + recur[3]))
    o = f(squash(parts[1] + recur[1] + peep[1] * c))
    return o * hact(c), c


def _recurrent(xp: Any, node: Node, opset: int, x: Any, w: Any, r: Any, *rest: Any) -> tuple:
    """RNN, GRU or LSTM over the whole sequence, one step at a time (x @ W for all steps at once), each
    direction on its own; steps past a batch's sequence length leave its state alone and output zeros."""
    b, lengths, h0, c0, p = (*rest, None, None, None, None, None)[:5]
    hidden, layout = node.attrs["hidden_size"], node.attrs.get("layout", 0)
    direction = node.attrs.get("direction", "forward")
    dirs = 2 if direction == "bidirectional" else 1
    if layout:
        x = xp.permute(x, (1, 0, 2))
        h0 = None if h0 is None else xp.permute(h0, (1, 0, 2))
        c0 = None if c0 is None else xp.permute(c0, (1, 0, 2))
    steps, batch, _ = x.shape
    gates = GATES[node.op]
    if w.shape[0] != dirs or w.shape[1] != gates * hidden or r.shape[1:] != (gates * hidden, hidden):
        raise ShapeError(f"{node.op}: W {tuple(w.shape)} and R {tuple(r.shape)} must be ({dirs}, {gates * hidden}, "
                         f"input) and ({dirs}, {gates * hidden}, {hidden})")  # fmt: skip
    host_lengths = np.full(batch, steps, np.int64) if lengths is None else np.asarray(to_host(lengths), np.int64)
    if host_lengths.shape != (batch,) or (host_lengths < 0).any() or (host_lengths > steps).any():
        raise ShapeError(f"{node.op}: sequence_lens {host_lengths} must hold {batch} lengths in [0, {steps}]")
    active = xp.from_host((np.arange(steps)[:, None] < host_lengths[None, :])[:, :, None], x)  # (T, B, 1)
    compute = xp.compute_dtype(x)
    specs = _activation_specs(node)
    per_dir = len(DEFAULT_ACTIVATIONS[node.op])
    ys, hs, cs = [], [], []
    for d in range(dirs):
        weights = _Weights(xp, node.op, w[d], r[d], None if b is None else b[d], None if p is None else p[d],
                           hidden, compute)  # fmt: skip
        acts = [_activation(xp, *spec) for spec in specs[d * per_dir : (d + 1) * per_dir]]
        reverse = direction == "reverse" or d == 1
        seq = _reverse_within(xp, x, host_lengths) if reverse else x
        xw = xp.cast(seq, compute).reshape(steps * batch, -1) @ weights.w
        if weights.wb is not None:
            xw = xw + weights.wb
        xw = xw.reshape(steps, batch, gates * hidden)
        h = xp.zeros((batch, hidden), compute, x) if h0 is None else xp.cast(h0[d], compute)
        c = xp.zeros((batch, hidden), compute, x) if c0 is None else xp.cast(c0[d], compute)
        outs = []
        for t in range(steps):
            new_h, new_c = _cell(xp, node, weights, acts, xw[t], h, c, hidden)
            h = xp.where(active[t], new_h, h)
            c = c if new_c is None else xp.where(active[t], new_c, c)
            outs.append(xp.where(active[t], new_h, 0 * new_h))
        y = xp.stack(outs, 0) if steps else xp.zeros((0, batch, hidden), compute, x)
        ys.append(_reverse_within(xp, y, host_lengths) if reverse else y)
        hs.append(h)
        cs.append(c)
    y, y_h, y_c = (xp.cast(xp.stack(v, 1 if v is ys else 0), x.dtype) for v in (ys, hs, cs))  # Y: (T, D, B, H)
    if layout:
        y, y_h, y_c = xp.permute(y, (2, 0, 1, 3)), xp.permute(y_h, (1, 0, 2)), xp.permute(y_c, (1, 0, 2))
    return (y, y_h, y_c)[: len(node.outputs)]


for _op in GATES:
    op(_op, *builders(_recurrent), host_inputs=(4,), tuple_output=True, check=check_rnn)
