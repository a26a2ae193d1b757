"""Linear + cross-entropy forward + backward at Llama's (32000) and GPT-2's (50257) vocabulary, hidden 768 / 1024,
8192 rows, bf16 and under autocast from fp32: xtorch.ops.linear_cross_entropy (our chunked Triton op) against eager F.linear + F.cross_entropy
and the same compiled by inductor, CUDA-event time per call (median of 20 after warm-up), peak memory.
Run on a GPU machine from the repository root: `python benchmarks/probes/lce_vocab_timing.py`."""

from __future__ import annotations

import itertools
import os
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


def autocast(fn):
    """fn under bf16 autocast: the model's case, an fp32 master weight and fp32 hidden states."""

    def run(hidden, weight, target):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return fn(hidden, weight, target)

    return run


def main() -> None:
    """Each shape in bf16, then under autocast with fp32 tensors; ours at each logits-chunk budget (MiB) in
    XPURUNTIME_LCE_CHUNKS (default: the module's)."""
    from xpuruntime.backends.triton import cross_entropy
    from xpuruntime.pytorch.router import get_dispatcher

    compiled = torch.compile(reference)
    chunks = [int(c) << 20 for c in os.environ.get("XPURUNTIME_LCE_CHUNKS", "").split(",") if c]
    chunks = chunks or [cross_entropy.LOGITS_CHUNK_BYTES]
    for (vocab, width), dtype in itertools.product(((32000, 1024), (50257, 768)), (torch.bfloat16, torch.float32)):
        torch.manual_seed(0)
        hidden = (torch.randn(8192, width, device="cuda") * 0.5).to(dtype).requires_grad_()
        weight = (torch.randn(vocab, width, device="cuda") * width**-0.5).to(dtype).requires_grad_()
        target = torch.randint(0, vocab, (8192,), device="cuda")
        wrap = autocast if dtype == torch.float32 else (lambda fn: fn)
        label = f"vocab {vocab} hidden {width} {'autocast fp32' if dtype == torch.float32 else 'bf16'}"
        runs = [("eager", reference, None), ("compiled", compiled, None)]
        runs += [(f"ours {c >> 20} MiB", ours, c) for c in chunks]
        for name, fn, chunk in runs:
            if chunk:
                cross_entropy.LOGITS_CHUNK_BYTES = chunk
                get_dispatcher().plans.invalidate()  # the chunk is part of the plan's launch config
            ms, gib = timed(wrap(fn), hidden, weight, target)
            print(f"{label}: {name:12s} {ms:7.3f} ms  peak +{gib:.2f} GiB", flush=True)


if __name__ == "__main__":
    main()
