"""Where the host time of one attention forward+backward goes: PyTorch's SDPA-cuDNN with autograd against
the op-level `torch_cudnn` pair and the pair under `autotune` (where their last 2-6 % went).

For each path it prints the host µs per call (enqueue only, no sync), do_bench's median (L2 flushed
before each call, as `xpuruntime bench` times), the time per call of 20 back-to-back calls, and a cProfile
of the pair's host work, biggest self time first.

    python benchmarks/probes/attention_pair_host.py [--causal] [--dim 128] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats

import torch
import torch.nn.functional as F
from host_timing import host_us
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import xpuruntime as xrt
from xpuruntime.autotune import STORE


def back_to_back_ms(fn, calls: int = 20, rounds: int = 7) -> float:
    """Best device time per call of `calls` calls in a row (no flush: host latency overlaps the GPU)."""
    best = float("inf")
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / calls)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--causal", action="store_true")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--profile", action="store_true", help="cProfile the pair's host work")
    args = p.parse_args()
    shape = (4, 16, 2048, args.dim)
    q, k, v, do = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    causal = args.causal

    def sdpa() -> None:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
            torch.autograd.grad(out, leaves, do)

    def pair_under(policy: xrt.KernelPolicy):
        def run() -> None:
            with xrt.kernel_policy(policy):
                out, lse = xrt.ops.attention_forward(q, k, v, None, causal)
                xrt.ops.attention_backward(do, q, k, v, out, lse, None, causal)

        return run

    forced = xrt.KernelPolicy(attention_forward="torch_cudnn", attention_backward="torch_cudnn", strict=True)
    tuned = xrt.KernelPolicy(attention_forward="autotune", attention_backward="autotune")
    paths = {"sdpa_cudnn": sdpa, "torch_cudnn pair": pair_under(forced), "autotune pair": pair_under(tuned)}
    for fn in paths.values():
        fn()
    torch.cuda.synchronize()
    xrt.enable_dispatch_logging()
    paths["autotune pair"]()
    xrt.disable_dispatch_logging()
    chosen = [f"{r.op_name}={r.selected_kernel}" for r in xrt.get_dispatch_logs()]
    tuned = [{k: round(t, 1) for k, t in e["times_us"].items()} for e in STORE.memory.values()]
    print(f"autotune chose {chosen}; tuned µs {tuned}")
    print(f"B4 H16 S2048 D{args.dim} bf16{' causal' if causal else ''}")
    print(f"{'path':20s} {'host us':>9s} {'do_bench ms':>12s} {'back-to-back ms':>16s}")
    for _ in range(2):
        for name, fn in paths.items():
            bench = do_bench(fn, warmup=25, rep=200, return_mode="median")
            print(f"{name:20s} {host_us(fn):9.1f} {bench:12.4f} {back_to_back_ms(fn):16.4f}")
    if args.profile:
        profiler = cProfile.Profile()
        fn = paths["torch_cudnn pair"]
        profiler.enable()
        for _ in range(200):
            fn()
        profiler.disable()
        torch.cuda.synchronize()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
