"""Host time of one fused op's forward + backward as `patch` calls it (custom_ops.*, the patch policy pinned),
beside the PyTorch code it replaces, at a tiny shape where the GPU's time is negligible: what each call costs
the host (an HF step at B8 S1024 is host-bound, so this is what a patched step saves or loses per call).
Then cProfile of our calls, by own time, for the op named with --profile.

    python benchmarks/probes/fused_op_host_cost.py [--profile swiglu] [--calls 2000]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from collections.abc import Callable


def cases() -> dict[str, tuple[Callable[[], object], Callable[[], object]]]:
    """name: (ours, PyTorch's), each a forward + backward of a tiny call."""
    import torch
    import torch.nn.functional as F

    from xpuruntime.bench.hf_training import PATCH_POLICY
    from xpuruntime.policy import KernelPolicy
    from xpuruntime.pytorch.custom_ops.add_norm import add_rms_norm
    from xpuruntime.pytorch.custom_ops.glu import swiglu
    from xpuruntime.pytorch.custom_ops.norm import rms_norm
    from xpuruntime.pytorch.custom_ops.rotary import rotary_embedding
    from xpuruntime.pytorch.router import pin

    pinned = pin(KernelPolicy.from_string(PATCH_POLICY))
    dev, bf = "cuda", torch.bfloat16

    def leaf(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=dev, dtype=bf, requires_grad=True)

    x, w, r = leaf(2, 8, 64), leaf(64), leaf(2, 8, 64)
    g, u = leaf(2, 8, 128), leaf(2, 8, 128)
    q, k = leaf(2, 4, 8, 16), leaf(2, 2, 8, 16)
    cos, sin = torch.randn(2, 8, 16, device=dev, dtype=bf), torch.randn(2, 8, 16, device=dev, dtype=bf)

    def hf_rms(h: torch.Tensor) -> torch.Tensor:
        f = h.float()
        return w * (f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + 1e-6)).to(h.dtype)

    def rotate_half(t: torch.Tensor) -> torch.Tensor:
        return torch.cat((-t[..., t.shape[-1] // 2 :], t[..., : t.shape[-1] // 2]), dim=-1)

    def hf_rotary() -> tuple:
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s

    def backward(*outs: torch.Tensor) -> None:
        sum(o.float().sum() for o in outs).backward()

    return {
        "rms_norm": (lambda: backward(rms_norm(x, (64,), w, 1e-6, casting="llama", pinned=pinned)),
                     lambda: backward(hf_rms(x))),
        "add_rms_norm": (lambda: backward(*add_rms_norm(x, r, w, 1e-6, casting="llama", pinned=pinned)),
                         lambda: backward(hf_rms(x + r), x + r)),
        "swiglu": (lambda: backward(swiglu(g, u, pinned)), lambda: backward(F.silu(g) * u)),
        "rotary_embedding": (lambda: backward(*rotary_embedding(q, k, cos, sin, None, 1, False, pinned)),
                             lambda: backward(*hf_rotary())),
        "sum only": (lambda: backward(x), lambda: backward(x)),
    }  # fmt: skip


def per_call_us(fn: Callable[[], object], calls: int) -> float:
    import torch

    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--profile", default="swiglu")
    args = parser.parse_args()
    table = cases()
    print("op: ours fwd+bwd us, PyTorch's fwd+bwd us (tiny shapes: host time)")
    for name, (ours, theirs) in table.items():
        a, b = per_call_us(ours, args.calls), per_call_us(theirs, args.calls)
        a2 = per_call_us(ours, args.calls)
        print(f"{name}: ours {min(a, a2):.1f} us, pytorch {b:.1f} us", flush=True)
    if args.profile:
        profiler = cProfile.Profile()
        ours = table[args.profile][0]
        profiler.enable()
        for _ in range(args.calls):
            ours()
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(45)
        print(text.getvalue())


if __name__ == "__main__":
    main()
