"""Linear + cross-entropy forward + backward at Llama's (32000) and GPT-2's (50257) vocabulary, hidden 768 / 1024,
8192 rows, bf16: xtorch.ops.linear_cross_entropy (our chunked Triton op) against eager F.linear + F.cross_entropy
and the same compiled by inductor, CUDA-event time per call (median of 20 after warm-up), peak memory.
Run on a GPU machine from the repository root: `python benchmarks/probes/lce_vocab_timing.py`."""

from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F

import xpuruntime.pytorch as xtorch


def reference(hidden, weight, target):
    return F.cross_entropy(F.linear(hidden, weight).float(), target)


def ours(hidden, weight, target):
    return xtorch.ops.linear_cross_entropy(hidden, weight, target)


def timed(fn, hidden, weight, target) -> tuple[float, float]:
    def step():
        hidden.grad = weight.grad = None
        fn(hidden, weight, target).backward()

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), (torch.cuda.max_memory_allocated() - base) / 2**30


def main() -> None:
    compiled = torch.compile(reference)
    for vocab, width in ((32000, 1024), (50257, 768), (50304, 768)):
        torch.manual_seed(0)
        hidden = (torch.randn(8192, width, device="cuda") * 0.5).bfloat16().requires_grad_()
        weight = (torch.randn(vocab, width, device="cuda") * width**-0.5).bfloat16().requires_grad_()
        target = torch.randint(0, vocab, (8192,), device="cuda")
        for name, fn in (("eager", reference), ("compiled", compiled), ("ours", ours)):
            ms, gib = timed(fn, hidden, weight, target)
            print(f"vocab {vocab} hidden {width}: {name:9s} {ms:7.3f} ms  peak +{gib:.2f} GiB", flush=True)


if __name__ == "__main__":
    main()
