"""Does the memory layout of q, k, v change what PyTorch's SDPA (cuDNN's kernel on Hopper) keeps and costs?
Hugging Face's q, k, v are (B, H, S, D) views of (B, S, H, D) memory (a transposed projection output); an
elementwise rotation in eager PyTorch keeps that layout, Liger-Kernel rotates in place, and our rotary_embedding
returned (B, H, S, D)-contiguous tensors. Per layout mix: SDPA forward + backward time (CUDA events) and what the
forward keeps for the backward (memory allocated after it, beyond its inputs), at the bench's Llama shapes.

    python benchmarks/probes/sdpa_layouts.py
"""

from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F

B, S, H, KV, D = 8, 1024, 16, 4, 64


def projected(heads: int) -> torch.Tensor:
    """A (B, H, S, D) view of (B, S, H, D) memory, as HF's q/k/v after `.view(...).transpose(1, 2)`."""
    return torch.randn(B, S, heads, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()


def run(layouts: str, gqa: bool) -> str:
    q, k, v = projected(H), projected(KV), projected(KV)
    q2, k2, v2 = (t.contiguous() if flag == "c" else t * 1 for t, flag in zip((q, k, v), layouts))
    if not gqa:
        k2, v2 = (t.repeat_interleave(H // KV, dim=1) for t in (k2, v2))
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    out = F.scaled_dot_product_attention(q2, k2, v2, is_causal=True, enable_gqa=gqa)
    torch.cuda.synchronize()
    kept = torch.cuda.memory_allocated() - before - out.numel() * out.element_size()
    grad = torch.randn_like(out)
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        o = F.scaled_dot_product_attention(q2, k2, v2, is_causal=True, enable_gqa=gqa)
        torch.autograd.grad(o, (q2, k2, v2), grad)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    strides = "/".join(str(tuple(t.stride())) for t in (q2, k2, v2))
    return (f"q,k,v {layouts} gqa={gqa}: fwd+bwd {statistics.median(times[2:]):.3f} ms, forward keeps "
            f"{kept / 2**20:.1f} MiB beyond its output; strides {strides}")  # fmt: skip


def main() -> None:
    for gqa in (True, False):
        for layouts in ("vvv", "ccv", "ccc"):  # v: HF's transposed view (eager's layout), c: (B, H, S, D)-contiguous
            print(run(layouts, gqa), flush=True)


if __name__ == "__main__":
    main()
