"""Edge cases of the command line, the bench runner's CLI and the training example: bad arguments give a
one-line error and exit code 2 (no traceback, no work done first), and reports name only the files written."""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import numpy as np
import pytest

from xpuruntime import bench
from xpuruntime.bench import Row, Setup
from xpuruntime.cli import main

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "train_gpt.py")


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line_error(err: str, command: str) -> bool:
    return err.startswith(f"xpuruntime {command}: error: ") and len(err.strip().splitlines()) == 1


@pytest.fixture
def counted_rows(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Two CPU rows (one skipped) in place of the real suite; returns the names of the rows set up so far."""
    monkeypatch.delenv("COLUMNS", raising=False)  # output to a pipe: rich's default width of 80
    calls: list[str] = []

    def setup() -> Setup:
        calls.append("cpu row")
        x = np.random.default_rng().standard_normal(1000)
        return Setup(lambda: np.sin(x), lambda: np.sin(x).copy(), bytes=2 * x.nbytes)

    rows = [Row("cpu row", "g", setup, target=0.5), Row("gpu row", "g", setup, requires=lambda: "needs a CUDA GPU")]
    monkeypatch.setattr(bench, "discover", lambda: (rows, []))
    monkeypatch.setattr(bench, "default_timer", lambda kind="device": bench.host_timer(warmup=1, repeat=3))
    return calls


# -- xpuruntime bench --------------------------------------------------------------------------------
def test_bench_out_that_cannot_be_a_folder_fails_before_any_row(capsys, tmp_path, counted_rows) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, out, err = run_cli(capsys, "bench", "--out", str(blocker / "sub"))
    assert code == 2 and counted_rows == [] and out == ""  # nothing measured only to be thrown away
    assert one_line_error(err, "bench") and "--out" in err and "Traceback" not in err


def test_python_dash_m_bench_reports_a_bad_out_folder_as_a_one_line_error(capsys, tmp_path, counted_rows) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code = bench.main(["--out", str(blocker)])  # the body of `python -m xpuruntime.bench`
    assert code == 2 and counted_rows == []
    assert one_line_error(capsys.readouterr().err, "bench")


def test_bench_names_only_the_reports_it_wrote(capsys, tmp_path, counted_rows) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "ratios.png").write_bytes(b"an older run's chart")
    code, text, _ = run_cli(capsys, "bench", "--only", "gpu row", "--out", str(out))
    assert code == 0 and counted_rows == []
    assert "skipped: needs a CUDA GPU" in text
    assert not (out / "ratios.png").exists()  # no ratio to plot: no chart left beside these results
    assert "ratios.png" not in text and "results.json" in text
    code, text, _ = run_cli(capsys, "bench", "--out", str(out))
    assert code == 0 and (out / "ratios.png").exists() and "ratios.png" in text
    assert [r["name"] for r in json.loads((out / "results.json").read_text())["rows"]] == ["cpu row", "gpu row"]
    assert all(line in text.splitlines() for line in (out / "results.md").read_text().splitlines())  # unwrapped


# -- xpuruntime run ----------------------------------------------------------------------------------
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


# -- examples/train_gpt.py ---------------------------------------------------------------------------
def _example():
    spec = importlib.util.spec_from_file_location("train_gpt_edge", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "0"], "--steps"),
        (["--steps", "2", "--profile-steps", "3"], "--profile-steps"),
        (["--policy", "garbage"], "expected 'op=kernel' items"),
        (["--policy", "matmul=nosuch"], "unknown kernel 'nosuch'"),
    ],
)  # fmt: skip
def test_example_bad_arguments_are_usage_errors(capsys, argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as exc:
        _example().parse_args(["--tiny", "--device", "cpu", *argv])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_example_policy_string_takes_options_like_the_cli() -> None:
    example = _example()
    args = example.parse_args(["--tiny", "--device", "cpu", "--policy", "matmul=numpy_blas,strict=true"])
    policy = example.make_policy(args)
    assert policy.strict and policy.preferences == {"matmul": "numpy_blas"}
    args = example.parse_args(["--tiny", "--policy", "matmul=numpy_blas", "--strict", "--autotune"])
    policy = example.make_policy(args)
    assert policy.strict and policy.preferences == {"matmul": "numpy_blas"}
    assert policy.autotune_ops == {"attention", "layer_norm"}
    assert example.make_policy(example.parse_args(["--tiny"])) is None


def test_bench_without_matplotlib_still_writes_its_reports(capsys, tmp_path, counted_rows, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `pip install xpuruntime[torch,cuda]` has no matplotlib
    code, text, err = run_cli(capsys, "bench", "--out", str(tmp_path))
    assert code == 0 and err == "" and counted_rows == ["cpu row"]
    assert (tmp_path / "results.json").exists() and (tmp_path / "results.md").exists()
    assert not (tmp_path / "ratios.png").exists()
    assert "matplotlib is not installed" in text and "pip install 'xpuruntime[bench]'" in text


def test_a_wrong_result_never_counts_as_a_met_target() -> None:
    """A row whose check fails is 'wrong' in the markdown; the JSON's `met` (and the chart's green) must not
    call its speed a success."""
    x = np.random.default_rng().standard_normal(1000)
    fast, slow = (lambda: np.sin(x)), (lambda: np.sin(x).copy())
    setup = Setup(fast, slow, bytes=2 * x.nbytes, check=lambda: "max error 0.5 > 1e-3")
    result = bench.run_row(Row("w", "g", lambda: setup, target=0.5), lambda fn: 1.0 if fn is fast else 2.0)
    assert result.status == "wrong" and result.ratio == pytest.approx(2.0)  # measured, and shown
    assert result.met is None and result.missed_by is None
    assert "| wrong: max error 0.5 > 1e-3 |" in bench.markdown([result], {})
