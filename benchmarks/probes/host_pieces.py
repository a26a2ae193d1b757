"""Host µs (launch queue never full) of the pieces of a routed tiny CUDA matmul (aten::mm override), each timed alone, and a cProfile
of the routed call: where the override's cost over a bare Python override goes.

    PYTHONPATH=src python3 benchmarks/probes/host_pieces.py
"""

from __future__ import annotations

import cProfile
import pstats

import torch
from host_timing import host_us

import xpuruntime as xrt
import xpuruntime.pytorch as xtorch
from xpuruntime.pytorch import router as routing


def main() -> None:
    a, b = torch.randn(16, 16, device="cuda"), torch.randn(16, 16, device="cuda")
    o = torch.empty(16, 16, device="cuda")
    dev = torch.device("cuda:0")
    plan = xrt.default_dispatcher().plan("matmul", a, b)
    pieces = {
        "torch.mm(a, b)": lambda: torch.mm(a, b),
        "torch.mm(a, b, out=o)": lambda: torch.mm(a, b, out=o),
        "torch.ops.aten.mm.out(a, b, out=o)": lambda: torch.ops.aten.mm.out(a, b, out=o),
        "a.new_empty((16, 16))": lambda: a.new_empty((16, 16)),
        "torch.empty(.., device='cuda:0')": lambda: torch.empty((16, 16), dtype=torch.float32, device="cuda:0"),
        "torch.empty(.., device=torch.device)": lambda: torch.empty((16, 16), dtype=torch.float32, device=dev),
        "plan.allocate(None)": lambda: plan.allocate(None),
        "xrt.ops.matmul(a, b)": lambda: xrt.ops.matmul(a, b),
    }
    with xrt.kernel_policy(matmul="torch"):
        pieces["wants('matmul') in a scope"] = lambda: routing.wants("matmul")
        pieces["routing.dispatch('matmul')"] = lambda: routing.dispatch("matmul", (a, b))
        for name, fn in pieces.items():
            print(f"{name:<40}{host_us(fn):>8.2f} µs")
    xtorch.set_kernel_policy(matmul="torch")
    print(f"{'torch.mm under the override':<40}{host_us(lambda: torch.mm(a, b)):>8.2f} µs")
    profiler = cProfile.Profile()
    for _ in range(500):  # batches of 100 calls: the launch queue never fills
        torch.cuda.synchronize()
        profiler.enable()
        for _ in range(100):
            torch.mm(a, b)
        profiler.disable()
    xtorch.clear_kernel_policy()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
