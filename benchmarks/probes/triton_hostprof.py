"""Host-side profile (cProfile) of Triton-kernel dispatches on the GPU: where a call's host time goes.

PYTHONPATH=src python benchmarks/probes/triton_hostprof.py
"""

from __future__ import annotations

import cProfile
import pstats
import time

import torch

import xpuruntime as xrt


def main() -> None:
    m, n = 8192, 4096
    x, dy = (torch.randn(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    w, b = (torch.randn(n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    policy = xrt.KernelPolicy(layer_norm="triton", layer_norm_backward="triton", strict=True)
    calls = {
        "layer_norm": lambda: xrt.ops.layer_norm(x, n, w, b),
        "layer_norm_backward": lambda: xrt.ops.layer_norm_backward(dy, x, n, w),
    }
    with xrt.kernel_policy(policy):
        for name, call in calls.items():
            for _ in range(3):
                call()
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(20):
                call()
            host = (time.perf_counter() - start) / 20
            torch.cuda.synchronize()
            print(f"{name}: host {host * 1e6:.1f} us/call", flush=True)
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(20):
            calls["layer_norm_backward"]()
        profiler.disable()
    torch.cuda.synchronize()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
