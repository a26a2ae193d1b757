"""The example's step captured as one CUDA graph under several policies, against eager without one.

A captured step has no host time, so it shows what each policy's kernels do to the GPU time of the
GPT step (the target: a captured step >= 1.1x eager). Each configuration is a fresh process of the example;
eager runs come first and last, so host drift shows as a difference between the two.

    python benchmarks/probes/captured_policies.py [--steps 40] [--out DIR] [--only ROW ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

CONFIGS = {
    "eager": [],
    "graph": ["--capture-graph"],
    "graph matmul=cublasLt,attention=flash_v2": ["--capture-graph", "--policy", "matmul=cublasLt,attention=flash_v2"],
    "graph matmul=cublasLt": ["--capture-graph", "--policy", "matmul=cublasLt"],
    "graph attention=flash_v2": ["--capture-graph", "--policy", "attention=flash_v2"],
    "graph layer_norm=triton": ["--capture-graph", "--policy", "layer_norm=triton"],
    "graph autotune": ["--capture-graph", "--autotune"],
    "graph matmul=cublasLt,layer_norm=triton": ["--capture-graph", "--policy", "matmul=cublasLt,layer_norm=triton"],
    "graph autocast_linear=fused_cast": ["--capture-graph", "--policy", "autocast_linear=fused_cast"],
    "eager autocast_linear=fused_cast": ["--policy", "autocast_linear=fused_cast"],
    "graph (again)": ["--capture-graph"],
    "eager (again)": [],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--out", default="/tmp/captured_policies")
    parser.add_argument("--only", nargs="*", default=None, help="run only these rows (names as printed)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    example = Path(__file__).resolve().parents[2] / "examples" / "train_gpt.py"
    medians = {}
    for i, (name, extra) in enumerate(CONFIGS.items()):
        if args.only is not None and name not in args.only:
            continue
        path = out / f"captured_{i}.json"
        command = [sys.executable, str(example), "--steps", str(args.steps), "--json", str(path), *extra]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{name}: failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}", flush=True)
            continue
        medians[name] = json.loads(path.read_text())["median_step_ms"]
        print(f"{name:<45}{medians[name]:8.2f} ms", flush=True)
    eager = min(v for k, v in medians.items() if k in ("eager", "eager (again)"))  # no policy
    print(f"\nspeedup over the faster eager run without a policy ({eager:.2f} ms):")
    for name, ms in medians.items():
        print(f"  {name:<45}{eager / ms:6.3f}x")
    (out / "captured_policies.json").write_text(json.dumps({"steps": args.steps, "median_step_ms": medians}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
