"""Why an eager GPT step under a policy is slower than without: CUDA API calls that block (synchronize,
blocking copies) and the Triton direct-launch cache's hit rate. Usage (GPU): python benchmarks/step_diagnose.py POLICY..."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("train_gpt", ROOT / "examples" / "train_gpt.py")
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)

BLOCKING = ("Synchronize", "Memcpy", "cudaMalloc", "cudaFree", "HostAlloc", "cudaStreamQuery", "cudaEventQuery")

for policy in sys.argv[1:] or [""]:
    policy = "" if policy == "none" else policy
    argv = ["--steps", "4", *(["--policy", policy] if policy else [])]
    example.main(argv)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        example.main(argv)
    print(f"=== policy {policy!r}")
    for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total):
        if any(b in e.key for b in BLOCKING):
            print(f"  {e.key:<40} calls {e.count:>6}  self CPU {e.self_cpu_time_total / 1e3:8.2f} ms")
    try:
        from triton import knobs

        from xpuruntime.backends.triton import common

        print("  triton launch hooks:", knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook)
        print("  direct-launch cache entries:", len(common._COMPILED))
    except Exception as exc:
        print("  triton:", exc)
