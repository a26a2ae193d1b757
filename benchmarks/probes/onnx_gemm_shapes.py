"""The GEMM shapes of a zoo model's CPU session (issue 28): every kernel/op-map step of MatMul, Gemm or an xrt
linear-like op, with its input shapes, whether each input is a constant, their C-contiguity, the attributes and
what runs it. GPT-2 B1: Gemm 128x768 by (768, 2304|768|3072) + bias and MatMul 128x3072 by (3072, 768),
12 each; BERT B1: the same four as MatMul (bias Adds apart); ViT-B/16 B1: the same at 197 rows; Llama B1: 128 rows
by (1024, 1536|1024|5632) and (2816, 1024).

    PYTHONPATH=src python benchmarks/probes/onnx_gemm_shapes.py gpt2 1      # model, batch
    (saves the export to /tmp/zoo_<model>.onnx for the other probes)
"""

from __future__ import annotations

import collections
import os
import sys

import numpy as np


def export_path(name: str) -> str:
    return f"/tmp/zoo_{name}.onnx"


def model_bytes(name: str) -> bytes:
    path = export_path(name)
    if not os.path.exists(path):
        from xpuruntime.bench.zoo import _model

        _, data = _model(name, "cpu", "float32")
        with open(path, "wb") as f:
            f.write(data)
    with open(path, "rb") as f:
        return f.read()


def main() -> None:
    from xpuruntime.bench.zoo_models import ZOO
    from xpuruntime.onnx import InferenceSession, SessionOptions

    name, batch = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1
    session = InferenceSession(model_bytes(name), SessionOptions(intra_op_num_threads=1))
    feed = ZOO[name].feed("real", batch, np.random.default_rng(0), None)
    session.run(None, feed)
    plan = session.runner.last_plan()
    counts: collections.Counter = collections.Counter()
    # the plan's steps run one by one (no reused buffers) to see the shapes
    values = list(plan.plain_template if getattr(plan, "plain_template", None) else plan.template)
    for s, a in zip(plan.input_slots, feed.values()):
        values[s] = a
    for step in plan.steps:
        ins = [values[i] for i in step.inputs]
        node = step.node
        if node.op in ("MatMul", "Gemm") or "linear" in node.op or "matmul" in node.op:
            shapes = tuple(tuple(getattr(x, "shape", ())) for x in ins if x is not None)
            const = [plan.template[i] is not None for i in step.inputs]
            contig = [bool(getattr(x, "flags", None) and x.flags.c_contiguous) for x in ins if x is not None]
            key = (node.domain or "", node.op, shapes, tuple(const), tuple(contig), dict(node.attrs).__repr__(),
                   step.describe())  # fmt: skip
            counts[key] += 1
        step.run(values)
    for key, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        print(n, "x", *key)


if __name__ == "__main__":
    main()
