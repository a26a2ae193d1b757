"""The benchmark suite: our kernels and paths beside their anchors, one module per subject.

    xpuruntime bench [--only SUBJECT_OR_ROW] [--out DIR] [--timer device|do_bench] [--list]
    xpuruntime bench report RESULT.json ... --output BENCHMARKS.md

Subjects: `gemm` (cuBLASLt, the Triton matmul, GEMV), `attention`, `norm`, `elementwise` (fused elementwise
and reductions), `host` (dispatch overhead and aten-override cost), `inference` (InferenceSession), `zoo` (real exported
models: CPU beside onnxruntime, GPU beside torch.compile and eager, session creation) and `training` (the
example's training step under a policy). A run writes one result file, STEM.json, with the
machine, versions, commit and date beside every row, and STEM.md and STEM.png (ratios on a log scale) next
to it; `report` turns result files into BENCHMARKS.md.

Adding rows
-----------
A subject is one module in this package with a list `ROWS` (modules whose name starts with "_" are skipped).
Each `Row` names the row, a group within the subject, and a `setup` that builds random inputs when the row
runs and returns a `Setup`: `ours` and `anchor`, two callables doing the same work, and the bytes or FLOPs
one call moves or does (the rates in the table come from them). For example::

    from .common import close, needs_cuda, randn
    from .row import Row, Setup

    def _softmax() -> Setup:
        import torch
        import xpuruntime as xrt

        x = randn(8192, 4096, dtype="bfloat16")
        ours = lambda: xrt.ops.softmax(x)
        return Setup(ours, anchor=lambda: torch.softmax(x, -1), bytes=2 * 2 * x.numel(),
                     check=lambda: close(ours(), torch.softmax(x, -1), 2e-2))

    ROWS = [Row("softmax 8192x4096 bf16", "softmax", _softmax, target=1.0, units="TB/s",
                requires=needs_cuda, anchor="torch.softmax", doc="Triton softmax forward")]

The runner calls `ours` once (compilation, tuning) and runs `check`, then times ours, the anchor and any
`alternatives` (`common.kernel_alternatives`: every registered kernel forced by policy, and "auto")
interleaved. `target` is a ratio of ours over the anchor's throughput (`target_kind="ratio"`, the default),
an absolute rate of ours ("TB/s", "TFLOP/s"), or the µs ours may cost beyond the anchor ("µs over anchor",
for host-cost rows). Rows that cannot alternate call by call (a training step under a policy that installs
process-wide overrides) give `Setup.measure`, which times all variants itself and returns their medians.
`requires` says why a row cannot run on this machine; it is then reported as skipped.
"""

from __future__ import annotations

from .cli import add_arguments, main, run_cli
from .common import kernel_alternatives
from .report import markdown, write_run
from .row import Result, Row, Setup
from .runner import discover, evaluate, run, run_row, select
from .timing import default_timer, device_timer, do_bench_timer, host_timer, interleaved, interleaved_samples

__all__ = [
    "Result", "Row", "Setup", "add_arguments", "default_timer", "device_timer", "discover", "do_bench_timer",
    "evaluate", "host_timer", "interleaved", "interleaved_samples", "kernel_alternatives", "main", "markdown",
    "run", "run_cli", "run_row", "select", "write_run",
]  # fmt: skip
