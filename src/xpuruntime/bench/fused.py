"""Fused transformer-training ops at a Llama-8L step's shapes (8 x 1024 tokens, hidden 1024, intermediate 2816,
vocab 32000, 16 / 4 heads of 64), forward + backward as the op pairs (what a custom autograd Function runs)
against the unfused PyTorch forms the Hugging Face modules compute, with autograd. Target: never slower than
the unfused form. Liger-Kernel's kernels, GPT-2's shapes and the float64 checks are in
benchmarks/probes/fused_ops_h100.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .common import close, needs_triton, randn
from .row import Row, Setup

TOKENS, HIDDEN, INTER, VOCAB, HEADS, KV_HEADS, HEAD_DIM, BATCH = 8192, 1024, 2816, 32000, 16, 4, 64, 8


def _ours(steps: Callable[[], Any], ops: tuple[str, ...]) -> Callable[[], Any]:
    """`steps` under a strict policy naming the Triton kernels of `ops` (made once: its scope is cheap)."""
    import xpuruntime as xrt

    policy = xrt.KernelPolicy(strict=True, **{op: "triton" for op in ops})

    def run() -> Any:
        with xrt.kernel_policy(policy):
            return steps()

    return run


def _autograd(forward: Callable[[], Any], leaves: list, upstream: Any) -> Callable[[], Any]:
    import torch

    def run() -> Any:
        out = forward()
        outs, grads = (out, upstream) if isinstance(out, tuple) else ((out,), (upstream,))
        return out, torch.autograd.grad(outs, leaves, grads)

    return run


def _llama_rms_norm(x: Any, w: Any, eps: float = 1e-6) -> Any:
    import torch

    h = x.to(torch.float32)
    return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rms_norm() -> Setup:
    """LlamaRMSNorm under autocast: the fp32 residual stream, weight after the cast back."""
    import xpuruntime as xrt

    x, w, dy = randn(TOKENS, HIDDEN), randn(HIDDEN), randn(TOKENS, HIDDEN)
    xr, wr = (t.clone().requires_grad_() for t in (x, w))
    ours = _ours(lambda: (xrt.ops.rms_norm(x, HIDDEN, w, 1e-6, casting="llama"),
                          xrt.ops.rms_norm_backward(dy, x, HIDDEN, w, 1e-6, casting="llama")),
                 ("rms_norm", "rms_norm_backward"))  # fmt: skip
    anchor = _autograd(lambda: _llama_rms_norm(xr, wr), [xr, wr], dy)

    def check() -> str | None:
        (y, (dx, dw)), (ay, (ax, aw)) = ours(), anchor()
        return close(y, ay, 1e-5) or close(dx, ax, 1e-4) or close(dw, aw, 1e-3)

    return Setup(ours=ours, anchor=anchor, bytes=4 * 5 * TOKENS * HIDDEN, check=check,
                 note="bytes: x, y (forward) + dy, x, dx (backward), fp32")  # fmt: skip


def _add_rms_norm() -> Setup:
    """The decoder layer's `residual + hidden` then the norm: a bf16 branch output onto the fp32 stream."""
    import torch

    import xpuruntime as xrt

    x, r, w = randn(TOKENS, HIDDEN, dtype="bfloat16"), randn(TOKENS, HIDDEN), randn(HIDDEN)
    dy, dh = randn(TOKENS, HIDDEN), randn(TOKENS, HIDDEN)
    xr, rr, wr = (t.clone().requires_grad_() for t in (x, r, w))

    def steps() -> Any:
        y, h = xrt.ops.add_rms_norm(x, r, w, 1e-6, casting="llama")
        return y, xrt.ops.add_rms_norm_backward(dy, dh, h, w, 1e-6, casting="llama")

    def unfused() -> tuple:
        h = xr + rr
        return _llama_rms_norm(h, wr), h

    ours = _ours(steps, ("add_rms_norm", "add_rms_norm_backward"))
    anchor = _autograd(unfused, [xr, rr, wr], (dy, dh))

    def check() -> str | None:
        (y, (d_h, dw)), (ay, (ax, _, aw)) = ours(), anchor()
        return close(y, ay[0], 1e-5) or close(d_h.to(torch.bfloat16), ax, 2e-2) or close(dw, aw, 1e-3)

    return Setup(ours=ours, anchor=anchor, bytes=(2 + 4 + 4 + 4) * TOKENS * HIDDEN + 4 * 4 * TOKENS * HIDDEN,
                 check=check, note="bytes: x (bf16), residual, h, y; dy, dh, h, d_total (fp32)")  # fmt: skip


def _swiglu(backward: bool) -> Callable[[], Setup]:
    def setup() -> Setup:
        import torch.nn.functional as F

        import xpuruntime as xrt

        gate, up, dy = (randn(TOKENS, INTER, dtype="bfloat16", scale=s) for s in (2.0, 1.0, 1.0))
        if not backward:
            ours = _ours(lambda: xrt.ops.swiglu(gate, up), ("swiglu",))
            return Setup(ours=ours, anchor=lambda: F.silu(gate) * up, bytes=3 * 2 * TOKENS * INTER,
                         check=lambda: close(ours(), F.silu(gate) * up, 1e-2))  # fmt: skip
        gr, ur = (t.clone().requires_grad_() for t in (gate, up))
        ours = _ours(lambda: (xrt.ops.swiglu(gate, up), xrt.ops.swiglu_backward(dy, gate, up)),
                     ("swiglu", "swiglu_backward"))  # fmt: skip
        return Setup(ours=ours, anchor=_autograd(lambda: F.silu(gr) * ur, [gr, ur], dy), bytes=8 * 2 * TOKENS * INTER,
                     note="bytes: gate, up, y (forward) + dy, gate, up, dgate, dup (backward)")  # fmt: skip

    return setup


def _rotate_half(x: Any) -> Any:
    import torch

    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotary() -> Setup:
    """apply_rotary_pos_emb on q (B, H, S, D) and k (B, H_kv, S, D), transposed views of the projections."""
    import xpuruntime as xrt

    seq = TOKENS // BATCH
    q = randn(BATCH, seq, HEADS, HEAD_DIM, dtype="bfloat16").transpose(1, 2)
    k = randn(BATCH, seq, KV_HEADS, HEAD_DIM, dtype="bfloat16").transpose(1, 2)
    cos, sin = randn(BATCH, seq, HEAD_DIM, dtype="bfloat16"), randn(BATCH, seq, HEAD_DIM, dtype="bfloat16")
    dq, dk = (
        randn(BATCH, HEADS, seq, HEAD_DIM, dtype="bfloat16"),
        randn(BATCH, KV_HEADS, seq, HEAD_DIM, dtype="bfloat16"),
    )
    qr, kr = (t.detach().clone().requires_grad_() for t in (q, k))

    def unfused() -> tuple:
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        return qr * c + _rotate_half(qr) * s, kr * c + _rotate_half(kr) * s

    def steps() -> Any:
        return xrt.ops.rotary_embedding(q, k, cos, sin), xrt.ops.rotary_embedding_backward(dq, dk, cos, sin)

    ours = _ours(steps, ("rotary_embedding", "rotary_embedding_backward"))
    anchor = _autograd(unfused, [qr, kr], (dq, dk))

    def check() -> str | None:
        ((q_out, _), (gq, gk)), ((aq, _), (aq_grad, ak_grad)) = ours(), anchor()
        return close(q_out, aq, 1e-2) or close(gq, aq_grad, 1e-2) or close(gk, ak_grad, 1e-2)

    elements = BATCH * seq * (HEADS + KV_HEADS) * HEAD_DIM
    return Setup(ours=ours, anchor=anchor, bytes=4 * 2 * elements, check=check,
                 note="bytes: q, k read and written, forward and backward (cos/sin from cache)")  # fmt: skip


def _linear_cross_entropy() -> Setup:
    """The LM head and the loss: logits never whole (ours) against F.linear + fp32 F.cross_entropy."""
    import torch
    import torch.nn.functional as F

    import xpuruntime as xrt

    hidden, weight = randn(TOKENS, HIDDEN, dtype="bfloat16"), randn(VOCAB, HIDDEN, dtype="bfloat16", scale=0.03)
    target = torch.randint(0, VOCAB, (TOKENS,), device="cuda")
    hr, wr = (t.clone().requires_grad_() for t in (hidden, weight))
    one = torch.ones((), device="cuda")

    def steps() -> Any:  # in-pass gradients, then what the autograd backward does: scale by the upstream 1
        loss, dh, dw, _ = xrt.ops.linear_cross_entropy_forward(hidden, weight, target)
        return loss, (dh.mul_(one), dw.mul_(one))

    ours = _ours(steps, ("linear_cross_entropy",))
    anchor = _autograd(lambda: F.cross_entropy(F.linear(hr, wr).float(), target), [hr, wr], one)

    def check() -> str | None:
        (loss, (dh, dw)), (aloss, (ah, aw)) = ours(), anchor()
        return close(loss, aloss, 1e-3) or close(dh, ah, 3e-2) or close(dw, aw, 3e-2)

    return Setup(ours=ours, anchor=anchor, flops=3 * 2 * TOKENS * HIDDEN * VOCAB, check=check,
                 note="flops: the three GEMMs (logits, grad_hidden, grad_weight)")  # fmt: skip


_LLAMA = "Llama-8L"
ROWS = [
    Row(f"rms_norm llama forward+backward {TOKENS}x{HIDDEN} fp32", "fused", _rms_norm, target=1.0,
        requires=needs_triton, anchor="LlamaRMSNorm's formula with autograd", doc=f"{_LLAMA}: casting='llama'"),
    Row(f"add_rms_norm forward+backward {TOKENS}x{HIDDEN} bf16+fp32", "fused", _add_rms_norm, target=1.0,
        requires=needs_triton, anchor="residual + hidden, then LlamaRMSNorm, with autograd",
        doc=f"{_LLAMA}: the residual add and the norm in one op"),
    Row(f"swiglu forward {TOKENS}x{INTER} bf16", "fused", _swiglu(False), target=1.0, requires=needs_triton,
        anchor="F.silu(gate) * up", doc=f"{_LLAMA}: LlamaMLP's activation"),
    Row(f"swiglu forward+backward {TOKENS}x{INTER} bf16", "fused", _swiglu(True), target=1.0,
        requires=needs_triton, anchor="F.silu(gate) * up with autograd", doc=f"{_LLAMA}: LlamaMLP's activation"),
    Row(f"rotary_embedding forward+backward B{BATCH} H{HEADS}/{KV_HEADS} S{TOKENS // BATCH} D{HEAD_DIM} bf16", "fused",
        _rotary, target=1.0, requires=needs_triton, anchor="apply_rotary_pos_emb with autograd",
        doc=f"{_LLAMA}: q and k in one launch each way"),
    Row(f"linear_cross_entropy forward+backward {TOKENS}x{HIDDEN} V{VOCAB} bf16", "fused", _linear_cross_entropy,
        target=1.0, units="TFLOP/s", requires=needs_triton, anchor="F.linear + F.cross_entropy (fp32) with autograd",
        doc=f"{_LLAMA}: LM head and loss in row chunks, gradients in the forward pass"),
]  # fmt: skip
