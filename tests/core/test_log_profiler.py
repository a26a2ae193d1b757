"""Dispatch log, explain and the profiler: what they record, their bounds, and the Chrome trace and its paths."""

from __future__ import annotations

import json
import os
import stat
import threading
import warnings

import numpy as np
import pytest
from conftest import make_toy_registry
from rich.console import Console

import xpuruntime as xrt
from xpuruntime.abi import TensorSpec
from xpuruntime.dispatch import Dispatcher
from xpuruntime.errors import (
    ArgumentError,
    KernelFallbackWarning,
)  # fmt: skip
from xpuruntime.profiling import Profiler
from xpuruntime.registry import Backend, kernel

rng = np.random.default_rng(3)
X = rng.standard_normal((3, 4)).astype(np.float32)


def test_dispatch_log_records_kernel_reason_shapes_and_time():
    a = rng.standard_normal((6, 5)).astype(np.float32)
    b = rng.standard_normal((5, 7)).astype(np.float32)
    xrt.ops.matmul(a, b)  # not logged: logging is off
    xrt.enable_dispatch_logging()
    xrt.ops.matmul(a, b)
    with xrt.kernel_policy(matmul="blocked"):
        xrt.ops.matmul(a, b)
        xrt.ops.matmul(a, b)
    with xrt.kernel_policy(matmul="gemv"), warnings.catch_warnings():
        warnings.simplefilter("ignore", KernelFallbackWarning)
        xrt.ops.matmul(a, b)
    logs = xrt.get_dispatch_logs()
    assert [(r.selected_kernel, r.reason, r.cache_hit) for r in logs] == [
        ("numpy_blas", "auto", True), ("blocked", "policy", False), ("blocked", "policy", True),
        ("numpy_blas", "fallback", False),
    ]  # fmt: skip
    record = logs[1]
    assert record.op_name == "matmul" and record.backend == "cpu" and record.dtype == "float32"
    assert record.input_shapes == ((6, 5), (5, 7))
    assert record.elapsed_us > 0 and "BM=6" in record.launch_config
    assert record.as_dict()["selected_kernel"] == "blocked"
    xrt.clear_dispatch_logs()
    assert xrt.get_dispatch_logs() == []


def test_dispatch_log_is_bounded_and_can_be_disabled():
    x = np.ones(4)
    xrt.enable_dispatch_logging(max_records=5)
    for n in range(1, 9):
        xrt.ops.sum(np.ones(n))
    shapes = [r.input_shapes[0] for r in xrt.get_dispatch_logs()]
    assert shapes == [(4,), (5,), (6,), (7,), (8,)]  # the oldest were dropped
    xrt.disable_dispatch_logging()
    xrt.ops.sum(x)
    assert len(xrt.get_dispatch_logs()) == 5


def test_explain_shows_every_candidate_with_verdict_reasons_and_score(capsys):
    explanation = xrt.explain("matmul", TensorSpec((1, 64)), TensorSpec((64, 32)), policy="matmul=blocked")
    printed = capsys.readouterr().out
    rows = {r["kernel"]: r for r in explanation.rows()}
    assert explanation.selected == "blocked"
    assert rows["blocked"]["verdict"] == "selected (policy)" and rows["blocked"]["score"] == 0
    assert rows["gemv"]["verdict"] == "supported" and rows["gemv"]["score"] == 20
    assert rows["numpy_blas"]["score"] == 10
    for name in ("blocked", "gemv", "numpy_blas", "selected (policy)"):
        assert name in printed
    rejected = xrt.explain("attention", TensorSpec((4, 9000, 64)), TensorSpec((4, 9000, 64)),
                           TensorSpec((4, 9000, 64)), show=False)  # fmt: skip
    text = str(rejected)
    assert "math" in text and "score matrix has 324000000 elements" in text and rejected.selected == "chunked"


def test_explain_reports_when_nothing_can_run():
    explanation = xrt.explain("matmul", TensorSpec((4, 4), "bfloat16"), TensorSpec((4, 4), "bfloat16"), show=False)
    assert explanation.selected is None and isinstance(explanation.error, xrt.NoKernelError)
    assert all(r["verdict"] == "rejected" for r in explanation.rows())
    assert "dtype bfloat16 not in" in str(explanation)


def test_explain_fills_attribute_defaults_and_rejects_unknown_ones():
    assert xrt.explain("sum", TensorSpec((3, 4)), show=False).ctx.attrs["axis"] == (1,)
    assert xrt.explain("sum", TensorSpec((3, 4)), axis=None, show=False).ctx.out_shape == ()
    with pytest.raises(xrt.ArgumentError, match="unknown attribute"):
        xrt.explain("sum", TensorSpec((3, 4)), axes=0, show=False)


def test_profiler_records_ops_kernels_ranges_and_exports_chrome_trace(tmp_path):
    a = rng.standard_normal((16, 32)).astype(np.float32)
    b = rng.standard_normal((32, 8)).astype(np.float32)
    with xrt.profiler() as prof:
        with prof.range("forward"):
            y = xrt.ops.matmul(a, b)
            xrt.ops.softmax(y)
        with xrt.record_range("loss"):
            xrt.ops.sum(y, axis=None)
    xrt.ops.matmul(a, b)  # after the block: not recorded
    assert [e.record.op_name for e in prof.ops] == ["matmul", "softmax", "sum"]
    matmul = prof.ops[0]
    assert matmul.flops == 2 * 16 * 32 * 8
    assert matmul.bytes_moved == (16 * 32 + 32 * 8 + 16 * 8) * 4
    assert matmul.record.selected_kernel == "numpy_blas" and matmul.dispatch_us >= matmul.record.elapsed_us > 0
    assert [r.name for r in prof.ranges] == ["forward", "loss"]
    forward = prof.ranges[0]
    assert (
        forward.start_us <= matmul.start_us
        and matmul.start_us + matmul.dispatch_us <= forward.start_us + forward.dur_us
    )

    path = prof.export_chrome_trace(tmp_path / "trace.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.json"]  # written atomically, no temp left
    trace = json.loads(path.read_text())
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["cat"] for e in complete} == {"op", "kernel", "range"}
    op_event = next(e for e in complete if e["cat"] == "op" and e["name"] == "matmul")
    assert op_event["args"]["kernel"] == "numpy_blas" and op_event["args"]["flops"] == 2 * 16 * 32 * 8
    assert all(isinstance(e["ts"], float) and e["dur"] >= 0 for e in complete)
    summary = {row["op"]: row for row in prof.summary()}
    assert summary["matmul"]["calls"] == 1 and summary["matmul"]["gflops"] > 0


class _BrokenPath(os.PathLike):
    """A path-like object whose __fspath__ fails or returns bytes."""

    def __init__(self, result: object) -> None:
        self.result = result

    def __fspath__(self):
        if isinstance(self.result, type):
            raise self.result("no path here")
        return self.result


@pytest.mark.parametrize("result", [ValueError, TypeError, b"trace.json", ""])
def test_export_to_a_broken_path_like_names_the_argument(result) -> None:
    with xrt.profiler() as prof:
        pass
    with pytest.raises(xrt.ArgumentError, match="argument 'path' expected a file path"):
        prof.export_chrome_trace(_BrokenPath(result))


def test_profiler_keeps_the_newest_events_and_counts_the_dropped(tmp_path):
    x = rng.standard_normal((3, 4))
    with xrt.profiler(max_events=5) as prof:
        for _ in range(12):
            with prof.range("step"):
                xrt.ops.sum(x)
        xrt.ops.softmax(x)
    assert len(prof.ops) == 5 and prof.dropped_ops == 8
    assert len(prof.ranges) == 5 and prof.dropped_ranges == 7
    assert prof.dropped_events == 15
    rows = {row["op"]: row for row in prof.summary()}
    assert rows["sum"]["calls"] == 12 and rows["sum"]["dropped"] == 8  # totals count every dispatch
    assert rows["softmax"]["calls"] == 1 and rows["softmax"]["dropped"] == 0
    trace = json.loads(prof.export_chrome_trace(tmp_path / "t.json").read_text())
    assert trace["otherData"]["dropped_events"] == 15
    assert any("15 oldest events dropped" in e["name"] for e in trace["traceEvents"])


def test_profiler_is_bounded_by_default():
    with xrt.profiler() as prof:
        pass
    assert 0 < prof.max_events <= 1_000_000


@pytest.mark.parametrize("bad", [0, -1, None, 2.5, "10", True])
def test_profiler_bound_must_be_a_positive_int(bad):
    with pytest.raises(ArgumentError, match=r"profiler: argument 'max_events' expected an int in \[1, "):
        xrt.profiler(max_events=bad).__enter__()


def _profiled() -> Profiler:
    with xrt.profiler() as prof:
        xrt.ops.sum(rng.standard_normal(4))
    return prof


@pytest.mark.parametrize(
    ("make_path", "message"),
    [
        (lambda tmp: tmp, "is a folder"),
        (lambda tmp: "", "expected a file path"),
        (lambda tmp: tmp / "missing" / "t.json", "does not exist"),
        (lambda tmp: 42, "expected a file path"),
    ],
)
def test_export_chrome_trace_refuses_bad_paths_and_leaves_nothing(tmp_path, make_path, message):
    prof = _profiled()
    with pytest.raises(ArgumentError, match=message):
        prof.export_chrome_trace(make_path(tmp_path))
    assert list(tmp_path.iterdir()) == []


def _read_only_folder(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    if os.access(folder, os.W_OK):  # root writes anyway
        folder.chmod(0o700)
        pytest.skip("running as a user that may write into read-only folders")
    return folder


def test_export_chrome_trace_into_an_unwritable_folder(tmp_path):
    folder = _read_only_folder(tmp_path)
    try:
        with pytest.raises(ArgumentError, match="cannot be written"):
            _profiled().export_chrome_trace(folder / "t.json")
        assert list(folder.iterdir()) == []
    finally:
        folder.chmod(0o700)


def test_export_chrome_trace_cleans_its_temporary_file_when_the_rename_fails(tmp_path, monkeypatch):
    def fail(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(ArgumentError, match="No space left"):
        _profiled().export_chrome_trace(tmp_path / "t.json")
    assert list(tmp_path.iterdir()) == []


def test_max_records_still_bounds_the_log():
    xrt.enable_dispatch_logging(max_records=3)
    for _ in range(5):
        xrt.ops.sum(rng.standard_normal(3))
    assert len(xrt.get_dispatch_logs()) == 3


def test_log_and_profiler_share_one_record_per_dispatch_with_os_thread_ids():
    xrt.enable_dispatch_logging()
    with xrt.profiler() as prof:
        xrt.ops.matmul(X, X.T)
    [record] = xrt.get_dispatch_logs()
    assert prof.ops[0].record is record
    assert prof.ops[0].thread_id == threading.get_native_id()
    trace = prof.chrome_trace()["traceEvents"]
    assert all(e["tid"] < 2**32 for e in trace if e["ph"] == "X")  # Perfetto's JSON importer needs 32-bit tids


def test_explain_and_plan_take_the_ops_input_defaults_and_reject_extra_inputs():
    assert xrt.explain("sin_affine", X, show=False).selected == "numpy"
    assert xrt.default_dispatcher().plan("sin_affine", X).kernel.name == "numpy"
    with pytest.raises(ArgumentError, match=r"matmul: expected at most 2 inputs \('a', 'b'\), got 3"):
        xrt.explain("matmul", X, X.T, X, show=False)
    with pytest.raises(ArgumentError, match="matmul: argument 'b' is required"):
        xrt.explain("matmul", X, show=False)


def test_explain_says_an_unavailable_backends_reason_once():
    """Kernels rejected only because their backend cannot run here share one line; rows() keeps one per kernel."""
    registry = make_toy_registry({"name": "here"})
    registry.register_backend(Backend("far", "cuda", empty=lambda *a: None, probe=lambda: "no CUDA device here"))
    for name in ("far_a", "far_b", "far_c"):
        registry.register_kernel(kernel("toy", name, backend="far")(lambda args: None))
    explanation = Dispatcher(registry).explain("toy", np.ones(3, np.float32))
    assert [r["kernel"] for r in explanation.rows()] == ["here", "far_a", "far_b", "far_c"]
    text = str(explanation)
    assert text.count("no CUDA device here") == 1 and "far_a, far_b, far_c" in text
    console = Console(width=200, record=True)
    explanation.print(console)
    assert console.export_text().count("no CUDA device here") == 1
