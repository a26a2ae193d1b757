"""The example GPT's eager step per policy, interleaved: one model, and every round runs one warm-up
and one timed step under each policy in turn, so a host whose speed drifts (the H100 machine's varies
by up to 1.5x between runs) affects every policy alike. Reports the median step and the median host
time to enqueue it (a step is host-bound when the two are close).

    python benchmarks/probes/step_diagnose.py [--rounds 15] [POLICY ...]   (POLICY: none, autotune, or a=k,b=k;
        a=k,b=k/unfused-db: the same with fused_cast's dW and db from a GEMM and a sum, not one BGRADB GEMM)
    python benchmarks/probes/step_diagnose.py --profile [POLICY ...]   (per policy: where the host time goes,
        plan-cache misses per step, and the GPU's kernel time per step)
    python benchmarks/probes/step_diagnose.py --gpu-sleep 30 [POLICY ...]   (also time each step with 30 ms of GPU
        sleep queued first: a host that waits for the GPU anywhere in the step shows it in its host time)
    python benchmarks/probes/step_diagnose.py --model "--d-model 2048 --heads 16" [POLICY ...]   (another model size,
        in the example's own arguments)
    python benchmarks/probes/step_diagnose.py --gc [--gc-freeze] [POLICY ...]   (Python garbage collections per
        step and the host ms they take; --gc-freeze moves everything made during set-up out of the collector's
        reach first, as long-running training processes do)
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import importlib.util
import pstats
import shlex
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

import xpuruntime.pytorch as xtorch
from xpuruntime.pytorch import native as native_routes
from xpuruntime.pytorch import tuner as handback

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("train_gpt", ROOT / "examples" / "train_gpt.py")
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)

DEFAULT = ["none", "matmul=cublasLt", "attention=flash_v2", "layer_norm=triton",
           "matmul=cublasLt,attention=flash_v2", "autotune"]  # fmt: skip


UNFUSED_DB = "/unfused-db"


def policy_for(name: str):
    name = name.removesuffix(UNFUSED_DB)
    argv = ["--autotune"] if name == "autotune" else [] if name == "none" else ["--policy", name]
    return example.make_policy(example.parse_args(argv))


def use_policy(name: str, policy) -> None:
    """Make `policy` (named `name`) the process policy."""
    native_routes.fuse_bias_grad(not name.endswith(UNFUSED_DB))
    xtorch.set_kernel_policy(policy)


def gpt_step(model_args: str = "", old_loop: bool = False) -> Callable[[float], tuple[float, float]]:
    """The example GPT (its own arguments `model_args`) and one bf16 training step of it, as
    step(sleep_ms=0) -> (host ms to enqueue it, ms until the GPU finished it). The loop is the example's
    (gradients set to None, fused AdamW); `old_loop`: the example's earlier loop (gradients
    zeroed in place, the default foreach AdamW): 17.5 against 14.0 ms per step on the H100."""
    cfg = example.parse_args(shlex.split(model_args))
    torch.manual_seed(0)
    model = example.GPT(cfg.vocab, cfg.context, cfg.d_model, cfg.heads, cfg.layers).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=not old_loop or None)
    x, y = example.batch_for(0, cfg, 0, 1, "cuda")

    def step(sleep_ms: float = 0.0) -> tuple[float, float]:
        torch.cuda.synchronize()
        if sleep_ms:
            torch.cuda._sleep(int(sleep_ms * 1.98e6))  # cycles at the H100's ~1.98 GHz
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=not old_loop)
        with xtorch.autocast(dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x).float().view(-1, cfg.vocab), y.view(-1))
        loss.backward()
        opt.step()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        return (t1 - t0) * 1e3, (time.perf_counter() - t0) * 1e3

    return step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--profile", action="store_true", help="profile each policy's step instead of timing rounds")
    p.add_argument("--gpu-sleep", type=float, default=0.0, help="ms of GPU sleep queued before a second timed step")
    p.add_argument("--model", default="", help="the example's arguments for another model size")
    p.add_argument("--gc", action="store_true", help="report garbage collections per step and their host time")
    p.add_argument("--gc-freeze", action="store_true", help="gc.freeze() after set-up and warm-up")
    p.add_argument("--old-loop", action="store_true", help="zero grads in place, foreach AdamW (the earlier loop)")
    p.add_argument("policies", nargs="*", default=DEFAULT)
    args = p.parse_args()
    step = gpt_step(args.model, args.old_loop)

    policies = {name: policy_for(name) for name in args.policies}
    for name, policy in policies.items():  # tune and compile outside the timed rounds
        use_policy(name, policy)
        step(), step()
    if args.gc_freeze:
        gc.collect()
        gc.freeze()
    collections = GcTimer() if args.gc else None
    if args.profile:
        for name, policy in policies.items():
            use_policy(name, policy)
            profile_step(name, step)
        xtorch.clear_kernel_policy()
        return
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in policies}
    asleep: dict[str, list[tuple[float, float]]] = {name: [] for name in policies}
    for _ in range(args.rounds):
        for name, policy in policies.items():
            use_policy(name, policy)
            step()
            if collections:
                collections.start(name)
            samples[name].append(step())
            if collections:
                collections.stop()
            if args.gpu_sleep:
                asleep[name].append(step(args.gpu_sleep))
    xtorch.clear_kernel_policy()
    if args.gpu_sleep:
        print(f"host ms per step with {args.gpu_sleep:g} ms of GPU sleep queued first (median):")
        for name, rows in asleep.items():
            print(f"  {name:<38}{statistics.median(h for h, _ in rows):>9.2f}")
    base = statistics.median(t for _, t in samples[args.policies[0]])
    print(f"{'policy':<40}{'host ms':>9}{'step ms':>9}{'vs first':>10}")
    for name, rows in samples.items():
        host, total = statistics.median(h for h, _ in rows), statistics.median(t for _, t in rows)
        print(f"{name:<40}{host:>9.2f}{total:>9.2f}{base / total:>9.3f}x", flush=True)
    for family, why in xtorch.handed_back().items():
        print(f"autotune handed {family} back to PyTorch: {why}")
    for family, found in handback.verdicts().items():
        routed = [why for route, why in found if route]
        print(f"autotune {family}: {len(routed)} of {len(found)} signatures run our kernel", *routed, sep="\n  ")
    if native_routes.stats():
        print("native routes:", native_routes.stats())
    if collections:
        collections.report(args.rounds)


class GcTimer:
    """Counts the garbage collections (by generation) and their host time during the timed steps."""

    def __init__(self) -> None:
        self.policy: str | None = None
        self.began = 0.0
        self.counts: dict[str, list[int]] = {}
        self.ms: dict[str, float] = {}
        gc.callbacks.append(self._callback)

    def start(self, policy: str) -> None:
        self.policy = policy
        self.counts.setdefault(policy, [0, 0, 0])
        self.ms.setdefault(policy, 0.0)

    def stop(self) -> None:
        self.policy = None

    def _callback(self, phase: str, info: dict) -> None:
        if self.policy is None:
            return
        if phase == "start":
            self.began = time.perf_counter()
            return
        self.counts[self.policy][info["generation"]] += 1
        self.ms[self.policy] += (time.perf_counter() - self.began) * 1e3

    def report(self, steps: int) -> None:
        print(f"garbage collections per timed step (generations 0/1/2) and their host ms per step, {steps} steps:")
        for policy, counts in self.counts.items():
            per_step = "/".join(f"{c / steps:.2f}" for c in counts)
            print(f"  {policy:<38}{per_step:>16}{self.ms[policy] / steps:>9.3f} ms")
        print(f"Python threads: {[t.name for t in threading.enumerate()]}; tracked objects: {len(gc.get_objects())}")


def profile_step(name: str, step) -> None:
    """Host profile of 5 steps, plan-cache misses per step, and the GPU's kernel time per step."""
    import xpuruntime as xrt

    before = xrt.plan_cache().stats()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(5):
        step()
    profiler.disable()
    after = xrt.plan_cache().stats()
    print(
        f"\n=== {name}: plan cache per step: {(after.hits - before.hits) / 5:.0f} hits, "
        f"{(after.misses - before.misses) / 5:.1f} misses"
    )
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    pstats.Stats(profiler).sort_stats("cumtime").print_stats(40)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    total_us = sum(e.device_time for e in kernels) / 3
    print(f"{name}: GPU kernel time per step {total_us / 1e3:.2f} ms, {len(kernels) / 3:.0f} kernels")
    print(prof.key_averages().table(sort_by="device_time_total", row_limit=25))


if __name__ == "__main__":
    main()
