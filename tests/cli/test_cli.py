"""The `xpuruntime` command line: info, kernels, explain, run and `python -m xpuruntime`; errors are one line."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from cli_runner import one_line_error, run_cli, table_rows, wide_plain_output  # noqa: F401 (wide_plain_output: a fixture)

import xpuruntime as xrt
from xpuruntime import policy
from xpuruntime.cli import main, parse_literal, parse_shape
from xpuruntime.registry import Backend, KernelSpec, default_registry

pytestmark = pytest.mark.usefixtures("wide_plain_output")


@pytest.fixture
def fake_gpu_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unavailable backend with one matmul kernel, and a backend module that failed to import."""
    registry = default_registry()
    backend = Backend(
        "fakegpu", "cuda", empty=lambda shape, dtype, device, stream: None, probe=lambda: "no CUDA driver here"
    )
    spec = KernelSpec("matmul", "fake_tiled", "fakegpu", launch=lambda args: None, tensor_cores=True, doc="Fake.")
    monkeypatch.setitem(registry.backends, "fakegpu", backend)
    monkeypatch.setitem(registry.kernels["matmul"], "fake_tiled", spec)
    monkeypatch.setitem(registry.missing_backends, "xpuruntime.backends.triton", "No module named 'triton'")


# -- parsing ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "value"),
    [("-1", -1), ("0.5", 0.5), ("1e-5", 1e-5), ("true", True), ("False", False), ("None", None),
     ("(0,1)", (0, 1)), ("0,1", (0, 1)), ("(0,)", (0,)), ("()", ()), ("[2, 3]", (2, 3)), ("float32", "float32")],
)  # fmt: skip
def test_parse_literal(text: str, value: object) -> None:
    parsed = parse_literal(text)
    assert parsed == value and type(parsed) is type(value)


@pytest.mark.parametrize(
    ("text", "shape"), [("256x512", (256, 512)), ("4x16x2048x128", (4, 16, 2048, 128)), ("7", (7,)), ("", ()),
                        ("scalar", ()), ("0x3", (0, 3))],
)  # fmt: skip
def test_parse_shape(text: str, shape: tuple[int, ...]) -> None:
    assert parse_shape(text) == shape


# -- version and info --------------------------------------------------------------------------------
def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "--version")
    assert code == 0
    assert out.strip() == f"xpuruntime {xrt.__version__}"


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys)
    assert code == 2
    assert "usage: xpuruntime" in err


def test_info_reports_versions_backends_devices(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, fake_gpu_backend: None
) -> None:
    real_version = xrt.cli.importlib.metadata.version

    def fake_version(name: str) -> str:
        if name == "onnx":
            return "9.8.7"
        if name in ("torch", "triton"):
            raise xrt.cli.importlib.metadata.PackageNotFoundError(name)
        return real_version(name)

    monkeypatch.setattr(xrt.cli.importlib.metadata, "version", fake_version)
    modules_before = set(sys.modules)
    code, out, _ = run_cli(capsys, "info")
    assert code == 0
    assert xrt.__version__ in out and np.__version__ in out
    assert "9.8.7" in out  # versions come from package metadata...
    assert "onnx" not in set(sys.modules) - modules_before  # ...without importing the package
    rows = table_rows(out)
    assert ["torch", "not installed"] in rows and ["triton", "not installed"] in rows
    backend_rows = {row[0]: row for row in rows if len(row) == 5}
    assert backend_rows["cpu"][2] == "available"
    assert backend_rows["fakegpu"][2] == "unavailable: no CUDA driver here"
    assert "not loaded: No module named 'triton'" in backend_rows["xpuruntime.backends.triton"][2]
    cpu_device = next(row for row in rows if len(row) == 6 and row[0] == "cpu")
    assert cpu_device[3] == str(os.cpu_count())
    assert "CUDA probe:" in out


# -- kernels -----------------------------------------------------------------------------------------
def test_kernels_for_one_op(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "kernels", "matmul")
    assert code == 0
    for name in ("numpy_blas", "blocked", "gemv"):
        assert name in out
    assert "attention" not in out and "chunked" not in out
    gemv = next(line for line in out.splitlines() if "gemv" in line)
    assert "20" in gemv and "float32" in gemv  # priority and dtypes


def test_kernels_lists_every_op(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "kernels")
    assert code == 0
    for op in default_registry().ops:
        assert op in out


def test_kernels_shows_unavailable_backend_reason(capsys: pytest.CaptureFixture[str], fake_gpu_backend: None) -> None:
    code, out, _ = run_cli(capsys, "kernels", "matmul")
    assert code == 0
    fake = next(line for line in out.splitlines() if "fake_tiled" in line)
    assert "no: no CUDA driver here" in fake and "yes" in fake  # unavailable; uses tensor cores


@pytest.mark.parametrize(
    ("op", "hint"), [("nosuchop", "attention, attention_backward"), ("matmull", "Did you mean 'matmul'?")]
)
def test_kernels_unknown_op(capsys: pytest.CaptureFixture[str], op: str, hint: str) -> None:
    code, out, err = run_cli(capsys, "kernels", op)
    assert code == 2
    assert out == ""
    assert f"unknown op '{op}'" in err and hint in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


# -- explain -----------------------------------------------------------------------------------------
def test_explain_selects_gemv_for_matrix_vector(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "explain", "matmul", "--shape", "3x4", "--shape", "4", "--dtype", "float32")
    assert code == 0
    assert "selected 'gemv' (auto)" in out
    assert "numpy_blas" in out and "blocked" in out


def test_explain_policy_preference(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        capsys, "explain", "matmul", "--shape", "256x512", "--shape", "512x128", "--dtype", "float16",
        "--policy", "matmul=blocked",
    )  # fmt: skip
    assert code == 0
    assert "float16[256x512]" in out and "selected 'blocked' (policy)" in out


def test_explain_shape_mismatch_names_argument(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "explain", "matmul", "--shape", "3x4", "--shape", "5x6")
    assert code == 2
    assert "argument 'b'" in err and "ShapeError" not in out
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_explain_strict_policy_shows_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        capsys, "explain", "matmul", "--shape", "8x8", "--shape", "8x8", "--policy", "matmul=gemv,strict=true"
    )
    assert code == 1  # the call is valid, but no kernel would run it
    assert "UnsupportedByPolicyError" in out
    assert "strict policy prefers 'gemv'" in out
    assert "not a matrix-vector product (M=8, N=8)" in out


def test_explain_attrs(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "explain", "sum", "--shape", "3x4x5", "--attr", "axis=(0,2)", "--attr",
                           "keepdims=true")  # fmt: skip
    assert code == 0
    assert "axis=(0, 2), keepdims=True" in out


def test_explain_attention_per_shape_dtypes(capsys: pytest.CaptureFixture[str]) -> None:
    shape = "2x4x16x8"
    code, out, _ = run_cli(capsys, "explain", "attention", "--shape", shape, "--shape", shape, "--shape", shape,
                           "--dtype", "float64", "--dtype", "float64", "--dtype", "float64",
                           "--attr", "is_causal=true")  # fmt: skip
    assert code == 0
    assert "float64[2x4x16x8]" in out and "selected 'math' (auto)" in out and "chunked" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["matmul", "--shape", "3xa", "--shape", "4"], "bad --shape '3xa'"),
        (["matmul", "--shape", "4x4", "--shape", "4x4", "--dtype", "float32", "--dtype", "float16"],
         "argument 'b' expected dtype float32"),
        (["matmul", "--shape", "4", "--shape", "4", "--dtype", "f4", "--dtype", "f4", "--dtype", "f4"],
         "one --dtype for all shapes or one per --shape"),
        (["matmul", "--shape", "4x4", "--shape", "4x4", "--policy", "matmul=cublaslt"], "Did you mean 'cublasLt'?"),
        (["softmax", "--shape", "3x4", "--attr", "bogus=1"], "unknown attribute(s) ['bogus']"),
        (["softmax", "--shape", "3x4", "--attr", "axis"], "bad --attr 'axis'"),
        (["soft_max", "--shape", "3x4"], "Did you mean 'softmax'?"),
        (["matmul", "--shape", "4x4", "--shape", "4x4", "--shape", "4x4"], "expected at most 2 inputs"),
    ],
)  # fmt: skip
def test_explain_errors_are_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    code, out, err = run_cli(capsys, "explain", *argv)
    assert code == 2
    assert out == ""
    assert message in err
    assert err.startswith("xpuruntime explain: error: ") and len(err.strip().splitlines()) == 1


# -- demo --------------------------------------------------------------------------------------------


def test_python_dash_m_entry_point() -> None:
    env = {**os.environ, "COLUMNS": "250"}
    proc = subprocess.run(
        [sys.executable, "-m", "xpuruntime", "demo", "--iterations", "1"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "max-abs error" in proc.stdout
    # a fresh process warns about the fallback: the demo shows it as a note instead of letting it spray
    assert "note (KernelFallbackWarning, fallback): matmul: policy prefers 'gemv'" in proc.stdout
    assert "Warning" not in proc.stderr


def test_explain_rms_norm_of_int32_from_the_cli_has_no_traceback(capsys):
    code = main(["explain", "rms_norm", "--shape", "2x8", "--dtype", "int32", "--attr", "normalized_shape=8"])
    out, err = capsys.readouterr()
    assert code == 2
    assert "Traceback" not in out + err
    assert "rms_norm: argument 'x' expected a floating dtype" in err


def test_bad_policy_file_through_the_environment_gives_the_cli_one_line(tmp_path, monkeypatch, capsys):
    path = tmp_path / "policy.json"
    path.write_bytes(b"\xff\xfe\x00")
    monkeypatch.setenv(policy.ENV_POLICY_FILE, str(path))
    code = main(["explain", "sum", "--shape", "4"])
    out, err = capsys.readouterr()
    assert code == 2 and "Traceback" not in out + err and "not UTF-8" in err


def test_info_names_gpu_backends_and_the_tuning_cache(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("XPURUNTIME_CACHE_DIR", str(tmp_path / "cache"))
    code, out, _ = run_cli(capsys, "info")
    assert code == 0
    assert "GPU backends available:" in out
    assert str(tmp_path / "cache") in out.replace("\n", "")


@pytest.mark.parametrize("kind", ["text", "npy", "truncated npz"])
def test_run_inputs_that_are_not_an_npz_archive(capsys, tmp_path, kind: str) -> None:
    path = tmp_path / "feed.npy" if kind == "npy" else tmp_path / "feed.npz"
    if kind == "text":
        path.write_text("not arrays")
    elif kind == "npy":
        np.save(path, np.zeros(3))
    else:
        np.savez(path, input_ids=np.zeros((2, 16), np.int64), attention_mask=np.ones((2, 16), np.int64))
        path.write_bytes(path.read_bytes()[:300])
    code, out, err = run_cli(capsys, "run", "--inputs", str(path), "--iterations", "0")
    assert code == 2 and out == ""
    assert one_line_error(err, "run") and f"--inputs {str(path)!r}: expected a .npz file" in err


def test_run_rejects_a_negative_iteration_count(capsys) -> None:
    code, out, err = run_cli(capsys, "run", "--iterations", "-1")
    assert code == 2 and out == "" and "--iterations" in err and "Traceback" not in err
