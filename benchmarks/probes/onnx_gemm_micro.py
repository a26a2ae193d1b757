"""Single-threaded fp32 GEMM micro-benchmark at the zoo's CPU GEMM shapes (issue 28): NumPy/OpenBLAS against
PyTorch's CPU BLAS (MKL in the x86 wheels), weights in both layouts, with and without a bias, interleaved rounds.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/probes/onnx_gemm_micro.py [rounds]

Prints, per shape (M, K, N), each method's median time per call and GFLOP/s, and its ratio to the current
runner's method ("np gemm now": np.matmul then `y + c`, a fresh array each; "np matmul": np.matmul, no bias).
"""

from __future__ import annotations

import os
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import torch

torch.set_num_threads(1)

# (M, K, N, bias): GPT-2 B1 (Gemm + bias, MatMul), BERT/ViT-like (768 / 3072 wide), B8 rows
SHAPES = [
    (128, 768, 2304, True), (128, 768, 768, True), (128, 768, 3072, True), (128, 3072, 768, False),
    (197, 768, 3072, True), (197, 3072, 768, False), (128, 1024, 5632, False), (128, 2816, 1024, False),
    (1024, 768, 3072, True), (1024, 3072, 768, False),
]  # fmt: skip


def methods(m: int, k: int, n: int, bias: bool) -> dict:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=np.float32)
    w = rng.standard_normal((k, n), dtype=np.float32) * 0.03  # (K, N) as the exports hold it
    wt = np.ascontiguousarray(w.T)  # (N, K): nn.Linear's layout
    c = rng.standard_normal(n, dtype=np.float32)
    out = np.empty((m, n), np.float32)
    ta, tw, twt, tc, tout = (torch.from_numpy(x) for x in (a, w, wt, c, out))
    if bias:
        return {
            "np gemm now": lambda: np.matmul(a, w) + c,
            "np out= +=": lambda: (np.matmul(a, w, out=out), np.add(out, c, out=out)),
            "np W^T out= +=": lambda: (np.matmul(a, wt.T, out=out), np.add(out, c, out=out)),
            "torch addmm KN": lambda: torch.addmm(tc, ta, tw),
            "torch addmm KN out=": lambda: torch.addmm(tc, ta, tw, out=tout),
            "torch addmm NK^T out=": lambda: torch.addmm(tc, ta, twt.t(), out=tout),
            "torch linear NK": lambda: torch.nn.functional.linear(ta, twt, tc),
        }
    return {
        "np matmul": lambda: np.matmul(a, w, out=out),
        "np W^T": lambda: np.matmul(a, wt.T, out=out),
        "torch mm KN out=": lambda: torch.mm(ta, tw, out=tout),
        "torch mm NK^T out=": lambda: torch.mm(ta, twt.t(), out=tout),
    }


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    print(f"torch {torch.__version__} threads {torch.get_num_threads()}; numpy {np.__version__}")
    for m, k, n, bias in SHAPES:
        fns = methods(m, k, n, bias)
        for fn in fns.values():
            fn()
            fn()
        reps = max(1, int(2e9 / (2 * m * k * n)))  # ~2 GFLOP per sample
        times: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(rounds):
            for name, fn in fns.items():
                start = time.perf_counter()
                for _ in range(reps):
                    fn()
                times[name].append((time.perf_counter() - start) / reps)
        base = statistics.median(next(iter(times.values())))
        print(f"M={m} K={k} N={n} bias={bias} ({reps} reps x {rounds} rounds)")
        for name, ts in times.items():
            t = statistics.median(ts)
            print(f"  {name:24s} {t * 1e3:8.3f} ms  {2 * m * k * n / t / 1e9:6.1f} GFLOP/s  x{base / t:.3f}")


if __name__ == "__main__":
    main()
