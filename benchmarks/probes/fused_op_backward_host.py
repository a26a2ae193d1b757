"""Where a fused op's eager backward spends host time on the GPU machine: the autograd engine's cost of a
Python node (a trivial autograd.Function beside), our EagerFunction.backward's own time, its body's, and whether
the dispatcher's C plan cache hits on the engine's thread (misses counted by the Python plan key).

    python benchmarks/probes/fused_op_backward_host.py [--calls 2000]
"""

from __future__ import annotations

import argparse
import threading
import time
from collections import defaultdict


class Double(__import__("torch").autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


def main() -> None:
    import torch

    from xpuruntime import arguments
    from xpuruntime.bench.hf_training import PATCH_POLICY
    from xpuruntime.policy import KernelPolicy
    from xpuruntime.pytorch.custom_ops import eager, glu
    from xpuruntime.pytorch.router import pin

    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    calls = parser.parse_args().calls
    pinned = pin(KernelPolicy.from_string(PATCH_POLICY))
    g = torch.randn(2, 8, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    u = torch.randn(2, 8, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(g)
    totals: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    threads: set = set()

    def timed(name: str, fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                totals[name] += time.perf_counter() - start
                counts[name] += 1
                if name == "EagerFunction.backward":
                    threads.add(threading.get_ident())

        return wrapper

    def run(label: str, step) -> None:
        for _ in range(50):
            step()
        torch.cuda.synchronize()
        totals.clear()
        counts.clear()
        start = time.perf_counter()
        for _ in range(calls):
            step()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / calls * 1e6
        inner = ", ".join(f"{k} {totals[k] / max(counts[k], 1) * 1e6:.1f} us x{counts[k] / calls:.0f}" for k in totals)
        print(f"{label:<34} {wall:7.1f} us per call; {inner}", flush=True)

    run("trivial Python autograd.Function", lambda: Double.apply(g).backward(dy))
    run("aten x*2 (C++ node)", lambda: (g * 2).backward(dy))
    eager.EagerFunction.backward = staticmethod(timed("EagerFunction.backward", eager.EagerFunction.backward))
    glu_backward = glu.backward
    glu.backward = timed("glu.backward body", glu_backward)
    arguments.plan_key = timed("python plan_key (C cache miss)", arguments.plan_key)
    run("swiglu fwd+bwd", lambda: glu.swiglu(g, u, pinned).backward(dy))
    print("backward threads:", len(threads), "main:", threading.get_ident() in threads)
    torch.autograd.set_multithreading_enabled(False)
    run("swiglu fwd+bwd, engine single-thread", lambda: glu.swiglu(g, u, pinned).backward(dy))
    torch.autograd.set_multithreading_enabled(True)
    start = time.perf_counter()
    for _ in range(calls):
        glu_backward(
            dy,
            g.detach(),
            u.detach(),
            "silu",
            __import__("xpuruntime.pytorch.router", fromlist=["x"]).pinned_policy(pinned.policy),
        )
    torch.cuda.synchronize()
    print(f"backward body on the main thread: {(time.perf_counter() - start) / calls * 1e6:.1f} us")


if __name__ == "__main__":
    main()
