"""The pieces of linear_cross_entropy's chunk at an odd vocabulary (GPT-2's 50257) and an aligned one (Llama's
32000), one 1024-row bf16 chunk, on the GPU: the row kernel at several (one-pass or loop, block, warps)
settings, and the weight-gradient GEMM (dz.T @ hidden added into an fp32 sum) over the true vocabulary, the
vocabulary split into a multiple of 64 plus its tail, and the padded vocabulary. The row kernel reads the padded
row (its loads masked by the padded width since the change that added this probe; by the vocabulary before). Device times from
triton.testing.do_bench (median of its repetitions).

    python benchmarks/probes/lce_head_tuning.py
"""

from __future__ import annotations

import torch
from triton.testing import do_bench

from xpuruntime.backends.triton.cross_entropy import _ce_rows_kernel

ROWS, HIDDEN = 1024, 768
SETTINGS = [(True, 32768, 16), (True, 32768, 32), (True, 65536, 16), (True, 65536, 32), (False, 8192, 8), (False, 16384, 16), (False, 32768, 16),
            (False, 32768, 32), (False, 4096, 4)]  # fmt: skip


def rows_kernel(z: torch.Tensor, vocab: int, target: torch.Tensor, losses: torch.Tensor, scale: torch.Tensor,
                one_pass: bool, block: int, warps: int) -> None:  # fmt: skip
    _ce_rows_kernel[(z.shape[0],)](z, target, losses, scale, vocab, z.shape[1], z.stride(0), 0, -100, 0.0, 0.0, HAS_LOSS=True,
                                   HAS_GRAD=True, ONE_PASS=one_pass, BLOCK_V=block, num_warps=warps)  # fmt: skip


def probe(vocab: int) -> None:
    padded = vocab + (-vocab % 64)
    buffer = torch.randn(ROWS, padded, device="cuda", dtype=torch.bfloat16)
    z = buffer[:, :vocab]
    target = torch.randint(0, vocab, (ROWS,), device="cuda")
    losses = torch.empty(ROWS, device="cuda")
    scale = torch.full((), 1.0 / 8192, device="cuda")
    gbytes = 2 * ROWS * vocab * 2 / 1e9
    for one_pass, block, warps in SETTINGS:
        if one_pass and block < vocab:
            continue
        fresh = buffer.clone()

        def call(one_pass=one_pass, block=block, warps=warps, fresh=fresh) -> None:
            rows_kernel(fresh, vocab, target, losses, scale, one_pass, block, warps)

        ms = do_bench(call, warmup=50, rep=300)
        print(f"V {vocab} rows kernel one_pass={one_pass!s:5} block {block:5} warps {warps:2}: {ms * 1e3:7.1f} us"
              f"  {gbytes / ms * 1e3:6.0f} GB/s (one read, one write)")  # fmt: skip
    hidden = torch.randn(ROWS, HIDDEN, device="cuda", dtype=torch.bfloat16)
    acc = torch.zeros(padded, HIDDEN, device="cuda")
    aligned = vocab - vocab % 64

    def true_vocab() -> None:
        torch.addmm(acc[:vocab], z.t(), hidden, out_dtype=torch.float32, out=acc[:vocab])

    def split() -> None:
        torch.addmm(acc[:aligned], z[:, :aligned].t(), hidden, out_dtype=torch.float32, out=acc[:aligned])
        if aligned < vocab:
            tail = acc[aligned:vocab]
            torch.addmm(tail, z[:, aligned:].t(), hidden, out_dtype=torch.float32, out=tail)

    def padded_vocab() -> None:
        torch.addmm(acc, buffer.t(), hidden, out_dtype=torch.float32, out=acc)

    weight = torch.randn(padded, HIDDEN, device="cuda", dtype=torch.bfloat16)

    def logits() -> None:
        torch.mm(hidden, weight.t(), out=buffer)

    grad_rows = torch.empty(ROWS, HIDDEN, device="cuda", dtype=torch.bfloat16)

    def grad_hidden() -> None:
        torch.mm(buffer, weight, out=grad_rows)

    for name, fn in (("dW true vocab", true_vocab), ("dW aligned + tail", split), ("dW padded", padded_vocab),
                     ("logits GEMM (padded)", logits), ("dX GEMM (padded)", grad_hidden)):  # fmt: skip
        print(f"V {vocab} {name:22}: {do_bench(fn, warmup=50, rep=300) * 1e3:7.1f} us")


def main() -> None:
    torch.manual_seed(0)
    for vocab in (32000, 50257):
        probe(vocab)


if __name__ == "__main__":
    main()
