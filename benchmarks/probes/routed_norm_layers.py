"""Where a routed F.layer_norm / F.rms_norm forward + backward spends its time (issue 25 item 3: the bench's
routed rows read 0.39-0.61x PyTorch in wall time, ~0.4-0.5 ms a call at both shapes, while our kernels alone
beat PyTorch's): per layer of the route (the whole call with autograd, the forward alone, the forward and
backward bodies as the route calls them), host µs per call at a tiny shape, wall µs per call at the bench's
shapes, and the kernels one call runs (torch.profiler), each beside PyTorch's own call.

    python benchmarks/probes/routed_norm_layers.py [--op layer_norm|rms_norm] [--calls 200]

On a machine without CUDA it runs as a smoke test through the CPU routing switch (the CPU kernels, small
shapes): the figures then say nothing about the GPU.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable


def layers(op: str, m: int, n: int, device: str) -> dict[str, Callable[[], object]]:
    """name: one call, for each layer at (m, n) bf16 (float32 on the CPU: NumPy has no bfloat16)."""
    import torch
    import torch.nn.functional as F

    import xpuruntime as xrt
    from xpuruntime.pytorch.custom_ops import norm as norm_ops
    from xpuruntime.pytorch.custom_ops.replay import call as run_body
    from xpuruntime.pytorch.router import family_policy

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    x, w, b, dy = (torch.randn(*s, device=device, dtype=dtype) for s in ((m, n), (n,), (n,), (m, n)))
    for t in (x, w, b):
        t.requires_grad_()
    xd, wd, bd = x.detach(), w.detach(), (b.detach() if op == "layer_norm" else None)
    eps = 1e-5 if op == "layer_norm" else 1e-6

    def forward() -> torch.Tensor:
        if op == "layer_norm":
            return F.layer_norm(x, (n,), w, b, eps)
        return F.rms_norm(x, (n,), w, eps)

    def forward_no_grad() -> torch.Tensor:
        with torch.no_grad():
            return forward()

    kernel = "triton" if device == "cuda" else "numpy"
    policy = family_policy(xrt.KernelPolicy(**{op: kernel}))
    forward_args = (op, xd, wd, bd, (n,), eps)
    backward_args = (op, dy, xd, wd, bd, (n,), eps)
    return {
        "fwd+bwd (F.* with autograd)": lambda: forward().backward(dy),
        "fwd with autograd": forward,
        "fwd under no_grad": forward_no_grad,
        "forward body (replay.call)": lambda: run_body(norm_ops.forward, forward_args, policy),
        "backward body (replay.call)": lambda: run_body(norm_ops.backward, backward_args, policy),
        "forward body (no replay)": lambda: norm_ops.forward(*forward_args, policy),
        "backward body (no replay)": lambda: norm_ops.backward(*backward_args, policy),
    }


def timings(op: str, m: int, n: int, device: str, calls: int, host: bool) -> None:
    """Each layer routed (the policy set) beside the same call unrouted (no policy: PyTorch's), interleaved
    rounds, the policy set once per block of calls (setting it is not what is measured). Host: the clock stops
    when the calls are enqueued (the GPU starts idle and never catches up at this shape); wall: after a sync."""
    import time

    import torch

    import xpuruntime.pytorch as xtorch
    from xpuruntime import KernelPolicy

    kernel = "triton" if device == "cuda" else "numpy"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    policies = {"routed": KernelPolicy(**{op: kernel}), "pytorch": None}
    print(f"== {op} {m}x{n}: {'host' if host else 'wall'} µs per call (best of 7 interleaved rounds)")
    for name, fn in layers(op, m, n, device).items():
        labels = ["routed"] if "body" in name else ["routed", "pytorch"]  # the bodies are ours only
        best = dict.fromkeys(labels, float("inf"))
        try:
            for round_ in range(8):  # the first round warms up: plans, recipes (the third call records)
                for label in labels:
                    xtorch.set_kernel_policy(policies[label])
                    sync()
                    start = time.perf_counter()
                    for _ in range(calls):
                        fn()
                    if not host:
                        sync()
                    elapsed = (time.perf_counter() - start) / calls * 1e6
                    sync()
                    if round_:
                        best[label] = min(best[label], elapsed)
        finally:
            xtorch.clear_kernel_policy()
        row = "  ".join(f"{label} {us:8.1f}" for label, us in best.items())
        print(f"  {name:<32} {row}", flush=True)


def kernels(op: str, m: int, n: int, device: str) -> None:
    """The kernels (and host ops) of one forward + backward, routed and not, by total device time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    import xpuruntime.pytorch as xtorch
    from xpuruntime import KernelPolicy

    fn = layers(op, m, n, device)["fwd+bwd (F.* with autograd)"]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    sort = "device_time_total" if device == "cuda" else "cpu_time_total"
    kernel = "triton" if device == "cuda" else "numpy"
    for label, policy in (("routed", KernelPolicy(**{op: kernel})), ("pytorch", None)):
        xtorch.set_kernel_policy(policy)
        for _ in range(5):
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
        with profile(activities=activities) as prof:
            for _ in range(5):
                fn()
            if device == "cuda":
                torch.cuda.synchronize()
        xtorch.clear_kernel_policy()
        print(f"== {op} {m}x{n} {label}: 5 calls")
        print(prof.key_averages().table(sort_by=sort, row_limit=14, max_name_column_width=60))


def host_profile(op: str, device: str, calls: int = 300) -> None:
    """cProfile of routed forward + backward calls at the tiny shape: which Python functions hold the host time
    beyond the bodies (the autograd Function, policy lookups, gradient unpacking)."""
    import cProfile
    import pstats

    import xpuruntime.pytorch as xtorch
    from xpuruntime import KernelPolicy

    fn = layers(op, 8, 64, device)["fwd+bwd (F.* with autograd)"]
    xtorch.set_kernel_policy(KernelPolicy(**{op: "triton" if device == "cuda" else "numpy"}))
    try:
        for _ in range(20):
            fn()
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(calls):
            fn()
        profiler.disable()
    finally:
        xtorch.clear_kernel_policy()
    print(f"== {op} 8x64 routed fwd+bwd: cProfile of {calls} calls")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
    pstats.Stats(profiler).sort_stats("cumtime").print_stats(30)


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", choices=("layer_norm", "rms_norm"), default="layer_norm")
    parser.add_argument(
        "--calls", type=int, default=100, help="calls per round at the tiny shape (a tenth at the large)"
    )
    parser.add_argument("--profile", action="store_true", help="only the cProfile of the routed call")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":  # smoke test: route CPU calls to the CPU kernels
        from xpuruntime.pytorch import install

        install.route_devices(("cuda", "cpu"))
    if args.profile:
        host_profile(args.op, device)
        return
    shapes = ((8192, 4096), (16384, 1024)) if device == "cuda" else ((64, 32),)
    timings(args.op, 8, 64, device, args.calls, host=True)
    for m, n in shapes:
        timings(args.op, m, n, device, max(args.calls // 10, 5), host=False)
    kernels(args.op, *shapes[-1], device)


if __name__ == "__main__":
    main()
