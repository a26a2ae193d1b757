"""Does capturing one variant's step in a CUDA graph slow another variant's eager step in the same process?
The GPT-2 bench read patched eager at 1.41x eager in a run without the patched+graph variant and 1.02-1.07x in
runs with it, while the profile probe (patched alone) read 1.46x. Here: patched eager timed, then patched+graph
built (captured), then patched eager timed again, then eager; and the replay store's state after each.

    python benchmarks/probes/graph_interplay.py [--model gpt2]
"""

from __future__ import annotations

import argparse
import collections
import gc
import statistics
import time

GC_MS: list[float] = []  # Python's garbage collections during timed steps: (start, duration) pairs summed


def _gc_timer(phase: str, info: dict) -> None:
    if phase == "start":
        GC_MS.append(-time.perf_counter())
    elif GC_MS and GC_MS[-1] < 0:
        GC_MS[-1] = (GC_MS[-1] + time.perf_counter()) * 1e3


def timed(v, steps: int = 12) -> str:
    """Median wall ms of a step, of its host enqueue (the step's Python returns before the GPU is done), and the
    garbage collector's time per step, with the count of live objects it tracks."""
    import torch

    v.step()
    walls, hosts = [], []
    GC_MS.clear()
    gc.callbacks.append(_gc_timer)
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        v.step()
        hosts.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t0) * 1e3)
    gc.callbacks.remove(_gc_timer)
    collected = sum(t for t in GC_MS if t > 0) / steps
    return (f"{statistics.median(walls):.2f} ms (host {statistics.median(hosts):.2f}; gc {collected:.2f} ms/step in "
            f"{len(GC_MS) / steps:.1f} collections, {len(gc.get_objects())} objects tracked)")  # fmt: skip


def tiny_capture() -> None:
    """A CUDA graph of one small op, captured with PyTorch alone."""
    import torch

    x = torch.randn(1024, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x.mul(2)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x.mul(2)
    graph.replay()
    torch.cuda.synchronize()
    del y


def replay_state() -> str:
    from xpuruntime.pytorch.state import STATE

    kinds = collections.Counter(
        type(r).__name__ if not isinstance(r, str) else r[:90] for r in STATE.replay.recipes.values()
    )
    return ", ".join(f"{k}: {n}" for k, n in kinds.items())


def main() -> None:

    from xpuruntime.bench import hf_training as hf

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="gpt2")
    args = parser.parse_args()
    state, ids = hf.initial_state(args.model)
    liger = hf.LigerSwitch()
    by = {v.name: v for v in hf.default_variants(args.model)}
    for name in ("eager", "patched"):
        hf.build(by[name], args.model, state, ids, liger)

    def both(when: str) -> None:
        for name in ("eager", "patched"):
            with hf.running(by[name], liger):
                print(f"{name} {when}: {timed(by[name])}", flush=True)

    both("before any capture")
    print("recipes:", replay_state())
    tiny_capture()
    both("after PyTorch captured one small op")
    hf.build(by["graph"], args.model, state, ids, liger)  # eager's step, captured by CUDAGraphWrapper
    print(f"graph: {timed(by['graph'])}")
    both("after the eager step's capture")
    hf.build(by["patched+graph"], args.model, state, ids, liger)
    with hf.running(by["patched+graph"], liger):
        print(f"patched+graph: {timed(by['patched+graph'])}", flush=True)
    both("after the patched step's capture")
    by["graph"].step = by["patched+graph"].step = None  # the replay closures hold the graphs
    gc.collect()
    both("with both graphs dropped")
    gc.freeze()  # what exists now is never scanned again
    both("after gc.freeze()")
    print("recipes:", replay_state())


if __name__ == "__main__":
    main()
