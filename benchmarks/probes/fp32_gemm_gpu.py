"""fp32 GEMMs of the zoo's text models on the GPU (issue 28): what cuBLAS runs for y = x W^T + b at BERT / GPT-2
shapes under each way our plans and torch.compile call it, device time per call inside a CUDA graph.

    python benchmarks/probes/fp32_gemm_gpu.py [M ...]     (default M: 128 and 4096)

Ways: addmm with W (N, K) contiguous and transposed (what compile and linear/torch run for nn.Linear, cuBLAS "tn"),
addmm with W^T (K, N) contiguous ("nn", GPT-2's Conv1D), and the `linear` op under the policies torch and cublasLt.
Prints per shape the device µs per call and the kernels each way launches; then cuBLASLt through nvmath with its
heuristic's first algorithm against the fastest after nvmath's autotune (Matmul.autotune), outside graphs.
"""

from __future__ import annotations

import collections
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import xpuruntime as xrt

SHAPES = ((768, 768), (768, 2304), (768, 3072), (3072, 768))  # (K, N)
CALLS = 20


def _graphed(fn):
    """A CUDA graph of CALLS calls of fn, replayed by the returned function."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    return graph.replay


def _device_us(replay) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    replay()
    start.record()
    for _ in range(10):
        replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / (10 * CALLS)


def _kernels(replay) -> str:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        replay()
        torch.cuda.synchronize()
    counts = collections.Counter(e.name[:60] for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    return ", ".join(f"{n / CALLS:g}x {name}" for name, n in counts.items())


def _ways(m: int, k: int, n: int) -> dict:
    """The calls to compare at one shape, each writing the same output."""
    x = torch.randn(m, k, device="cuda")
    w = torch.randn(n, k, device="cuda") / k**0.5
    wt = w.t().contiguous()
    b = torch.randn(n, device="cuda")
    out = torch.empty(m, n, device="cuda")

    def op(policy: str):
        def call() -> None:
            with xrt.kernel_policy(linear=policy):
                xrt.ops.linear(x, w, b, out=out)

        return call

    return {
        "addmm tn": lambda: torch.addmm(b, x, w.t(), out=out),
        "addmm nn": lambda: torch.addmm(b, x, wt, out=out),
        "linear/torch": op("torch"),
        "linear/cublasLt": op("cublasLt"),
    }


def _nvmath_times(m: int, k: int, n: int) -> str:
    """Device µs a call (events around 50 back-to-back executions) of y = x W^T + b through nvmath's Matmul with
    the BIAS epilogue: the heuristic's first algorithm, then the autotuned order's first."""
    from nvmath.linalg.advanced import Matmul, MatmulComputeType, MatmulEpilog

    x, w, b = torch.randn(m, k, device="cuda"), torch.randn(n, k, device="cuda"), torch.randn(n, device="cuda")
    mm = Matmul(w, x.t(), options={"compute_type": MatmulComputeType.COMPUTE_32F})  # y^T = W x^T, as ours
    mm.plan(epilog=MatmulEpilog.BIAS, epilog_inputs={"bias": b})

    def timed() -> float:
        for _ in range(3):
            mm.execute()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(50):
            mm.execute()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1000 / 50

    first = timed()
    mm.autotune(iterations=5)
    tuned = timed()
    count = len(mm.algorithms)
    mm.free()
    return f"  nvmath heuristic {first:8.2f} us, autotuned {tuned:8.2f} us ({count} algorithms)"


def main() -> None:
    rows = [int(a) for a in sys.argv[1:]] or [128, 4096]
    torch.manual_seed(0)
    for m in rows:
        for k, n in SHAPES:
            replays = {name: _graphed(fn) for name, fn in _ways(m, k, n).items()}
            print(f"\nM={m} K={k} N={n}")
            for name, replay in replays.items():
                print(f"  {name:16s} {_device_us(replay):8.2f} us   {_kernels(replay)}")
            print(_nvmath_times(m, k, n))


if __name__ == "__main__":
    main()
