"""In-process A/B of the ONNX CPU MatMul/Gemm path (issue 28): two sessions of one zoo model in one process, one
planned with the packed oneDNN GEMM off (`linalg.ONEDNN_GEMM = False`: MatMul through the selector's numpy_blas
kernel, Gemm through np.matmul) and one with it on, beside onnxruntime, one thread each, runs interleaved.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/probes/onnx_gemm_ab.py gpt2 1 [rounds]

Prints each one's median ms, onnxruntime / ours for both, new / old speed-up, max |diff| to onnxruntime, and
the resident memory before and after (the packed weights are a second copy of the GEMM weights).
"""

from __future__ import annotations

import os
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    import onnxruntime as ort
    import torch

    from xpuruntime.bench.zoo_models import ZOO
    from xpuruntime.onnx import InferenceSession, SessionOptions
    from xpuruntime.onnx.ops import linalg

    sys.path.insert(0, os.path.dirname(__file__))
    from onnx_gemm_shapes import model_bytes

    torch.set_num_threads(1)
    name, batch = sys.argv[1], int(sys.argv[2])
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 15
    data = model_bytes(name)
    feed = ZOO[name].feed("real", batch, np.random.default_rng(0), None)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    reference = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    linalg.ONEDNN_GEMM = False
    rss_start = rss_mb()
    old = InferenceSession(data, SessionOptions(intra_op_num_threads=1))
    old.run(None, feed)
    old.run(None, feed)
    linalg.ONEDNN_GEMM = True
    rss_middle = rss_mb()
    new = InferenceSession(data, SessionOptions(intra_op_num_threads=1))
    new.run(None, feed)
    new.run(None, feed)  # the weights are packed by now (the planning run sees them twice)
    rss_end = rss_mb()
    want = reference.run(None, feed)[0]
    for label, s in (("old", old), ("new", new)):
        print(f"{label}: max |diff| to onnxruntime {float(np.abs(s.run(None, feed)[0] - want).max()):.2e}")
    runs = {"ort": lambda: reference.run(None, feed), "old": lambda: old.run(None, feed),
            "new": lambda: new.run(None, feed)}  # fmt: skip
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(rounds):
        for k, fn in runs.items():
            start = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - start)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print(f"{name} B{batch}, {rounds} interleaved rounds: " + ", ".join(f"{k} {v:.1f} ms" for k, v in med.items()))
    print(f"  ort/old {med['ort'] / med['old']:.3f}  ort/new {med['ort'] / med['new']:.3f}  "
          f"old/new {med['old'] / med['new']:.3f}; resident after two runs: old session {rss_middle - rss_start:+.0f} MB, "
          f"new {rss_end - rss_middle:+.0f} MB")  # fmt: skip


if __name__ == "__main__":
    main()
