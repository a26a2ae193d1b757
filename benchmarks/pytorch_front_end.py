"""Host costs of the PyTorch front end, beside PyTorch in the same process (issue 25 item 3).

- scope: entering and leaving `xrt.kernel_policy(policy)` with a prebuilt policy that routes attention (the
  overrides it needs are installed once; no rebuild, no selection) against a `contextlib.nullcontext()`;
- norm: F.layer_norm / F.rms_norm forward + backward under `layer_norm="triton"` / `rms_norm="triton"` against
  PyTorch's, wall time per call (do_bench median: host-bound calls show their host time), bf16 at 8192x4096
  and 16384x1024 (CUDA only);
- attention: `xrt.ops.attention` under flash_v2, the scope opened once against opened around each call,
  B4 H16 S2048 D128 bf16, TFLOP/s (CUDA only).

    python benchmarks/pytorch_front_end.py [--only scope,norm,attention] [--json out.json]

On a machine without CUDA only the scope row runs (CPU overrides: the tests' routing switch).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time

import torch
import torch.nn.functional as F

import xpuruntime as xrt
import xpuruntime.pytorch as xtorch
from xpuruntime.pytorch import install


def _us_per_call(fn, calls: int = 2000, rounds: int = 7) -> float:
    for _ in range(calls // 10):
        fn()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def scope_row() -> dict:
    if not torch.cuda.is_available():
        install.route_devices(("cpu",))
    policy = xrt.KernelPolicy(attention="flash_v2", validate=False)

    def scoped() -> None:
        with xrt.kernel_policy(policy):
            pass

    def baseline() -> None:
        with contextlib.nullcontext():
            pass

    scoped()  # installs the overrides the policy needs, once
    row = {"scope_us": _us_per_call(scoped), "nullcontext_us": _us_per_call(baseline)}
    row["scope_entry_cost_us"] = row["scope_us"] - row["nullcontext_us"]
    return row


def _bench(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=200, return_mode="median") * 1000.0


def _norm_calls(m: int, n: int) -> dict:
    """op -> a forward + backward call at (m, n) bf16."""
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    return {
        "layer_norm": lambda: F.layer_norm(x, (n,), w, b).backward(dy),
        "rms_norm": lambda: F.rms_norm(x, (n,), w, 1e-6).backward(dy),
    }


def norm_rows() -> list[dict]:
    rows = []
    for m, n in ((8192, 4096), (16384, 1024)):
        for op, fn in _norm_calls(m, n).items():
            xtorch.clear_kernel_policy()
            theirs = _bench(fn)
            xtorch.set_kernel_policy(**{op: "triton"})
            ours = _bench(fn)
            xtorch.clear_kernel_policy()
            rows.append({"op": op, "shape": f"{m}x{n}", "pytorch_us": theirs, "routed_us": ours,
                         "speedup": theirs / ours})  # fmt: skip
    return rows


def attention_row() -> dict:
    b, h, s, d = 4, 16, 2048, 128
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flops = 4 * b * h * s * s * d
    policy = xrt.KernelPolicy(attention="flash_v2")

    def per_call() -> None:
        with xrt.kernel_policy(policy):
            xrt.ops.attention(q, k, v)

    with xrt.kernel_policy(policy):
        once = _bench(lambda: xrt.ops.attention(q, k, v))
    each = _bench(per_call)
    return {"scope_once_tflops": flops / once / 1e6, "scope_per_call_tflops": flops / each / 1e6,
            "scope_once_us": once, "scope_per_call_us": each}  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="scope,norm,attention")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    wanted = set(args.only.split(","))
    results: dict = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}
    if "scope" in wanted:
        results["scope"] = scope_row()
        print(f"scope entry + exit: {results['scope']['scope_us']:.2f} us "
              f"(nullcontext {results['scope']['nullcontext_us']:.2f} us)")  # fmt: skip
    if torch.cuda.is_available() and "norm" in wanted:
        results["norm"] = norm_rows()
        for row in results["norm"]:
            print(f"{row['op']} fwd+bwd {row['shape']} bf16: PyTorch {row['pytorch_us']:.1f} us, routed "
                  f"{row['routed_us']:.1f} us ({row['speedup']:.2f}x)")  # fmt: skip
    if torch.cuda.is_available() and "attention" in wanted:
        results["attention"] = row = attention_row()
        print(f"attention flash_v2 B4 H16 S2048 D128: scope once {row['scope_once_tflops']:.0f} TFLOP/s, "
              f"scope per call {row['scope_per_call_tflops']:.0f} TFLOP/s")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
