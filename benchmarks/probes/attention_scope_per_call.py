"""Attention with the policy scope opened around each call (issue 25 item 3): `xrt.ops.attention` under
flash_v2 with `with xrt.kernel_policy(policy)` around every call, against the scope opened once, B4 H16 S2048
D128 bf16, TFLOP/s by do_bench (host time shows where it outlasts the kernel). Before the scope stopped
rebuilding the aten overrides on entry, the per-call scope halved throughput on the H100 (479 -> 244).

    python benchmarks/probes/attention_scope_per_call.py
"""

from __future__ import annotations

import torch
from triton.testing import do_bench

import xpuruntime as xrt
import xpuruntime.pytorch  # its listener hears every scope: what it costs is measured


def main() -> dict:
    b, h, s, d = 4, 16, 2048, 128
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flops = 4 * b * h * s * s * d
    policy = xrt.KernelPolicy(attention="flash_v2")

    def per_call() -> None:
        with xrt.kernel_policy(policy):
            xrt.ops.attention(q, k, v)

    def bench(fn) -> float:
        return do_bench(fn, warmup=25, rep=200, return_mode="median") * 1000.0  # µs

    with xrt.kernel_policy(policy):
        once = bench(lambda: xrt.ops.attention(q, k, v))
    each = bench(per_call)
    row = {"scope_once_tflops": flops / once / 1e6, "scope_per_call_tflops": flops / each / 1e6}
    print(f"attention flash_v2 B4 H16 S2048 D128 bf16: scope opened once {row['scope_once_tflops']:.0f} TFLOP/s, "
          f"around each call {row['scope_per_call_tflops']:.0f} TFLOP/s")  # fmt: skip
    return row


if __name__ == "__main__":
    main()
