"""Does a policy leave host cost behind once it is gone? The example GPT's eager step (no policy), timed in one
process before any policy, then again after each POLICY has run some steps and was cleared (autotune: handed
back), with what could carry the cost: installed overrides, live Python objects, GC passes, allocator segments.

    python benchmarks/probes/residual_step_cost.py [--steps 30] [--logging] [--profile] POLICY ...

POLICY: autotune, a=k,b=k, or `busy` (a control without xpuruntime: 20 s of large GEMMs and small ops, as
much GPU and host work as autotune's tuning). --profile adds a host profile of 5 steps to each phase (Python function calls
per step, top functions by own time), the policy's own phase taken after its steps with the policy still set.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import statistics
import subprocess
import time

import torch
from step_diagnose import gpt_step, policy_for

import xpuruntime as xrt
import xpuruntime.pytorch as xtorch


class GcPasses:
    def __init__(self) -> None:
        self.count, self.ms, self._t0 = 0, 0.0, 0.0
        gc.callbacks.append(self._on)

    def _on(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.count += 1
            self.ms += (time.perf_counter() - self._t0) * 1e3


def keep_busy(seconds: float) -> None:
    """Large bf16 GEMMs and tiny ops for `seconds`, nothing of xpuruntime's."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    small = torch.randn(64, device="cuda")
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(5):
            a @ a
        for _ in range(200):
            small = small.sin()
        torch.cuda.synchronize()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--logging", action="store_true", help="dispatch logging on, as the example has it")
    p.add_argument("--profile", action="store_true", help="host profile of 5 steps per phase")
    p.add_argument("--gpu", action="store_true", help="GPU kernel time per step and the GPU's clocks per phase")
    p.add_argument("policies", nargs="+")
    args = p.parse_args()
    timed_step = gpt_step()
    if args.logging:
        xrt.enable_dispatch_logging(max_records=1_000_000)
    passes = GcPasses()

    def step() -> float:
        return timed_step()[1]

    def eager_phase(name: str) -> None:
        for _ in range(3):
            step()
        count, ms = passes.count, passes.ms
        times = [step() for _ in range(args.steps)]
        segments = torch.cuda.memory_stats().get("segment.all.current", 0)
        print(f"{name:<34} eager step {statistics.median(times):7.2f} ms   overrides {sorted(xtorch.installed_overrides())}"
              f"   live objects {len(gc.get_objects()):>8}   gc passes {passes.count - count} ({passes.ms - ms:.1f} ms)"
              f"   allocator segments {segments}", flush=True)  # fmt: skip

    def gpu_state(name: str) -> None:
        if not args.gpu:
            return
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                step()
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        query = "clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active"
        smi = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True, text=True
        )
        print(f"  {name}: GPU kernel time {sum(e.device_time for e in kernels) / 3e3:.2f} ms per step, "
              f"{len(kernels) / 3:.0f} kernels; {query}: {smi.stdout.strip()}", flush=True)  # fmt: skip

    def profile(name: str) -> None:
        gpu_state(name)
        if not args.profile:
            return
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(5):
            step()
        profiler.disable()
        stats = pstats.Stats(profiler)
        print(f"  {name}: {stats.total_calls / 5:.0f} Python function calls per step; top by own time:")
        stats.sort_stats("tottime").print_stats(12)

    eager_phase("before any policy")
    profile("before any policy")
    for name in args.policies:
        if name == "busy":
            keep_busy(20.0)
            eager_phase("after busy")
            continue
        xtorch.set_kernel_policy(policy_for(name))
        policy_times = [step() for _ in range(args.steps)]
        print(
            f"{name:<34} its own step {statistics.median(policy_times):7.2f} ms   handed back {sorted(xtorch.handed_back())}"
        )
        profile(name)
        xtorch.clear_kernel_policy()
        eager_phase(f"after {name}")
        gpu_state(f"after {name}")
    eager_phase("again")
    gpu_state("again")


if __name__ == "__main__":
    main()
