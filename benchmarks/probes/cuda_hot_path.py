"""Where the dispatcher's time goes on a plan-cache hit with CUDA tensors: per-call µs of each step of
`Dispatcher.run` for a tiny matmul and sin_affine, and a cProfile of the matmul call.

    python benchmarks/probes/cuda_hot_path.py
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
from pathlib import Path

import torch

import xpuruntime as xrt
from xpuruntime import arguments
from xpuruntime.abi import ArgPack
from xpuruntime.arrays import signature
from xpuruntime.policy import current_policy
from xpuruntime.runtime import streams

sys.path.insert(0, str(Path(__file__).parent))
from host_timing import per_call_us


def steps(op: str, call, inputs: tuple, attrs: tuple = ()) -> dict:
    dispatcher = xrt.default_dispatcher()
    plan = dispatcher.plan(op, *inputs)
    key = arguments.plan_key(op, current_policy().fingerprint, attrs, inputs, None)
    stream = None if plan.current_stream is None else plan.current_stream(plan.device)
    out = plan.allocate(stream)
    x = inputs[0]
    stream_lookup = {} if plan.current_stream is None else {
        f"{op}: backend current_stream ({plan.kernel.backend})": lambda: plan.current_stream(plan.device)
    }  # fmt: skip
    return {
        f"{op}: xrt.ops call": call,
        f"{op}: Dispatcher.run": lambda: dispatcher.run(op, inputs, attrs, None),
        f"{op}: plan_key": lambda: arguments.plan_key(op, 0, attrs, inputs, None),
        f"{op}: plans.get": lambda: dispatcher.plans.get(key),
        **stream_lookup,
        f"{op}: plan.allocate": lambda: plan.allocate(stream),
        f"{op}: ArgPack + launch": lambda: plan.launch(ArgPack(inputs, out, plan.attrs, plan.config, None, stream)),
        f"{op}: signature(x)": lambda: signature(x),
        "x.is_cuda": lambda: x.is_cuda,
        "x.dtype": lambda: x.dtype,
        "x.shape": lambda: x.shape,
        "x.is_contiguous()": lambda: x.is_contiguous(),
        "x.stride()": lambda: x.stride(),
        "x.get_device()": lambda: x.get_device(),
        "x.data_ptr()": lambda: x.data_ptr(),
        "current_policy()": current_policy,
        "streams.current_stream": lambda: streams.current_stream("cuda:0"),
    }


def main() -> int:
    a = torch.randn(4, 4, device="cuda")
    b = torch.randn(4, 4, device="cuda")
    x = torch.randn(64, device="cuda")
    rows = {}
    for op, call, inputs, attrs in (
        ("matmul", lambda: xrt.ops.matmul(a, b), (a, b), ()),
        ("sin_affine", lambda: xrt.ops.sin_affine(x, 2.0, 0.5), (x, 2.0, 0.5), ()),
    ):
        rows.update(per_call_us(steps(op, call, inputs, attrs), number=5_000, repeat=5, sync=torch.cuda.synchronize))
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(20_000):
        xrt.ops.matmul(a, b)
    profile.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(14)
    print(text.getvalue()[-3500:])
    for name, us in rows.items():
        print(f"{name:<55}{us:>8.2f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
