"""InferenceSession on the CPU against onnxruntime on the same models (the built-in onnx.helper encoder and,
with PyTorch, an exported MiniLM-shaped encoder), timed interleaved in one process.

    OPENBLAS_NUM_THREADS=1 PYTHONPATH=src python benchmarks/inference_cpu.py OUT.json [--threads N]

Both runtimes get the same thread count (onnxruntime's intra-op threads; NumPy's BLAS threads come from
OPENBLAS_NUM_THREADS, which must be set before NumPy loads). Reports per-process CPU time and wall
time medians: the CPU-time figure is the stable one on a shared machine.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time

import numpy as np
import onnxruntime as ort

from xpuruntime.onnx import InferenceSession
from xpuruntime.onnx.builtin import encoder_inputs, encoder_model


def timed(fn, repeats: int) -> tuple[float, float]:
    """(median CPU ms, median wall ms) of `fn` after two warm-up calls."""
    fn()
    fn()
    cpu, wall = [], []
    for _ in range(repeats):
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        cpu.append((time.process_time() - c0) * 1e3)
        wall.append((time.perf_counter() - w0) * 1e3)
    return statistics.median(cpu), statistics.median(wall)


def models() -> list[tuple[str, bytes, callable]]:
    found = [("builtin encoder (2 layers, hidden 128, FFN 512)", encoder_model().SerializeToString(),
              lambda b, s: encoder_inputs(b, s))]  # fmt: skip
    try:
        sys.path.insert(0, os.path.dirname(__file__))
        import torch
        from inference_gpu import Encoder, export, feed

        torch.manual_seed(0)
        found.append(("MiniLM-shaped encoder (6 layers, hidden 384, FFN 1536), exported from PyTorch",
                      export(Encoder().eval(), "cpu"), feed))  # fmt: skip
    except ImportError:
        pass
    return found


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else "inference_cpu.json"
    threads = int(sys.argv[sys.argv.index("--threads") + 1]) if "--threads" in sys.argv else 1
    rows = []
    for name, data, make_feed in models():
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        reference = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
        session = InferenceSession(data)
        for batch, seq in ((1, 64), (8, 128)):
            feed = make_feed(batch, seq)
            err = float(np.abs(session.run(None, feed)[0] - reference.run(None, feed)[0]).max())
            repeats = 30 if batch == 1 else 10
            ours, theirs = [], []
            for _ in range(3):  # interleaved rounds: both see the same machine load
                theirs.append(timed(lambda r=reference, f=feed: r.run(None, f), repeats))
                ours.append(timed(lambda s=session, f=feed: s.run(None, f), repeats))
            ort_cpu, ort_wall = min(t[0] for t in theirs), min(t[1] for t in theirs)
            xrt_cpu, xrt_wall = min(t[0] for t in ours), min(t[1] for t in ours)
            row = {"model": name, "batch": batch, "seq": seq, "threads": threads, "max_abs_err": err,
                   "ort_cpu_ms": ort_cpu, "xrt_cpu_ms": xrt_cpu, "ratio_cpu_time": xrt_cpu / ort_cpu,
                   "ort_wall_ms": ort_wall, "xrt_wall_ms": xrt_wall, "ratio_wall": xrt_wall / ort_wall,
                   "plan": session.plan_summary()}  # fmt: skip
            rows.append(row)
            print(f"{name[:40]:40} B{batch:<2} S{seq:<4} ort {ort_cpu:7.3f} ms  xrt {xrt_cpu:7.3f} ms  "
                  f"ratio {row['ratio_cpu_time']:.2f} (wall {row['ratio_wall']:.2f})  err {err:.1e}", flush=True)  # fmt: skip
    info = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "onnxruntime": ort.__version__, "numpy": np.__version__,
            "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS", "default"), "rows": rows}  # fmt: skip
    with open(out, "w") as f:
        json.dump(info, f, indent=1)


if __name__ == "__main__":
    main()
