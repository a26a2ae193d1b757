"""`xpuruntime demo`: the encoder under every policy, its decisions and reference check, the trace it writes, and
its GPU run (exercised on CI with CPU tensors standing in for CUDA ones)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_runner import run_cli, table_rows, wide_plain_output  # noqa: F401 (wide_plain_output: a fixture)

import xpuruntime as xrt
from xpuruntime.cli import demo, main
from xpuruntime.log import dispatch_logging_enabled

pytestmark = pytest.mark.usefixtures("wide_plain_output")


def test_demo_runs_every_policy_and_restores_state(capsys: pytest.CaptureFixture[str]) -> None:
    policy_before = xrt.get_kernel_policy()
    assert not dispatch_logging_enabled()
    code, out, err = run_cli(capsys, "demo", "--iterations", "2")
    assert code == 0, out
    for run in demo.RUNS:
        assert run.name in out
    assert "blocked" in out and "chunked" in out and "fallback" in out
    assert "UnsupportedByPolicyError: matmul: strict policy prefers 'gemv'" in out
    assert "max-abs error" in out and "FAIL" not in out
    assert "KernelFallbackWarning" not in err
    assert xrt.get_kernel_policy() == policy_before
    assert not dispatch_logging_enabled()


def test_demo_decisions_count_calls_and_cache_hits(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "demo", "--iterations", "3")
    assert code == 0
    rows = [row for row in table_rows(out) if len(row) == 7]
    blocked = next(row for row in rows if row[2] == "blocked")
    assert blocked[3] == "policy" and blocked[4] == "12"  # 4 matmuls x 3 iterations
    assert int(blocked[5]) >= 8  # each of the 4 signatures misses at most once (earlier tests may have cached it)
    fallback = next(row for row in rows if row[3] == "fallback")
    assert fallback[1:3] == ["matmul", "numpy_blas"]


def test_demo_keeps_logging_on_if_it_was_on(capsys: pytest.CaptureFixture[str]) -> None:
    xrt.enable_dispatch_logging()
    try:
        assert run_cli(capsys, "demo", "--iterations", "1")[0] == 0
        assert dispatch_logging_enabled()
    finally:
        xrt.disable_dispatch_logging()


def test_demo_fails_when_error_exceeds_tolerance(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(demo, "TOLERANCE", 0.0)
    code, out, _ = run_cli(capsys, "demo", "--iterations", "1")
    assert code == 1
    assert "FAIL" in out


def test_demo_reference_matches_float32_forward() -> None:
    size = demo.SIZES["small"]
    inputs = demo.make_inputs(size)
    reference = demo.forward(demo.REFERENCE_OPS, inputs, size.heads)
    assert reference["probs"].dtype == np.float64
    np.testing.assert_allclose(reference["probs"].sum(axis=-1), 1.0)
    errors = demo.max_abs_errors(demo.forward(demo.XRT_OPS, inputs, size.heads), reference)
    assert 0 < errors["probs"] < demo.TOLERANCE and errors["loss"] < demo.TOLERANCE


def test_demo_trace(capsys: pytest.CaptureFixture[str], tmp_path: pytest.TempPathFactory) -> None:
    path = tmp_path / "demo-trace.json"
    code, out, _ = run_cli(capsys, "demo", "--iterations", "2", "--trace", str(path))
    assert code == 0
    assert "GFLOP/s" in out and str(path) in out
    events = json.loads(path.read_text())["traceEvents"]
    matmuls = [e for e in events if e["ph"] == "X" and e["name"] == "matmul"]
    assert len(matmuls) == 8  # only the auto run is profiled: 4 matmuls x 2 iterations
    assert {e["args"]["kernel"] for e in matmuls} == {"numpy_blas"}
    assert [e["name"] for e in events if e.get("cat") == "range"] == ["layer 0", "head"] * 2


def test_demo_trace_into_a_missing_folder_fails_before_running(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    code, out, err = run_cli(capsys, "demo", "--trace", str(tmp_path / "nope" / "t.json"))
    assert code == 2 and out == "" and "does not exist" in err


def test_demo_rejects_zero_iterations(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "demo", "--iterations", "0")
    assert code == 2
    assert "expected an integer from 1 to 100000, got '0'" in err


@pytest.mark.parametrize(
    ("make_arg", "message"),
    [(lambda tmp: str(tmp), "is a folder"), (lambda tmp: "", "expected a file path"),
     (lambda tmp: str(tmp / "no" / "t.json"), "is in a folder that does not exist")],
)  # fmt: skip
def test_demo_trace_path_is_checked_before_any_work(tmp_path, capsys, monkeypatch, make_arg, message):
    import xpuruntime.cli.demo as demo

    monkeypatch.setattr(demo, "forward", lambda *a: pytest.fail("the demo ran before checking --trace"))
    code = main(["demo", "--iterations", "1", "--trace", make_arg(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 2 and "Traceback" not in out + err
    assert err.startswith(f"xpuruntime demo: error: --trace {message}") and "'path'" not in err
    assert not any(p.name.endswith(".tmp") for p in tmp_path.rglob("*"))


def test_demo_gpu_run_with_tensors(capsys, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(demo, "gpu_device", lambda: "cpu")  # CPU tensors take the tensor code path on CI
    code, out, _ = run_cli(capsys, "demo", "--iterations", "1")
    assert code == 0, out
    assert "auto on GPU" in out
    size = demo.SIZES["small"]
    inputs = demo.to_device(demo.make_inputs(size), "cpu")
    assert all(isinstance(v, torch.Tensor) for v in inputs.values())
    outputs = demo.forward(demo.XRT_OPS, inputs, size.heads)
    reference = demo.forward(demo.REFERENCE_OPS, demo.make_inputs(size), size.heads)
    errors = demo.max_abs_errors({k: v.numpy() for k, v in outputs.items()}, reference)
    assert max(errors.values()) < demo.TOLERANCE


def test_demo_gpu_run_failure_fails_the_demo(capsys, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setattr(demo, "gpu_device", lambda: "cpu")
    real = demo.run_policy

    def gpu_run_fails(run, inputs, size, iterations):
        if run is demo.GPU_RUN:
            raise demo.xrt.ArgumentError("attention: no CUDA kernel for these tensors")
        return real(run, inputs, size, iterations)

    monkeypatch.setattr(demo, "run_policy", gpu_run_fails)
    code, out, _ = run_cli(capsys, "demo", "--iterations", "1")
    assert code == 1
    assert "no CUDA kernel for these tensors" in out and "the run failed" in out
