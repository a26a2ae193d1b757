"""What a zoo GPU row launches: per run of our InferenceSession (CUDA graph replay) and of
torch.compile(mode="reduce-overhead"), the GPU kernels (count and device time, torch.profiler), the kernels that
take most, and our plan's steps with the kernel each runs (or why it runs PyTorch's functions).

    python benchmarks/probes/zoo_gpu_kernels.py MODEL DTYPE [BATCH] [SEQ]   (e.g. gpt2 float16 1 128)
"""

from __future__ import annotations

import collections
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from xpuruntime.bench import zoo

RUNS = 20


def _kernels(fn) -> tuple[collections.Counter, dict[str, float]]:
    """Kernel launches and device microseconds per run, by kernel name."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(RUNS):
            fn()
        torch.cuda.synchronize()
    counts: collections.Counter = collections.Counter()
    micros: dict[str, float] = collections.defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            counts[event.name[:90]] += 1
            micros[event.name[:90]] += event.device_time / RUNS
    return counts, micros


def _report(who: str, counts: collections.Counter, micros: dict[str, float]) -> None:
    total = sum(counts.values()) / RUNS
    print(f"\n== {who}: {total:.0f} kernels a run, {sum(micros.values()):.1f} us of device time a run")
    for name, us in sorted(micros.items(), key=lambda kv: -kv[1])[:25]:
        print(f"  {counts[name] / RUNS:5.1f} x {us / (counts[name] / RUNS):7.2f} us  {name}")


def main() -> None:
    name, dtype = sys.argv[1:3]
    batch = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    seq = int(sys.argv[4]) if len(sys.argv) > 4 else (128 if zoo.ZOO[name].kind == "text" else None)
    bundle = zoo._bundle(name, dtype)
    feed = {
        k: torch.from_numpy(v).cuda().to(getattr(torch, dtype) if v.dtype.kind == "f" else torch.int64)
        for k, v in zoo._feed(name, batch, seq).items()
    }
    args = [feed[k] for k in zoo.ZOO[name].inputs]

    def anchor():
        with torch.no_grad():
            return bundle.compiled(*args)

    ours = lambda: bundle.session.run(None, feed)  # noqa: E731
    _report(f"ours {name} {dtype} B{batch} S{seq}", *_kernels(ours))
    _report(f"torch.compile reduce-overhead {name} {dtype} B{batch} S{seq}", *_kernels(anchor))
    print("\n== our plan's steps (kernel or PyTorch function):")
    kinds = collections.Counter(step.describe()[:150] for step in bundle.session.runner.last_plan().steps)
    for what, n in kinds.most_common():
        print(f"  {n:3d} x {what}")


if __name__ == "__main__":
    main()
