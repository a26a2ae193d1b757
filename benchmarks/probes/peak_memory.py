"""What is alive at a training step's peak, by allocating Python stack: one variant of bench/hf_training
(default: Llama patched, then Liger-Kernel's) stepped once, then a second step under PyTorch's allocator history;
the history's alloc/free events are replayed to find the moment of the step's highest allocated memory, and the
blocks alive then (allocated during the step) are grouped by the innermost frames that allocated them.

    python benchmarks/probes/peak_memory.py [--variants patched,liger] [--frames 4]
"""

from __future__ import annotations

import argparse
import collections


def alive_at_peak(snapshot: dict) -> tuple[int, dict]:
    """(peak bytes above the history's start, {address: (size, frames)} alive then) from the device trace."""
    alive: dict[int, tuple[int, list]] = {}
    total = peak = 0
    at_peak: dict[int, tuple[int, list]] = {}
    for event in snapshot["device_traces"][0]:
        if event["action"] == "alloc":
            alive[event["addr"]] = (event["size"], event.get("frames", []))
            total += event["size"]
        elif event["action"] == "free_requested" and event["addr"] in alive:
            total -= alive.pop(event["addr"])[0]
        if total > peak:
            peak, at_peak = total, dict(alive)
    return peak, at_peak


def main() -> None:
    import torch

    from xpuruntime.bench import hf_training as hf

    parser = argparse.ArgumentParser()
    parser.add_argument("--variants", default="patched,liger")
    parser.add_argument("--frames", type=int, default=4)
    args = parser.parse_args()
    state, ids = hf.initial_state("llama")
    liger = hf.LigerSwitch()
    by = {v.name: v for v in hf.default_variants("llama")}
    for name in args.variants.split(","):
        v = by[name]
        hf.build(v, "llama", state, ids, liger)
        with hf.running(v, liger):
            v.step()
            torch.cuda.synchronize()
            torch.cuda.memory._record_memory_history(max_entries=400_000, stacks="python")
            v.step()
            torch.cuda.synchronize()
            snapshot = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
        peak, alive = alive_at_peak(snapshot)
        groups: dict[tuple, list[int]] = collections.defaultdict(list)
        for size, frames in alive.values():
            mine = [f"{f['filename'].rsplit('/', 2)[-1]}:{f['line']} {f['name']}" for f in frames
                    if f["filename"].endswith(".py") and "/torch/" not in f["filename"]][: args.frames]  # fmt: skip
            groups[tuple(mine)].append(size)
        print(f"\n=== {name}: peak {peak / 2**30:.3f} GiB above the step's start; alive then, by stack:")
        for stack, sizes in sorted(groups.items(), key=lambda kv: -sum(kv[1]))[:16]:
            print(f"{sum(sizes) / 2**20:9.1f} MiB in {len(sizes):4d} blocks  {' <- '.join(stack)}")
        v.model = v.opt = v.step = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
