"""Recurrent ONNX ops, which carry a state along the sequence: the linear-attention family's LinearAttention
(linear, gated, delta and gated-delta rules, with grouped-query heads) and CausalConvWithState (a depthwise
causal 1-D convolution that hands its last k - 1 inputs on).

The recurrences run one time step at a time, each step vectorised over batch, heads and state; the
convolution is one product over sliding windows (F.conv1d on the GPU path).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...errors import ShapeError
from ...graph.ir import GraphError, Node
from ..errors import UnsupportedModelError
from .arrays import NUMPY, TORCH
from .record import F, Fn, LoadContext, op, torch

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


def _linear_attention(xp: Any, node: Node, q: Any, k: Any, v: Any, past: Any, decay: Any, beta: Any) -> tuple:
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


def linear_attention(node: Node, opset: int) -> Fn:
    return lambda q, k, v, past=None, decay=None, beta=None: _linear_attention(NUMPY, node, q, k, v, past, decay, beta)


def linear_attention_torch(node: Node, opset: int) -> Fn:
    return lambda q, k, v, past=None, decay=None, beta=None: _linear_attention(TORCH, node, q, k, v, past, decay, beta)


op("LinearAttention", linear_attention, linear_attention_torch, tuple_output=True, check=check_linear_attention)


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
