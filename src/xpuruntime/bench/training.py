"""Training benchmarks and GPU checks for xpuruntime.pytorch (not runner rows: each configuration
installs or removes process-wide aten overrides, so ours and the anchor cannot alternate per call).

    python -m xpuruntime.bench.training --out DIR [--steps 50]

1. Override cost: the host time of a tiny CUDA matmul through the aten override (policy matmul=torch,
   so the same cuBLAS kernel runs) against eager, and against a bare Python override, in interleaved rounds.
2. The GPT example (examples/train_gpt.py, default size) without a policy and with
   matmul=cublasLt,attention=flash_v2: per-step losses compared, kernels in forward and backward.
3. A preference that cannot run (flash_v2 on float32): one warning and the same losses; strict raises.
4. The captured CUDA-graph step against eager with the policy.
5. Step times side by side: no policy, policy, autotune, captured graph (with and without policy).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time
import warnings
from pathlib import Path
from typing import Any

ROWS: list = []  # see the module docstring
POLICY = "matmul=cublasLt,attention=flash_v2"
SMALL = ["--layers", "2", "--d-model", "256", "--heads", "4", "--context", "256", "--batch", "4"]


def _example(root: Path) -> Any:
    spec = importlib.util.spec_from_file_location("train_gpt", root / "examples" / "train_gpt.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def host_us(fn: Any, calls: int = 100, rounds: int = 60) -> float:
    """Best-of-rounds host µs per call: each round starts from an idle GPU and stops the clock before the
    GPU catches up, so the launch queue never fills and the figure is host time, not kernel time (a
    16x16 cuBLAS GEMM takes several µs of GPU time: thousands of calls back to back time the GPU)."""
    import torch

    best = float("inf")
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    torch.cuda.synchronize()
    return best


def override_cost(rounds: int = 7, n: int = 16) -> dict[str, float]:
    """Host µs per torch.mm call of an n x n CUDA matmul: eager, under our override (policy matmul=torch,
    so the same cuBLAS kernel runs), and under a bare Python override; best of interleaved rounds."""
    import torch

    import xpuruntime.pytorch as xtorch

    a, b = torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda")
    mm_out = torch.mm  # the out= overload is a separate aten operator, never overridden

    def bare(x: Any, y: Any) -> Any:
        return mm_out(x, y, out=x.new_empty((x.shape[0], y.shape[1])))

    def timed() -> float:
        return host_us(lambda: torch.mm(a, b), rounds=10)

    best = {"eager_us": float("inf"), "xpuruntime_us": float("inf"), "bare_python_override_us": float("inf")}
    for _ in range(rounds):
        best["eager_us"] = min(best["eager_us"], timed())
        xtorch.set_kernel_policy(matmul="torch")
        best["xpuruntime_us"] = min(best["xpuruntime_us"], timed())
        xtorch.clear_kernel_policy()
        lib = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lib.impl("mm", bare, "CUDA")
        best["bare_python_override_us"] = min(best["bare_python_override_us"], timed())
        lib._destroy()
    best["xpuruntime_minus_eager_us"] = best["xpuruntime_us"] - best["eager_us"]
    best["bare_minus_eager_us"] = best["bare_python_override_us"] - best["eager_us"]
    best["target_us"] = 5.0
    return best


def _run(example: Any, argv: list[str]) -> dict[str, Any]:
    import xpuruntime as xrt

    xrt.clear_dispatch_logs()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = example.main(argv)
        except Exception as exc:  # recorded, the other checks still run
            import xpuruntime.pytorch as xtorch

            xtorch.clear_kernel_policy()
            xrt.disable_dispatch_logging()
            return {"error": f"{type(exc).__name__}: {exc}", "argv": argv}
    result["fallback_warnings"] = [str(w.message) for w in caught if issubclass(w.category, xrt.KernelFallbackWarning)]
    result["argv"] = argv
    return result


def _max_rel(a: list, b: list) -> float | None:
    pairs = [(x, y) for x, y in zip(a, b) if x is not None and y is not None]
    return max((abs(x - y) / max(abs(y), 1e-12) for x, y in pairs), default=None)


def _calls(result: dict[str, Any], op: str, kernel: str) -> int:
    return sum(row["calls"] for row in result.get("dispatch", []) if row["op"] == op and row["kernel"] == kernel)


def _median(result: dict[str, Any], skip: int = 5) -> float | None:
    times = result.get("step_ms", [])[skip:]
    return statistics.median(times) if times else None


def training_checks(root: Path, steps: int, extra: list[str] | None = None, on_run: Any = None) -> dict[str, Any]:
    example = _example(root)
    s = ["--steps", str(steps), *(extra or [])]
    small = ["--steps", "10", "--dtype", "fp32", *SMALL, *(extra or [])]
    plan = {
        "none": s,
        "policy": [*s, "--policy", POLICY],
        "flash_only": [*s, "--policy", "attention=flash_v2"],
        "fp32_none": small,
        "fp32_flash": [*small, "--policy", "attention=flash_v2"],
        "fp32_strict": [*small, "--policy", "attention=flash_v2", "--strict"],
        "graph_policy": [*s, "--capture-graph", "--policy", POLICY],
        "graph_none": [*s, "--capture-graph"],
        "autotune": [*s, "--autotune"],
    }
    runs: dict[str, Any] = {}
    for name, argv in plan.items():
        runs[name] = _run(example, argv)
        print(f"run {name}: median step {_median(runs[name])} ms {runs[name].get('error', '')}", flush=True)
        if on_run is not None:
            on_run(runs)
    checks = {
        "policy_vs_none_max_rel_loss": _max_rel(runs["policy"].get("losses", []), runs["none"].get("losses", [])),
        "graph_vs_eager_policy_max_rel_loss": _max_rel(
            runs["graph_policy"].get("losses", []), runs["policy"].get("losses", [])
        ),
        "graph_vs_eager_none_max_rel_loss": _max_rel(
            runs["graph_none"].get("losses", []), runs["none"].get("losses", [])
        ),
        "fallback_vs_none_max_rel_loss": _max_rel(
            runs["fp32_flash"].get("losses", []), runs["fp32_none"].get("losses", [])
        ),
        "fallback_warning_count": len(runs["fp32_flash"].get("fallback_warnings", [])),
        "strict_error": runs["fp32_strict"].get("error"),
        "policy_calls_per_step": {
            f"{op}/{kernel}": _calls(runs["policy"], op, kernel) / steps
            for op, kernel in (
                ("matmul", "cublasLt"),
                ("linear", "cublasLt"),
                ("attention_forward", "flash_v2"),
                ("attention_backward", "flash_v2"),
            )
        },
    }
    eager = _median(runs["none"])
    timing = {}
    for name in ("none", "policy", "flash_only", "autotune", "graph_none", "graph_policy"):
        ms = _median(runs[name])
        timing[name] = {"median_step_ms": ms, "speedup_vs_eager": (eager / ms) if ms and eager else None}
    return {"runs": runs, "checks": checks, "timing": timing}


def ddp_compare(single: str, *ranks: str) -> dict[str, Any]:
    """Per-step loss of one GPU against the mean of the ranks' losses (same global batch)."""
    one = json.loads(Path(single).read_text())
    per_rank = [json.loads(Path(r).read_text()) for r in ranks]
    mean = [sum(r["losses"][i] for r in per_rank) / len(per_rank) for i in range(len(one["losses"]))]
    return {
        "max_rel_loss_vs_one_gpu": _max_rel(mean, one["losses"]),
        "one_gpu_median_step_ms": one["median_step_ms"],
        "ddp_median_step_ms": [r["median_step_ms"] for r in per_rank],
        "kernels_per_rank": [sorted({f"{d['op']}/{d['kernel']}" for d in r["dispatch"]}) for r in per_rank],
        "losses_one_gpu": one["losses"],
        "losses_ddp_mean": mean,
    }


def profile_host(root: Path, policy: str, steps: int = 12, top: int = 30) -> None:
    """Where the host time of eager steps under `policy` goes (cProfile over the last steps)."""
    import cProfile
    import pstats

    example = _example(root)
    argv = ["--steps", str(steps), *(["--policy", policy] if policy else [])]
    example.main(["--steps", "3", *argv[2:]])  # compile and plan first
    profiler = cProfile.Profile()
    profiler.enable()
    example.main(argv)
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(top)
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(top)
    import xpuruntime as xrt

    print("dispatcher plan cache:", xrt.plan_cache().stats())
    try:
        from xpuruntime.backends.cublaslt.common import PLANS

        print(f"cuBLASLt plans: {len(PLANS)} held, {PLANS.hits} hits, {PLANS.misses} misses")
    except ImportError:
        pass


def _markdown(report: dict[str, Any]) -> str:
    oc, checks, timing = report["override_cost"], report["training"]["checks"], report["training"]["timing"]
    lines = [
        "# xpuruntime.pytorch on the GPU",
        "",
        "| tiny matmul (16x16 fp32) | µs per call |",
        "|---|---:|",
        *(f"| {k} | {v:.2f} |" for k, v in oc.items()),
        "",
        "| GPT step (6L, d768, 12 heads, ctx 1024, batch 8, bf16) | median ms | speed-up vs eager |",
        "|---|---:|---:|",
    ]
    for name, t in timing.items():
        ms, up = t["median_step_ms"], t["speedup_vs_eager"]
        lines.append(f"| {name} | {ms if ms is None else f'{ms:.2f}'} | {up if up is None else f'{up:.3f}'} |")
    lines += ["", "| check | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in checks.items()]
    for name, run in report["training"]["runs"].items():
        if "error" in run:
            lines.append(f"| run {name} error | {run['error'][:300]} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="xpuruntime.pytorch training benchmark and GPU checks")
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--name", default="training_h100")
    p.add_argument("--example-args", default="", help="extra arguments for every example run (e.g. '--tiny')")
    p.add_argument("--skip-override-cost", action="store_true")
    p.add_argument("--profile-host", default=None, metavar="POLICY", help="cProfile eager steps under POLICY")
    p.add_argument("--ddp-compare", nargs="+", metavar="JSON", help="one-GPU json, then each rank's json")
    args = p.parse_args(argv)
    if args.profile_host is not None:
        profile_host(Path(__file__).resolve().parents[3], args.profile_host)
        return
    if args.ddp_compare:
        result = ddp_compare(*args.ddp_compare)
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / f"{args.name}.json").write_text(json.dumps(result, indent=1))
        print(json.dumps({k: v for k, v in result.items() if not k.startswith("losses")}, indent=1))
        return
    root = Path(__file__).resolve().parents[3]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"override_cost": {} if args.skip_override_cost else override_cost()}
    print(json.dumps(report["override_cost"], indent=1), flush=True)

    def save_partial(runs: dict[str, Any]) -> None:
        partial = {**report, "partial_runs": runs}
        (out / f"{args.name}.json").write_text(json.dumps(partial, indent=1, default=str))

    report["training"] = training_checks(root, args.steps, args.example_args.split(), save_partial)
    (out / f"{args.name}.json").write_text(json.dumps(report, indent=1, default=str))
    text = _markdown(report)
    (out / f"{args.name}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
