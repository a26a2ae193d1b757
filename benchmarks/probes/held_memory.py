"""What a training step leaves allocated until the next one, and where it was allocated: one variant of
bench/hf_training (default: Llama patched with rms_norm only, which holds ~0.54 GiB more between steps than eager
in step_memory.py) stepped once, then a second step under PyTorch's allocator history; the blocks allocated in
that step and still alive after it (beyond the new gradients) are grouped by the Python stack that allocated them.
Also: whether a garbage collection frees them (a reference cycle) and whether they survive a third step.

    python benchmarks/probes/held_memory.py [--model llama] [--kinds rms_norm] [--top 8]
"""

from __future__ import annotations

import argparse
import collections
import gc


def main() -> None:
    import torch

    from xpuruntime.bench import hf_training as hf

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="llama")
    parser.add_argument("--kinds", default="rms_norm", help="patch kinds, comma-separated ('' = all)")
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args()
    state, ids = hf.initial_state(args.model)
    kinds = tuple(k for k in args.kinds.split(",") if k) or None
    v = hf.Variant("probe", policy=hf.EAGER_POLICY, patch=True, patch_policy=hf.PATCH_POLICY, kinds=kinds)
    hf.build(v, args.model, state, ids, hf.LigerSwitch())
    gib = 2**30
    with hf.running(v, None):
        v.step()
        torch.cuda.synchronize()
        after_one = torch.cuda.memory_allocated()
        torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="python")
        v.step()
        torch.cuda.synchronize()
        after_two = torch.cuda.memory_allocated()
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        gc.collect()
        freed_by_gc = after_two - torch.cuda.memory_allocated()
        v.step()
        torch.cuda.synchronize()
        after_three = torch.cuda.memory_allocated()
    grads = sum(p.grad.numel() * p.grad.element_size() for p in v.model.parameters() if p.grad is not None)
    print(f"allocated after step 1 {after_one / gib:.3f} GiB, step 2 {after_two / gib:.3f}, step 3 "
          f"{after_three / gib:.3f}; gradients {grads / gib:.3f}; a gc.collect() freed {freed_by_gc / gib:.3f}")  # fmt: skip
    by_stack: dict[tuple, list[int]] = collections.defaultdict(list)
    for segment in snapshot["segments"]:
        for block in segment["blocks"]:
            if block["state"] != "active_allocated" or not block.get("frames"):
                continue  # free, or allocated before the history started
            frames = [f"{f['filename'].rsplit('/', 2)[-1]}:{f['line']} {f['name']}" for f in block["frames"]
                      if f["filename"].endswith(".py")][: args.top]  # fmt: skip
            by_stack[tuple(frames)].append(block["size"])
    print("blocks allocated in step 2 and alive after it, by allocating Python stack (largest first):")
    for stack, sizes in sorted(by_stack.items(), key=lambda kv: -sum(kv[1]))[:12]:
        print(f"\n{sum(sizes) / gib:.3f} GiB in {len(sizes)} blocks (largest {max(sizes) / 2**20:.1f} MiB)")
        for frame in stack:
            print(f"    {frame}")


if __name__ == "__main__":
    main()
