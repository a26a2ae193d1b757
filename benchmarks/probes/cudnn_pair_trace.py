"""The GPU kernels of one attention forward+backward at B4 H16 S2048 D128 bf16: PyTorch's SDPA-cuDNN with
autograd against the op-level `torch_cudnn` pair (attention_forward + attention_backward through the
dispatcher), from PyTorch's profiler, so a gap between the two shows as kernels.

    python benchmarks/probes/cudnn_pair_trace.py [--causal] [--dim 128]
"""

from __future__ import annotations

import argparse
import collections

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import xpuruntime as xrt


def kernels(fn, iters: int = 10) -> list[tuple[str, float, float]]:
    """(kernel name, µs per iteration, launches per iteration) of `fn`, largest first."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    total, count = collections.Counter(), collections.Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            total[event.name] += event.device_time
            count[event.name] += 1
    return [(name, us / iters, count[name] / iters) for name, us in total.most_common()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--causal", action="store_true")
    p.add_argument("--dim", type=int, default=128)
    args = p.parse_args()
    shape = (4, 16, 2048, args.dim)
    q, k, v, do = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]

    def sdpa() -> None:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out = F.scaled_dot_product_attention(*leaves, is_causal=args.causal)
            torch.autograd.grad(out, leaves, do)  # no .grad accumulation kernels

    policy = xrt.KernelPolicy(attention_forward="torch_cudnn", attention_backward="torch_cudnn", strict=True)

    def pair() -> None:
        with xrt.kernel_policy(policy):
            out, lse = xrt.ops.attention_forward(q, k, v, None, args.causal)
            xrt.ops.attention_backward(do, q, k, v, out, lse, None, args.causal)

    for name, fn in (("SDPA-cuDNN + autograd", sdpa), ("torch_cudnn pair", pair)):
        rows = kernels(fn)
        print(f"== {name}: {sum(us for _, us, _ in rows):.1f} us of kernels per iteration")
        for kernel, us, n in rows:
            print(f"  {us:9.1f} us  x{n:<4g} {kernel[:110]}")


if __name__ == "__main__":
    main()
