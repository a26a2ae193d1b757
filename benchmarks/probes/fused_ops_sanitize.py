"""Small cases of every fused transformer-training kernel, forward and backward, through every code path
(one-pass and looped rows, residual adds, packed / separate GLU halves, rotary layouts with position ids and
partial dims, cross-entropy in one and several chunks, one-pass and looped vocabularies), for compute-sanitizer
on the GPU machine:

    compute-sanitizer --tool memcheck python3 benchmarks/probes/fused_ops_sanitize.py
    compute-sanitizer --tool racecheck python3 benchmarks/probes/fused_ops_sanitize.py
"""

from __future__ import annotations

import torch

import xpuruntime as xrt
from xpuruntime.backends.triton import cross_entropy

OPS = ("rms_norm", "rms_norm_backward", "add_rms_norm", "add_rms_norm_backward", "add_layer_norm",
       "add_layer_norm_backward", "swiglu", "swiglu_backward", "geglu", "geglu_backward", "rotary_embedding",
       "rotary_embedding_backward", "linear_cross_entropy", "linear_cross_entropy_backward")  # fmt: skip


def main() -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    r = lambda *s, dt=torch.bfloat16: torch.randn(*s, device="cuda", generator=g).to(dt)  # noqa: E731
    with xrt.kernel_policy(strict=True, **{op: "triton" for op in OPS}):
        for n in (1000, 20001):  # one-pass and looped rows
            x, res, w = r(37, n), r(37, n, dt=torch.float32), r(n, dt=torch.float32)
            xrt.ops.rms_norm(x, n, w.bfloat16(), 1e-6, casting="llama")
            xrt.ops.rms_norm_backward(x, x, n, w.bfloat16(), 1e-6, offset=1.0)
            y, h = xrt.ops.add_rms_norm(x, res, w, 1e-6, casting="llama")
            xrt.ops.add_rms_norm_backward(y, h, h, w, 1e-6)
            y, h = xrt.ops.add_layer_norm(x[:, : n - 3], res[:, : n - 3], w[: n - 3], w[: n - 3])  # strided rows
            xrt.ops.add_layer_norm_backward(y, None, h, w[: n - 3])
        gate_up, dy = r(67, 2 * 701), r(67, 701)
        for kind in ("silu", "none", "tanh"):
            fwd = xrt.ops.swiglu if kind == "silu" else (lambda a, b=None, k=kind: xrt.ops.geglu(a, b, k))
            bwd = xrt.ops.swiglu_backward if kind == "silu" else (lambda d, a, b=None, k=kind: xrt.ops.geglu_backward(
                d, a, b, k))  # fmt: skip
            fwd(gate_up), fwd(gate_up[:, :701], gate_up[:, 701:])
            bwd(dy, gate_up), bwd(dy, gate_up[:, :701], gate_up[:, 701:])
        q, k = r(2, 9, 6, 64).transpose(1, 2), r(2, 9, 2, 64).transpose(1, 2)
        cos, sin = r(2, 9, 64), r(2, 9, 64)
        for args in ((cos, sin), (cos[..., :32], sin[..., :32])):
            xrt.ops.rotary_embedding(q, k, *args)
            xrt.ops.rotary_embedding_backward(q.contiguous(), k.contiguous(), *args, interleaved=True)
        table = r(40, 64, dt=torch.float32)
        positions = torch.randint(-2, 42, (2, 9), device="cuda")  # some out of range: NaN rows, no access
        xrt.ops.rotary_embedding(q.transpose(1, 2), k.transpose(1, 2), table, table, positions, 2)
        for vocab, chunk_bytes in ((1003, None), (40_001, None), (1003, 4 * 1003 * 2)):
            if chunk_bytes:
                cross_entropy.LOGITS_CHUNK_BYTES = chunk_bytes
            hidden, weight, bias = r(37, 64), r(vocab, 64), r(vocab)
            target = torch.randint(-1, vocab, (37,), device="cuda")
            target[::5] = -100
            xrt.ops.linear_cross_entropy_forward(hidden, weight, target, bias, label_smoothing=0.1, z_loss_scale=1e-4)
            xrt.ops.linear_cross_entropy_backward(r(37, dt=torch.float32), hidden, weight, target, bias,
                                                  reduction="none")  # fmt: skip
    torch.cuda.synchronize()
    print("sanitize cases done")


if __name__ == "__main__":
    main()
