"""CLI pieces of the GPU work: `info` names GPU backends and the tuning cache, `bench`, and the demo's GPU run
(exercised on CI with CPU tensors standing in for CUDA ones)."""

from __future__ import annotations

import pytest

from xpuruntime.cli import demo, main


def run_cli(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_info_names_gpu_backends_and_the_tuning_cache(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("XPURUNTIME_CACHE_DIR", str(tmp_path / "cache"))
    code, out, _ = run_cli(capsys, "info")
    assert code == 0
    assert "GPU backends available:" in out
    assert str(tmp_path / "cache") in out.replace("\n", "")


def test_bench_list_and_empty_selection(capsys, tmp_path):
    code, out, _ = run_cli(capsys, "bench", "--list")
    assert code == 0
    code, out, _ = run_cli(capsys, "bench", "--only", "no-row-is-called-this", "--out", str(tmp_path))
    assert code == 1 and "no benchmark rows selected" in out


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
