"""Result files and BENCHMARKS.md: `xpuruntime bench report` keeps the newest measurement of each row, one table
per subject, each figure linked to the file it came from; the chart's log scale; the suite's own rows (every
subject imports, names its anchor); the host and training rows' own timing loops."""

from __future__ import annotations

import json

import pytest
from cli_runner import one_line_error, run_cli

from xpuruntime.bench import Result, host, report, runner, summary, training


def _result_file(path, date, commit, gpu, rows):
    doc = {"format": report.FORMAT, "date": date, "commit": commit, "machine": {"gpu": gpu, "cpu": "x86"},
           "versions": {"python": "3.12"}, "rows": rows, "module_failures": []}  # fmt: skip
    path.write_text(json.dumps(doc))
    return path


def _row(name, subject, ratio, status="ok", **extra):
    r = Result(name, subject, "TB/s", 1.0, "ratio", ours_value=2.0 * ratio, anchor_value=2.0, ratio=ratio,
               met=None if status != "ok" else ratio >= 1.0, missed_by=None if ratio >= 1.0 else 1.0 - ratio,
               status=status, subject=subject, anchor="torch.thing", **extra)  # fmt: skip
    return report.dataclasses.asdict(r)


def test_report_keeps_each_rows_newest_measurement_and_links_its_file(tmp_path, capsys):
    results = tmp_path / "results"
    results.mkdir()
    old = _result_file(
        results / "old.json",
        "2026-11-01T10:00:00Z",
        "aaaaaaaaaa",
        "NVIDIA H100 80GB HBM3",
        [_row("norm fwd", "norm", 1.2), _row("gemm big", "gemm", 0.9), _row("sum", "elementwise", 1.1)],
    )
    new = _result_file(
        results / "new.json",
        "2026-11-20T10:00:00Z",
        "bbbbbbbbbb",
        "NVIDIA H100 80GB HBM3",
        [_row("norm fwd", "norm", 1.4), _row("gemm big", "gemm", 0, status="skipped")],
    )
    out = tmp_path / "BENCHMARKS.md"
    code, text, _ = run_cli(capsys, "bench", "report", str(old), str(new), "--output", str(out))
    assert code == 0 and "wrote" in text
    md = out.read_text()
    sections = [line for line in md.splitlines() if line.startswith("## ")]
    assert sections == ["## At a glance", "## gemm", "## norm", "## elementwise"]  # the subjects' order
    norm = md.split("## norm")[1].split("## ")[0]
    assert "| norm fwd | torch.thing: 2 TB/s | 2.8 TB/s | 1.40 | ≥ 1× | yes |" in norm
    assert "[H100 · bbbbbbbbbb · 2026-11-20](results/new.json)" in norm  # the newer run, linked
    gemm = md.split("## gemm")[1].split("## ")[0]
    assert "0.9" in gemm and "(results/old.json)" in gemm and "**no** (10.0 % short)" in gemm  # skipped: kept
    assert "Reproduce: `xpuruntime bench --only gemm`" in gemm
    assert "| [norm](#norm) | 1 | 1 | 0 | 0 | 0 |" in md and "| [gemm](#gemm) | 1 | 0 | 1 | 0 | 0 |" in md


def test_a_transcribed_row_links_its_raw_source(tmp_path, capsys):
    (tmp_path / "raw.txt").write_text("the original measurement")
    path = _result_file(
        tmp_path / "curated.json",
        "2026-11-20T10:00:00Z",
        "cccccccccc",
        None,
        [_row("override", "host", 1.0, source="raw.txt")],
    )
    code, _, _ = run_cli(capsys, "bench", "report", str(path), "--output", str(tmp_path / "B.md"))
    assert code == 0 and "[x86 · cccccccccc · 2026-11-20](raw.txt)" in (tmp_path / "B.md").read_text()


def test_report_refuses_what_is_not_a_result_file(tmp_path, capsys):
    (tmp_path / "other.json").write_text('{"rows": [{"unexpected": 1}]}')
    code, _, err = run_cli(capsys, "bench", "report", str(tmp_path / "other.json"))
    assert code == 2 and one_line_error(err, "bench")
    code, _, err = run_cli(capsys, "bench", "report", str(tmp_path / "missing.json"))
    assert code == 2 and "is not a result file" in err


def test_result_files_of_the_first_format_load_with_a_subject(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({
        "environment": {"time_utc": "2026-11-22T16:45:59Z", "device": "NVIDIA H100 80GB HBM3", "torch": "2.11"},
        "rows": [{"name": "gemv x", "group": "gemv", "units": "TB/s", "target": 0.8, "target_kind": "ratio",
                  "ratio": 0.95, "status": "ok"}],
    }))  # fmt: skip
    doc = report.load(path)
    assert doc["date"] == "2026-11-22T16:45:59Z" and doc["machine"]["gpu"] == "NVIDIA H100 80GB HBM3"
    [result] = report.results_of(doc)
    assert result.subject == "gemm" and result.ratio == 0.95


def test_the_chart_puts_ratios_on_a_log_scale(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import matplotlib.axes

    scales = []
    set_xscale = matplotlib.axes.Axes.set_xscale
    monkeypatch.setattr(matplotlib.axes.Axes, "set_xscale", lambda ax, s, **kw: (scales.append(s), set_xscale(ax, s)))
    rows = [Result(n, "g", "ms", None, "ratio", ratio=r, subject="s") for n, r in (("tiny", 0.004), ("big", 1.3))]
    assert report.ratio_chart(rows, tmp_path / "c.png") and scales == ["log"]
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    assert not report.ratio_chart([Result("none", "g", "ms", None, "ratio")], tmp_path / "d.png")


def test_every_subject_imports_and_names_its_anchor():
    rows, failures = runner.discover()
    assert failures == []
    assert {r.subject for r in rows} >= {"gemm", "attention", "norm", "elementwise", "host", "inference", "training"}
    assert all(r.anchor and r.doc for r in rows), [r.name for r in rows if not (r.anchor and r.doc)]
    assert len({(r.subject, r.name) for r in rows}) == len(rows)  # a row's name identifies it in the report
    assert all(summary._subject_doc(s) for s in {r.subject for r in rows})


def test_paired_rounds_take_the_median_difference_of_rounds(monkeypatch):
    """A fake clock: the anchor costs 2 µs a call, ours 3 µs, and one round of ours is disturbed (+50 µs): the
    paired median ignores it."""
    now = [0.0]
    monkeypatch.setattr(host.time, "perf_counter", lambda: now[0])
    calls = {"ours": 0}

    def ours():
        calls["ours"] += 1
        now[0] += 3e-6 + (50e-6 if calls["ours"] == 25 else 0.0)

    def anchor():
        now[0] += 2e-6

    switched = []
    times = host.paired_rounds(ours, anchor, calls=10, rounds=7, before=switched.append)
    assert times["anchor"] == pytest.approx(0.002) and times["ours"] - times["anchor"] == pytest.approx(0.001)
    assert switched[:4] == ["anchor", "ours", "ours", "anchor"]  # the order alternates round by round


def test_training_steps_alternate_each_under_its_own_setting(monkeypatch):
    active, log = [None], []
    monkeypatch.setattr(training, "_timed_step", lambda step: (step(), {"a": 10.0, "b": 8.0}[active[0]])[1])
    variants = {name: ((lambda n=name: active.__setitem__(0, n)), (lambda n=name: log.append((n, active[0]))))
                for name in "ab"}  # fmt: skip
    times = training.alternate_steps(variants, rounds=4)
    assert times == {"a": 10.0, "b": 8.0}
    assert all(name == setting for name, setting in log)  # every step ran under its own variant's setting
    timed_order = [n for n, _ in log[4:]][1::2]  # after two warm-up steps each: warm-up, timed, per variant
    assert timed_order == ["a", "b", "b", "a", "a", "b", "b", "a"]


def test_benchmarks_md_is_what_the_committed_result_files_give(tmp_path, capsys):
    """BENCHMARKS.md is generated: regenerating it from benchmarks/results changes nothing."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    files = sorted((root / "benchmarks" / "results").glob("*.json"))
    assert files, "no result files committed"
    out = tmp_path / "BENCHMARKS.md"
    assert summary.benchmarks_markdown(files, root) == (root / "BENCHMARKS.md").read_text()
    for line in (root / "BENCHMARKS.md").read_text().splitlines():  # every linked file exists
        for link in (part.split(")")[0] for part in line.split("](")[1:]):
            assert link.startswith("#") or (root / link).is_file(), link
    assert not out.exists()


def test_the_commit_can_be_given_where_git_cannot_tell(monkeypatch):
    """A copy of the tree on a GPU machine may sit in no repository or a stale one: XPURUNTIME_COMMIT names it."""
    from xpuruntime.bench import report

    monkeypatch.setenv("XPURUNTIME_COMMIT", "given-by-the-caller")
    assert report.commit() == "given-by-the-caller"
    monkeypatch.delenv("XPURUNTIME_COMMIT")
    found = report.commit()
    assert found != "given-by-the-caller"
