"""Host time of each layer of a fused op's eager path (swiglu and rms_norm at a tiny bf16 shape on CUDA, the
patch policy pinned), from the whole autograd call down to Triton's launcher, beside PyTorch's formula: where
the eager path's microseconds go (cProfile inflates and blurs them; this times each layer alone).

    python benchmarks/probes/fused_op_layers.py [--calls 3000]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from fused_op_host_cost import per_call_us  # this folder is on sys.path when the probe runs as a script


def captured_launch(body: Callable[[], object]) -> tuple:
    """(fn, grid, args, kwargs) of the last Triton launch `body` makes."""
    from xpuruntime.backends.triton import common

    seen = []
    original = common.launch

    def spy(fn, grid, *args, **kwargs):
        seen.append((fn, grid, args, kwargs))
        return original(fn, grid, *args, **kwargs)

    import xpuruntime.backends.triton.glu as glu
    import xpuruntime.backends.triton.norm as norm

    glu.launch = norm.launch = spy
    try:
        body()
    finally:
        glu.launch = norm.launch = original
    return seen[-1]


def main() -> None:
    import torch
    import torch.nn.functional as F

    from xpuruntime.abi import ArgPack
    from xpuruntime.backends.triton.common import _COMPILED, launch
    from xpuruntime.bench.hf_training import PATCH_POLICY
    from xpuruntime.policy import KernelPolicy
    from xpuruntime.pytorch.custom_ops import glu
    from xpuruntime.pytorch.custom_ops.norm import rms_norm
    from xpuruntime.pytorch.router import get_dispatcher, pin, pinned_policy

    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=3000)
    calls = parser.parse_args().calls
    pinned = pin(KernelPolicy.from_string(PATCH_POLICY))
    policy = pinned_policy(pinned.policy)
    dev, bf = "cuda", torch.bfloat16
    g = torch.randn(2, 8, 128, device=dev, dtype=bf, requires_grad=True)
    u = torch.randn(2, 8, 128, device=dev, dtype=bf, requires_grad=True)
    x = torch.randn(2, 8, 64, device=dev, dtype=bf, requires_grad=True)
    w = torch.randn(64, device=dev, dtype=bf, requires_grad=True)
    gd, ud, dy = g.detach(), u.detach(), torch.randn_like(g)
    dispatcher = get_dispatcher()
    plan = dispatcher.plan("swiglu", gd, ud, policy=policy)
    out = torch.empty_like(gd)
    fn, grid, args, kwargs = captured_launch(lambda: dispatcher.run("swiglu", (gd, ud), (), None, policy))
    key = next(k for k in _COMPILED if k[0] is fn)
    kernel, tail = _COMPILED[key]
    stream = torch.cuda.current_stream().cuda_stream

    def raw_run() -> None:
        kernel.run(grid[0], 1, 1, stream, kernel.function, kernel.packed_metadata, None, None, None, *args, *tail)

    def backward_of(out_fn: Callable[[], torch.Tensor]) -> Callable[[], None]:
        return lambda: out_fn().backward(dy)

    rows = {
        "swiglu fwd+bwd (patch path)": backward_of(lambda: glu.swiglu(g, u, pinned)),
        "swiglu fwd+bwd (PyTorch formula)": backward_of(lambda: F.silu(g) * u),
        "swiglu fwd, autograd (patch path)": lambda: glu.swiglu(g, u, pinned),
        "swiglu fwd, PyTorch formula with autograd": lambda: F.silu(g) * u,
        "swiglu fwd body (custom_ops.glu.forward)": lambda: glu.forward(gd, ud, "silu", policy),
        "swiglu backward body (custom_ops.glu.backward)": lambda: glu.backward(dy, gd, ud, "silu", policy),
        "dispatcher.run('swiglu')": lambda: dispatcher.run("swiglu", (gd, ud), (), None, policy),
        "plan.launch(ArgPack) into out": lambda: plan.launch(
            ArgPack((gd, ud), out, plan.attrs, plan.config, None, None)
        ),
        "common.launch(fn, grid, ...)": lambda: launch(fn, grid, *args, **kwargs),
        "kernel.run (Triton's launcher)": raw_run,
        "torch.empty_like": lambda: torch.empty_like(gd),
        "one aten op (gd * ud)": lambda: gd * ud,
        "rms_norm fwd+bwd (patch path)": lambda: rms_norm(x, (64,), w, 1e-6, casting="llama", pinned=pinned).backward(
            torch.ones_like(x)
        ),
        "ones_like + sum backward only": lambda: x.sum().backward(),
    }
    print(f"{'layer':<50} us per call ({calls} calls after 50 warm-up calls)")
    for name, fn_ in rows.items():
        print(f"{name:<50} {per_call_us(fn_, calls):8.1f}", flush=True)


if __name__ == "__main__":
    main()
