"""flash_v2 forward configurations on the GPU, timed by device time beside PyTorch's flash and cuDNN.

Every candidate (block sizes, stages, warp specialization, TMA loads) runs at one shape, each timed as
the median of single launches from a cold L2 with the host latency hidden (`autotune.cuda_sampler`, what
autotune and `xpuruntime bench` use), with its register and spill counts, the layout conversions in its
TTGIR, and its largest difference from cuDNN's output.

    PYTHONPATH=src python3 benchmarks/probes/flash_fwd_sweep.py [--S 2048] [--D 128] [--causal] [--dtype bf16]
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from xpuruntime.autotune import cuda_sampler
from xpuruntime.backends.triton import flash as fl


def median_us(sample, fn, reps: int) -> float:
    fn()
    return statistics.median(sample(fn) for _ in range(reps))


def configs(causal: bool, with_ws: bool) -> list[fl.FwdConfig]:
    found = []
    for (bm, bn, warps), stages, ws, tma in itertools.product(
        [(128, 128, 8), (128, 64, 8), (64, 64, 4), (64, 128, 4), (64, 32, 4)], (2, 3, 4), (False, True) if with_ws else (False,),
        (False, True),
    ):  # fmt: skip
        if (causal and bm % bn) or (bn == 128 and stages == 4) or (bm == 64 and ws):
            continue
        found.append(fl.FwdConfig(bm, bn, warps, stages, ws, tma))
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--B", type=int, default=4)
    p.add_argument("--H", type=int, default=16)
    p.add_argument("--S", type=int, default=2048)
    p.add_argument("--D", type=int, default=128)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--ws", action="store_true", help="also the warp-specialized variants")
    args = p.parse_args()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    B, H, S, D, causal = args.B, args.H, args.S, args.D, args.causal
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=dtype) for _ in range(3))
    out = torch.empty_like(q)
    lse = torch.empty(B * H * S, device="cuda", dtype=torch.float32)
    scale = 1 / math.sqrt(D)
    tflop = fl.fwd_flops(B, H, S, S, D, causal) / 1e12
    sample = cuda_sampler("cuda", None)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; B{B} H{H} S{S} D{D} causal={causal} "
          f"{args.dtype}; median of {args.reps} cold launches")  # fmt: skip
    anchors = {}
    for name, backend in [("torch_flash", SDPBackend.FLASH_ATTENTION), ("torch_cudnn", SDPBackend.CUDNN_ATTENTION)]:
        with sdpa_kernel([backend]):
            us = median_us(sample, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), args.reps)
            anchors[name] = us
            print(f"{name:<34}{us:>9.1f} µs {tflop / us * 1e6:>7.1f} TFLOP/s")
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal).float()
    print(f"{'config':<34}{'µs':>9} {'TFLOP/s':>7} {'/flash':>7} {'regs':>5} {'spill':>5} {'cvt':>4} {'maxdiff':>8}")
    for cfg in configs(causal, args.ws):
        try:
            kernel = fl.forward(q, k, v, out, lse, None, causal, scale, cfg)
            us = median_us(sample, lambda cfg=cfg: fl.forward(q, k, v, out, lse, None, causal, scale, cfg), args.reps)
        except Exception as exc:  # a config that does not compile here: say so and go on
            print(f"{cfg!s:<34} failed: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        ttgir = getattr(kernel, "asm", {}).get("ttgir", "")
        diff = (out.float() - expected).abs().max().item()
        print(f"{cfg!s:<34}{us:>9.1f} {tflop / us * 1e6:>7.1f} {anchors['torch_flash'] / us:>7.3f} "
              f"{getattr(kernel, 'n_regs', -1):>5} {getattr(kernel, 'n_spills', -1):>5} "
              f"{ttgir.count('convert_layout'):>4} {diff:>8.4f}")  # fmt: skip


if __name__ == "__main__":
    main()
