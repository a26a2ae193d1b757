"""Where linear_cross_entropy's forward + backward spends its device time, kernel by kernel, beside inductor's
compiled F.linear + F.cross_entropy: the Llama head (8192 rows, vocabulary 32000, hidden 1024; `gpt2`: 50257,
768) under bf16 autocast from fp32, torch.profiler over 5 calls after warm-up.

    python benchmarks/probes/lce_kernels.py [gpt2]
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import xpuruntime.pytorch as xtorch


def reference(hidden, weight, target):
    return F.cross_entropy(F.linear(hidden, weight).float(), target)


def main() -> None:
    torch.manual_seed(0)
    vocab, width = (50257, 768) if sys.argv[1:] == ["gpt2"] else (32000, 1024)
    hidden = (torch.randn(8192, width, device="cuda") * 0.5).requires_grad_()
    weight = (torch.randn(vocab, width, device="cuda") * width**-0.5).requires_grad_()
    target = torch.randint(0, vocab, (8192,), device="cuda")
    for name, fn in (("ours", xtorch.ops.linear_cross_entropy), ("inductor", torch.compile(reference))):

        def step(fn=fn):
            hidden.grad = weight.grad = None
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = fn(hidden, weight, target)
            loss.backward()

        for _ in range(3):
            step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                step()
            torch.cuda.synchronize()
        events = [e for e in prof.key_averages() if e.self_device_time_total > 0]
        total = sum(e.self_device_time_total for e in events) / 5e3
        print(f"\n=== {name}: {total:.3f} ms of kernels per call")
        for e in sorted(events, key=lambda e: -e.self_device_time_total)[:14]:
            print(f"{e.self_device_time_total / 5e3:8.3f} ms  {e.count // 5:3d}x  {e.key[:110]}")


if __name__ == "__main__":
    main()
