"""Host cost of routed aten calls on the GPU: eager PyTorch against the same calls under a policy.

The problems are small enough that the host, not the GPU, sets the pace, so `routed - eager` is what
the override, the dispatcher, the autograd Function and the kernel's own launch add per iteration.
Each figure is the best of interleaved rounds (µs per iteration); the kernels that ran are listed.

    python benchmarks/pytorch_host_cost_cuda.py [--rounds 5] [--calls 300] [--profile CASE]
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import pstats
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

import xpuruntime as xrt
import xpuruntime.pytorch as xtorch


def cases() -> dict[str, tuple[dict[str, str], Callable[[], object]]]:
    """case name -> (policy, one iteration)."""
    torch.manual_seed(0)
    dev, bf = "cuda", torch.bfloat16
    a, b = torch.randn(16, 16, device=dev), torch.randn(16, 16, device=dev)
    lin = torch.nn.Linear(768, 768, device=dev, dtype=bf)
    x_lin = torch.randn(2048, 768, device=dev, dtype=bf, requires_grad=True)
    ln = torch.nn.LayerNorm(768, device=dev, dtype=bf)
    x_ln = torch.randn(2048, 768, device=dev, dtype=bf, requires_grad=True)
    q, k, v = (torch.randn(1, 12, 256, 64, device=dev, dtype=bf, requires_grad=True) for _ in range(3))

    def linear_step() -> None:
        lin(x_lin).sum().backward()

    def layer_norm_step() -> None:
        ln(x_ln).sum().backward()

    def sdpa_step() -> None:
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()

    return {
        "mm 16x16 fp32 (torch kernel)": ({"matmul": "torch"}, lambda: torch.mm(a, b)),
        "linear fwd+bwd 2048x768x768 bf16": ({"matmul": "cublasLt"}, linear_step),
        "layer_norm fwd+bwd 2048x768 bf16": ({"layer_norm": "triton"}, layer_norm_step),
        "sdpa fwd+bwd 1x12x256x64 causal, flash_v2": ({"attention": "flash_v2"}, sdpa_step),
        "sdpa fwd+bwd 1x12x256x64 causal, torch_cudnn": ({"attention": "torch_cudnn"}, sdpa_step),
    }


def timed(fn: Callable[[], object], calls: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def measure(rounds: int, calls: int, only: str | None) -> None:
    print(f"torch {torch.__version__}, {rounds} rounds x {calls} calls, µs per iteration (best)")
    print(f"{'case':<46}{'eager':>9}{'routed':>9}{'added':>9}  kernels per iteration")
    for name, (prefs, fn) in cases().items():
        if only and only not in name:
            continue
        best = [float("inf"), float("inf")]
        for _ in range(rounds):
            for i, policy in enumerate((None, xrt.KernelPolicy(prefs))):
                xtorch.set_kernel_policy(policy)
                timed(fn, max(calls // 10, 3))  # warm-up: plans, compiles
                xrt.enable_dispatch_logging(max_records=100_000)
                best[i] = min(best[i], timed(fn, calls))
                ran = collections.Counter(f"{r.op_name}/{r.selected_kernel}" for r in xrt.get_dispatch_logs())
                xrt.disable_dispatch_logging()
        xtorch.clear_kernel_policy()
        kernels = ", ".join(f"{k} x{n / calls:g}" for k, n in sorted(ran.items()))
        print(f"{name:<46}{best[0]:>9.1f}{best[1]:>9.1f}{best[1] - best[0]:>9.1f}  {kernels}")


def profile(case: str, calls: int) -> None:
    name, (prefs, fn) = next((n, c) for n, c in cases().items() if case in n)
    xtorch.set_kernel_policy(xrt.KernelPolicy(prefs))
    timed(fn, 20)
    profiler = cProfile.Profile()
    profiler.enable()
    timed(fn, calls)
    profiler.disable()
    xtorch.clear_kernel_policy()
    print(f"== {name}, {calls} iterations")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--only", default=None, help="run the cases whose name contains this")
    p.add_argument("--profile", default=None, help="cProfile the routed case whose name contains this")
    args = p.parse_args()
    if args.profile:
        profile(args.profile, args.calls)
    else:
        measure(args.rounds, args.calls, args.only)


if __name__ == "__main__":
    main()
