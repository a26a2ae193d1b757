"""Host cost of routed aten calls on the GPU: eager PyTorch against the same calls under a policy.

Shapes are the example GPT's (batch 8, context 1024, d_model 768, 12 heads, bf16). Only the host is
timed: a round enqueues a few dozen iterations after a synchronize and stops the clock before the
GPU has caught up (the launch queue never fills), so `routed - eager` is what the override, the
dispatcher, the autograd Function and the kernel's own launch add per iteration on the host. Each
figure is the best of interleaved rounds (µs per iteration); the kernels that ran are listed.

    python benchmarks/probes/pytorch_host_cost_cuda.py [--rounds 5] [--calls 300] [--profile CASE]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
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
    lin = torch.nn.Linear(768, 2304, device=dev, dtype=bf)
    x_lin = torch.randn(8192, 768, device=dev, dtype=bf, requires_grad=True)
    ln = torch.nn.LayerNorm(768, device=dev, dtype=bf)
    x_ln = torch.randn(8192, 768, device=dev, dtype=bf, requires_grad=True)
    q, k, v = (torch.randn(8, 12, 1024, 64, device=dev, dtype=bf, requires_grad=True) for _ in range(3))

    # contiguous output gradients, as in a training step (`.sum().backward()` would give stride-0 ones)
    dy_lin, dy_ln, dy_sdpa = torch.randn_like(lin(x_lin)), torch.randn_like(x_ln), torch.randn_like(q)

    def linear_step() -> None:
        lin(x_lin).backward(dy_lin)

    def layer_norm_step() -> None:
        ln(x_ln).backward(dy_ln)

    def sdpa_step() -> None:
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(dy_sdpa)

    return {
        "mm 16x16 fp32 (torch kernel)": ({"matmul": "torch"}, lambda: torch.mm(a, b)),
        "linear fwd+bwd 8192x768x2304, cublasLt": ({"matmul": "cublasLt"}, linear_step),
        "linear fwd+bwd 8192x768x2304, torch": ({"matmul": "torch"}, linear_step),
        "layer_norm fwd+bwd 8192x768, triton": ({"layer_norm": "triton"}, layer_norm_step),
        "layer_norm fwd+bwd 8192x768, torch": ({"layer_norm": "torch"}, layer_norm_step),
        "sdpa fwd+bwd 8x12x1024x64 causal, flash_v2": ({"attention": "flash_v2"}, sdpa_step),
        "sdpa fwd+bwd 8x12x1024x64 causal, torch_cudnn": ({"attention": "torch_cudnn"}, sdpa_step),
    }


def timed(fn: Callable[[], object], calls: int) -> float:
    """Host µs per call (the clock stops before the GPU catches up)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


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
                timed(fn, 3)  # warm-up: plans, compiles
                xrt.clear_dispatch_logs()
                xrt.enable_dispatch_logging(max_records=100_000)
                best[i] = min(best[i], timed(fn, calls))
                xrt.disable_dispatch_logging()
            ran = collections.Counter(f"{r.op_name}/{r.selected_kernel}" for r in xrt.get_dispatch_logs())
        xtorch.clear_kernel_policy()
        kernels = ", ".join(f"{k} x{n / calls:g}" for k, n in sorted(ran.items()))
        print(f"{name:<46}{best[0]:>9.1f}{best[1]:>9.1f}{best[1] - best[0]:>9.1f}  {kernels}")


def profile(case: str, calls: int) -> None:
    name, (prefs, fn) = next((n, c) for n, c in cases().items() if case in n)
    xtorch.set_kernel_policy(xrt.KernelPolicy(prefs))
    timed(fn, 3)
    profiler = cProfile.Profile()
    for _ in range(10):
        profiler.enable()
        timed(fn, calls)
        profiler.disable()
    xtorch.clear_kernel_policy()
    print(f"== {name}, {10 * calls} iterations")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(30)


def layers(rounds: int, calls: int) -> None:
    """Host µs of one bf16 8192x2304 @ 2304x768 product, layer by layer: eager, eager into a given
    output, our dispatcher (no override), the aten override, a bare Python override."""
    a = torch.randn(8192, 2304, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2304, 768, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(8192, 768, device="cuda", dtype=torch.bfloat16)
    w, bias = b.t().contiguous(), torch.randn(768, device="cuda", dtype=torch.bfloat16)
    steps: dict[str, Callable[[], object]] = {
        "F.linear(a, w, bias)": lambda: F.linear(a, w, bias),
        "F.linear under the override (matmul=torch)": lambda: F.linear(a, w, bias),
        "F.linear under the override (matmul=cublasLt)": lambda: F.linear(a, w, bias),
        "torch.mm(a, b)": lambda: torch.mm(a, b),
        "torch.mm(a, b, out=out)": lambda: torch.mm(a, b, out=out),
        "torch.empty + torch.mm(out=)": lambda: torch.mm(a, b, out=torch.empty_like(out)),
        "xrt.ops.matmul (matmul=torch)": lambda: xrt.ops.matmul(a, b),
        "xrt.ops.matmul (matmul=cublasLt)": lambda: xrt.ops.matmul(a, b),
        "torch.mm under the override (matmul=torch)": lambda: torch.mm(a, b),
        "torch.mm under the override (matmul=cublasLt)": lambda: torch.mm(a, b),
    }
    best = dict.fromkeys(steps, float("inf"))
    for _ in range(rounds):
        for name, fn in steps.items():
            kernel = "cublasLt" if "cublasLt" in name else "torch"
            if "override" in name:
                xtorch.set_kernel_policy(xrt.KernelPolicy({"matmul": kernel}))
            scope = xrt.kernel_policy(matmul=kernel) if "xrt.ops" in name else contextlib.nullcontext()
            with scope:
                timed(fn, 3)
                best[name] = min(best[name], timed(fn, calls))
            xtorch.clear_kernel_policy()
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("mm", lambda x, y: torch.mm(x, y, out=x.new_empty((x.shape[0], y.shape[1]))), "CUDA")
    bare = min(timed(lambda: torch.mm(a, b), calls) for _ in range(rounds))
    lib._destroy()
    for name, us in [*best.items(), ("torch.mm under a bare Python override", bare)]:
        print(f"{name:<48}{us:>9.1f} µs")
    backward_layers(rounds)


def backward_layers(rounds: int, calls: int = 10) -> None:
    """Host µs of `loss.backward()` alone for y = x @ w (two mm calls in backward): eager, under the
    override (matmul=torch), and under a bare Python override of aten::mm."""
    x = torch.randn(8192, 2304, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(2304, 768, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def backward_host_us() -> float:
        losses = [(x @ w).sum() for _ in range(calls)]
        torch.cuda.synchronize()
        start = time.perf_counter()
        for loss in losses:
            loss.backward()
        elapsed = time.perf_counter() - start
        torch.cuda.synchronize()
        return elapsed / calls * 1e6

    def bare() -> float:
        lib = torch.library.Library("aten", "IMPL")
        lib.impl("mm", lambda p, q: torch.mm(p, q, out=p.new_empty((p.shape[0], q.shape[1]))), "CUDA")
        try:
            return backward_host_us()
        finally:
            lib._destroy()

    def routed() -> float:
        xtorch.set_kernel_policy(xrt.KernelPolicy({"matmul": "torch"}))
        try:
            return backward_host_us()
        finally:
            xtorch.clear_kernel_policy()

    def single_thread(fn: Callable[[], float]) -> Callable[[], float]:
        def run() -> float:
            with torch.autograd.set_multithreading_enabled(False):
                return fn()

        return run

    variants = {
        "eager": backward_host_us,
        "override (matmul=torch)": routed,
        "bare Python override": bare,
        "eager, engine on this thread": single_thread(backward_host_us),
        "override, engine on this thread": single_thread(routed),
        "bare, engine on this thread": single_thread(bare),
    }
    best = dict.fromkeys(variants, float("inf"))
    for _ in range(rounds):
        for name, fn in variants.items():
            best[name] = min(best[name], fn())
    for name, us in best.items():
        print(f"backward of x @ w, {name:<30}{us:>9.1f} µs")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=30, help="iterations per round (few: the launch queue must not fill)")
    p.add_argument("--only", default=None, help="run the cases whose name contains this")
    p.add_argument("--profile", default=None, help="cProfile the routed case whose name contains this")
    p.add_argument("--layers", action="store_true", help="host cost of one matmul, layer by layer")
    args = p.parse_args()
    if args.layers:
        layers(args.rounds, args.calls)
    elif args.profile:
        profile(args.profile, args.calls)
    else:
        measure(args.rounds, args.calls, args.only)


if __name__ == "__main__":
    main()
