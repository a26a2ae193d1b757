"""The benchmark runner and `xpuruntime bench`: discovery, filtering, ratios against targets, reports (JSON, markdown,
PNG), and bad arguments refused before any row runs."""

from __future__ import annotations

import json
import sys
import textwrap

import numpy as np
import pytest
from cli_runner import one_line_error, run_cli

import xpuruntime as xrt
from xpuruntime import bench
from xpuruntime.bench import Result, Row, Setup, report, timing
from xpuruntime.install import pip_hint


def fixed_timer(times: dict):
    """A timer that answers a preset time per callable (so ratios are known exactly)."""
    return lambda fn: times[fn]


def make_setup(nbytes=0, flops=0, **extra):
    def ours():
        return None

    def anchor():
        return None

    return Setup(ours, anchor, bytes=nbytes, flops=flops, **extra), ours, anchor


def test_ratio_target_met_and_missed():
    rng = np.random.default_rng()
    ours_ms, anchor_ms = (float(t) for t in rng.uniform(0.5, 2.0, size=2))
    setup, ours, anchor = make_setup(nbytes=int(rng.integers(10**6, 10**9)))
    ratio = anchor_ms / ours_ms
    row_met = Row("r", "g", lambda: setup, target=ratio * 0.99)
    row_missed = Row("r", "g", lambda: setup, target=ratio * 1.25)
    timer = fixed_timer({ours: ours_ms, anchor: anchor_ms})
    met = bench.run_row(row_met, timer)
    missed = bench.run_row(row_missed, timer)
    assert met.status == "ok" and met.met is True and met.missed_by is None
    assert met.ratio == pytest.approx(ratio)
    assert missed.met is False and missed.missed_by == pytest.approx(1 - 1 / 1.25)
    assert met.ours_value == pytest.approx(setup.bytes / (ours_ms * 1e-3) / 1e12)
    assert met.anchor_value == pytest.approx(setup.bytes / (anchor_ms * 1e-3) / 1e12)


def test_absolute_target_uses_our_rate_and_anchor_work_scales_the_ratio():
    flops = 2 * 4096**3
    setup, ours, anchor = make_setup(nbytes=3 * 10**8, flops=flops, anchor_bytes=6 * 10**8)
    row = Row("gemv", "gemm", lambda: setup, target=2.0, target_kind="TB/s", units="TB/s")
    result = bench.run_row(row, fixed_timer({ours: 0.1, anchor: 0.25}))
    assert result.ours_value == pytest.approx(3.0)
    assert result.anchor_value == pytest.approx(2.4)
    assert result.ratio == pytest.approx(3.0 / 2.4)  # throughput ratio, not time ratio
    assert result.met is True
    tflops_row = Row("mm", "gemm", lambda: setup, target=1500, target_kind="TFLOP/s", units="TFLOP/s")
    result = bench.run_row(tflops_row, fixed_timer({ours: 0.1, anchor: 0.1}))
    assert result.ours_value == pytest.approx(flops / 1e-4 / 1e12)
    assert result.met is False and result.missed_by == pytest.approx(1 - result.ours_value / 1500)


def test_errors_skips_and_wrong_results_never_raise():
    def broken():
        raise RuntimeError("no kernel for this")

    setup, ours, anchor = make_setup(nbytes=10, check=lambda: "max error 0.5 > 1e-3")
    timer = fixed_timer({ours: 1.0, anchor: 1.0})
    error = bench.run_row(Row("e", "g", broken), timer)
    skipped = bench.run_row(Row("s", "g", broken, requires=lambda: "needs a GPU"), timer)
    wrong = bench.run_row(Row("w", "g", lambda: setup, target=1.0), timer)
    assert error.status == "error" and "no kernel for this" in error.message
    assert skipped.status == "skipped" and skipped.message == "needs a GPU"
    assert wrong.status == "wrong" and "max error" in wrong.message


def test_row_rejects_unknown_target_kind_and_units():
    with pytest.raises(ValueError, match="target_kind"):
        Row("x", "g", lambda: None, target_kind="GB/s")
    with pytest.raises(ValueError, match="units"):
        Row("x", "g", lambda: None, units="furlongs")


@pytest.fixture
def row_package(tmp_path, monkeypatch):
    """A throwaway package with two row modules, one broken module and one private module."""
    pkg = tmp_path / "fakebench"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    body = """
        import numpy as np
        from xpuruntime.bench import Row, Setup

        def _setup(n):
            x = np.random.default_rng().standard_normal(n)
            return lambda: Setup(lambda: np.sin(x), lambda: np.sin(x).copy(), bytes=2 * x.nbytes)

        ROWS = [Row("{name} small", "{group}", _setup(1001), target=0.5),
                Row("{name} large", "{group}", _setup(20001), target=0.5)]
    """
    (pkg / "norm.py").write_text(textwrap.dedent(body.format(name="layer_norm", group="norm")))
    (pkg / "gemm.py").write_text(textwrap.dedent(body.format(name="matmul", group="gemm")))
    (pkg / "broken.py").write_text("import not_a_module_anywhere\n")
    (pkg / "_helpers.py").write_text("ROWS = 'not rows'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "fakebench"
    for name in [m for m in sys.modules if m.startswith("fakebench")]:
        del sys.modules[name]


def test_discovery_collects_rows_and_reports_broken_modules(row_package):
    rows, failures = bench.discover(row_package)
    assert sorted(r.name for r in rows) == ["layer_norm large", "layer_norm small", "matmul large", "matmul small"]
    assert [m for m, _ in failures] == ["fakebench.broken"] and "ModuleNotFoundError" in failures[0][1]
    assert [r.name for r in bench.select(rows, ["NORM"])] == ["layer_norm small", "layer_norm large"]
    assert {r.name for r in bench.select(rows, ["large"])} == {"matmul large", "layer_norm large"}
    assert len(bench.select(rows, None)) == 4 and bench.select(rows, ["nothing"]) == []


def test_a_run_writes_one_result_file_with_its_markdown_and_chart(row_package, tmp_path):
    rows, failures = bench.discover(row_package)
    assert {r.subject for r in rows} == {"gemm", "norm"}  # each row's subject is its module
    seen = []
    results = bench.run(rows, timer=bench.host_timer(warmup=1, repeat=3), progress=True,
                        on_result=lambda done: seen.append([r.name for r in done]))  # fmt: skip
    assert seen == [[r.name for r in rows[: i + 1]] for i in range(len(rows))]  # reports can follow each row
    out = tmp_path / "out"
    doc = report.document([], failures)
    written = bench.write_run(results, out, "run", doc)
    assert [p.name for p in written] == ["run.json", "run.md", "run.png"]
    saved = json.loads((out / "run.json").read_text())
    assert saved["format"] == report.FORMAT and saved["date"].endswith("Z") and saved["versions"]["numpy"]
    assert saved["machine"]["cpu"] and saved["machine"]["cpu_count"] >= 1
    assert saved["commit"] is None or len(saved["commit"].split("+")[0]) == 10
    assert [r["name"] for r in saved["rows"]] == [r.name for r in rows]
    assert all(r["status"] == "ok" and r["ours_ms"] > 0 and r["ratio"] > 0 for r in saved["rows"])
    assert saved["module_failures"][0]["module"] == "fakebench.broken"
    text = (out / "run.md").read_text()
    assert "### gemm" in text and "### norm" in text
    for r in results:
        assert f"| {r.name} |" in text
        assert ("met" if r.met else "missed by") in text
    png = (out / "run.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000


def test_markdown_says_by_how_much_a_target_is_missed():
    r = Result("ln", "norm", "TB/s", 1.3, "ratio", 1.0, 1.1, 2.0, 2.2, 1.1, False, (1.3 - 1.1) / 1.3)
    line = bench.markdown([r], {})
    assert "missed by 15.4 %" in line and "≥ 1.3×" in line


def test_a_host_cost_target_is_met_by_few_enough_microseconds_over_the_anchor():
    setup, ours, anchor = make_setup()
    row = Row("dispatch", "host", lambda: setup, target=3.0, target_kind="µs over anchor", units="µs")
    met = bench.run_row(row, fixed_timer({ours: 0.0042, anchor: 0.0020}))
    assert met.ours_value == pytest.approx(4.2) and met.anchor_value == pytest.approx(2.0)
    assert met.met is True and met.missed_by is None
    missed = bench.run_row(row, fixed_timer({ours: 0.0065, anchor: 0.0020}))
    assert missed.met is False and missed.missed_by == pytest.approx(0.5)  # 4.5 µs over: 1.5 µs past 3
    assert "≤ +3 µs" in bench.markdown([missed], {}) and "missed by 50.0 %" in bench.markdown([missed], {})


def test_a_setup_that_measures_itself_gives_the_times_it_measured():
    setup, _, _ = make_setup(nbytes=10**9)
    setup.measure = lambda timer: {"ours": 2.0, "anchor": 3.0, "other": 4.0}
    result = bench.run_row(Row("step", "training", lambda: setup, target=1.05, units="ms"), fixed_timer({}))
    assert (result.ours_ms, result.anchor_ms, result.ratio, result.met) == (2.0, 3.0, 1.5, True)
    assert result.alternatives_ms == {"other": 4.0}


def test_cli_only_filter_and_list(row_package, tmp_path, monkeypatch, capsys):
    discover = bench.discover
    monkeypatch.setattr(bench.cli, "discover", lambda: discover(row_package))
    monkeypatch.setattr(bench.cli, "default_timer", lambda kind="device": bench.host_timer(warmup=1, repeat=3))
    assert bench.main(["--only", "matmul", "--out", str(tmp_path / "o"), "--name", "run"]) == 0
    doc = json.loads((tmp_path / "o" / "run.json").read_text())
    assert {r["name"] for r in doc["rows"]} == {"matmul small", "matmul large"}
    assert bench.main(["--list"]) == 0
    assert "layer_norm small" in capsys.readouterr().out
    assert bench.main(["--only", "nothing-matches", "--out", str(tmp_path / "p")]) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["device", "do_bench"])
def test_gpu_timers_time_ours_and_the_anchor_on_the_device(tmp_path, kind):
    torch = pytest.importorskip("torch")
    n = 1 << 24
    x = torch.randn(n, device="cuda")
    out = torch.empty_like(x)

    def setup():
        return Setup(lambda: torch.sin(x, out=out), lambda: torch.sin(x), bytes=2 * x.nbytes,
                     check=lambda: None if torch.allclose(torch.sin(x), out) else "sin differs")  # fmt: skip

    row = Row("sin 16M fp32", "elementwise", setup, target=0.5, units="TB/s")
    result = bench.run([row], timer=timing.TIMERS[kind](warmup_ms=5, rep_ms=20), progress=False)[0]
    assert result.status == "ok", result.message
    assert 0.3 < result.ours_value < 6.0 and 0.5 < result.ratio < 2.0  # same kernel both ways: ratio near 1
    doc = report.document([result])
    assert doc["machine"]["gpu"] == torch.cuda.get_device_name() and doc["machine"]["compute_capability"]
    bench.write_run([result], tmp_path, "gpu", doc)
    assert torch.cuda.get_device_name() in (tmp_path / "gpu.md").read_text()


def test_kernel_alternatives_force_each_supported_kernel_and_report_auto_vs_best():

    rng = np.random.default_rng()
    a = rng.standard_normal((33, 17)).astype(np.float32)
    b = rng.standard_normal((17, 9)).astype(np.float32)
    alternatives = bench.kernel_alternatives("matmul", lambda: xrt.ops.matmul(a, b), a, b)
    supported = [c.kernel.name for c in xrt.explain("matmul", a, b, show=False).candidates if c.supported]
    assert sorted(alternatives) == sorted([*supported, "auto"]) and len(alternatives) >= 3
    xrt.enable_dispatch_logging()
    for name, fn in alternatives.items():
        np.testing.assert_allclose(fn(), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
        log = xrt.get_dispatch_logs()[-1]
        assert log.selected_kernel == name if name != "auto" else log.reason == "auto"
    times = {fn: 1.0 + i for i, fn in enumerate(alternatives.values())}  # auto last: the slowest
    setup, ours, anchor = make_setup(nbytes=100, alternatives=alternatives)
    times.update({ours: 1.25, anchor: 2.0})
    result = bench.run_row(Row("mm", "gemm", lambda: setup, target=1.0), fixed_timer(times))
    assert result.ours_vs_best == pytest.approx(1.0 / 1.25)
    assert set(result.alternatives_ms) == set(alternatives)
    assert result.selection_vs_best == {"auto": pytest.approx(1.0 / len(alternatives))}
    assert "⚠ auto below floor" in bench.markdown([result], {})
    times[alternatives["auto"]] = 1.02  # within 5 % of the fastest: no flag
    result = bench.run_row(Row("mm", "gemm", lambda: setup, target=1.0), fixed_timer(times))
    assert "auto 0.980" in bench.markdown([result], {}) and "⚠" not in bench.markdown([result], {})


def test_interleaved_timing_alternates_variants_and_keeps_each_ones_best_round():
    from xpuruntime.bench import interleaved

    order, samples = [], {"a": iter([3.0, 1.0, 2.0]), "b": iter([5.0, 6.0, 4.0]), "c": iter([7.0, 7.0, 7.0])}

    def timer(fn):
        order.append(fn())
        return next(samples[order[-1]])

    variants = {name: (lambda name=name: name) for name in "abc"}
    assert interleaved(variants, timer, rounds=3) == {"a": 1.0, "b": 4.0, "c": 7.0}
    assert "".join(order) == "abc" + "bca" + "cab"  # each round rotated: no variant always last


def test_interleaved_samples_alternate_call_by_call_so_drift_hits_every_variant_alike():
    """A clock that slows down 1 % per call: blocks of samples per variant would make the last variant
    of identical kernels look slower; call-by-call rotation keeps equal kernels equal."""
    from xpuruntime.bench import interleaved_samples

    calls = []
    base = {"same_1": 100.0, "same_2": 100.0, "slower": 150.0}

    def sample(fn):
        calls.append(fn())
        return base[calls[-1]] * (1 + 0.01 * len(calls))

    variants = {name: (lambda name=name: name) for name in base}
    got = interleaved_samples(variants, sample, budget_ms=2.0, min_reps=5, max_reps=50)
    passes = calls[len(base) :]  # after the first sample of each
    assert len(passes) == 16 * len(base)  # 2 ms over a mean first sample of ~118 µs: 16 reps (>= 5, <= 50)
    assert passes[:6] == ["same_1", "same_2", "slower", "same_2", "slower", "same_1"]
    assert got["same_1"] == pytest.approx(got["same_2"], rel=0.02)
    assert got["slower"] / got["same_1"] == pytest.approx(1.5, rel=0.02)
    assert set(got) == set(base) and all(v > 0 for v in got.values())


def test_bench_list_and_empty_selection(capsys, tmp_path):
    code, out, _ = run_cli(capsys, "bench", "--list")
    assert code == 0
    code, out, _ = run_cli(capsys, "bench", "--only", "no-row-is-called-this", "--out", str(tmp_path))
    assert code == 1 and "no benchmark rows selected" in out


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
    monkeypatch.setattr(bench.cli, "discover", lambda: (rows, []))
    monkeypatch.setattr(bench.cli, "default_timer", lambda kind="device": bench.host_timer(warmup=1, repeat=3))
    return calls


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
    (out / "run.png").write_bytes(b"an older run's chart")
    code, text, _ = run_cli(capsys, "bench", "--only", "gpu row", "--out", str(out), "--name", "run")
    assert code == 0 and counted_rows == []
    assert "skipped: needs a CUDA GPU" in text
    assert not (out / "run.png").exists()  # no ratio to plot: no chart left beside these results
    assert "run.png" not in text and "run.json" in text
    code, text, _ = run_cli(capsys, "bench", "--out", str(out), "--name", "run")
    assert code == 0 and (out / "run.png").exists() and "run.png" in text
    assert [r["name"] for r in json.loads((out / "run.json").read_text())["rows"]] == ["cpu row", "gpu row"]
    assert all(line in text.splitlines() for line in (out / "run.md").read_text().splitlines())  # unwrapped
    code, _, _ = run_cli(capsys, "bench", "--only", "cpu row", "--out", str(out))  # the default stem
    [named] = [p for p in out.glob("*.json") if p.name != "run.json"]
    assert named.stem.startswith(("cpu_", "h100_")) and named.with_suffix(".md").exists()


def test_bench_prints_each_row_as_it_ends(capsys, tmp_path, monkeypatch) -> None:
    """A long run piped to a log (the zoo rows take minutes each) shows every finished row at once, not only
    the table at the end: what the second row's setup finds printed already holds the first row's line."""
    seen: list[str] = []

    def setup(name: str) -> Setup:
        seen.append(capsys.readouterr().out)
        x = np.random.default_rng().standard_normal(1000)
        return Setup(lambda: np.sin(x), lambda: np.sin(x).copy(), bytes=2 * x.nbytes, note=name)

    rows = [Row(f"row {i}", "g", lambda i=i: setup(f"row {i}"), target=0.5) for i in (1, 2)]
    monkeypatch.setattr(bench.cli, "discover", lambda: (rows, []))
    monkeypatch.setattr(bench.cli, "default_timer", lambda kind="device": bench.host_timer(warmup=1, repeat=3))
    code, _, _ = run_cli(capsys, "bench", "--out", str(tmp_path), "--name", "run")
    assert code == 0 and len(seen) == 2
    assert "row 1: ours " in seen[1] and "ratio " in seen[1] and "row 2" not in seen[1]


def test_bench_without_matplotlib_still_writes_its_reports(capsys, tmp_path, counted_rows, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `pip install xpuruntime[torch,cuda]` has no matplotlib
    code, text, err = run_cli(capsys, "bench", "--out", str(tmp_path), "--name", "run")
    assert code == 0 and err == "" and counted_rows == ["cpu row"]
    assert (tmp_path / "run.json").exists() and (tmp_path / "run.md").exists()
    assert not (tmp_path / "run.png").exists()
    assert "matplotlib is not installed" in text and pip_hint("bench") in text.replace("\n", "")


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
