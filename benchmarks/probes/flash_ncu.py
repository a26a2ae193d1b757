"""One flash_v2 forward at the issue's headline shape (bf16 B4 H16 S2048 D128, non-causal) for Nsight Compute:

ncu --kernel-name _fwd_kernel --launch-count 1 --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section WarpStateStats python3 benchmarks/probes/flash_ncu.py
"""

from __future__ import annotations

import math

import torch

from xpuruntime.backends.triton import flash as fl


def main(B: int = 4, H: int = 16, S: int = 2048, D: int = 128, causal: bool = False) -> None:
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = torch.empty_like(q)
    lse = torch.empty(B * H * S, device="cuda", dtype=torch.float32)
    fl.forward(q, k, v, out, lse, None, causal, 1 / math.sqrt(D), fl.fwd_config(D, causal))
    torch.cuda.synchronize()
    print("flash forward done")


if __name__ == "__main__":
    main()
