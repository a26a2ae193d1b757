"""BENCHMARKS.md from result files: for every row the latest measurement among the files given, one table per
subject (what, anchor, ours, ratio, target, met), each figure linked to the result file it came from.

    xpuruntime bench report benchmarks/results/*.json --output BENCHMARKS.md
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import report
from .row import Result

SUBJECT_ORDER = ("gemm", "attention", "norm", "elementwise", "fused", "host", "inference", "training")
MEASURED = ("ok", "wrong")  # statuses that carry numbers

INTRO = """\
# Benchmarks

Each table compares one subject's kernels or paths with an anchor (PyTorch, cuBLAS, cuDNN, onnxruntime, a
plain copy) timed in the same process. **Ratio** is ours over the anchor in throughput, so above 1 means ours
is faster; targets are those of the project's design. Each row links the result file it came from, which
holds the machine (GPU, driver, clocks, CPU), the versions, the commit and the date, beside its markdown
table and a chart of the ratios. Runs recorded before result files carried their commit name the commit
that added the file; rows transcribed from a probe's raw log link that log (`benchmarks/results/raw/`).

Reproduce everything on a GPU machine with `xpuruntime bench --out benchmarks/results`, then regenerate this
file with `xpuruntime bench report benchmarks/results/*.json --output BENCHMARKS.md` (`--only SUBJECT` runs
one subject; `xpuruntime bench --list` lists the rows and their targets).
"""


@dataclass
class Entry:
    """One row's latest measurement and where it came from."""

    result: Result
    doc: dict[str, Any]
    path: Path


def latest(paths: Iterable[Path]) -> dict[tuple[str, str], Entry]:
    """For every (subject, row name): the newest measured result (status ok or wrong) among the files, or the
    newest of any status where no file measured it."""
    chosen: dict[tuple[str, str], Entry] = {}
    for path in paths:
        doc = report.load(path)
        for result in report.results_of(doc):
            key = (result.subject, result.name)
            old = chosen.get(key)
            if old is None or _rank(result, doc) > _rank(old.result, old.doc):
                chosen[key] = Entry(result, doc, Path(path))
    return chosen


def _rank(result: Result, doc: dict[str, Any]) -> tuple[bool, str]:
    return (result.status in MEASURED, doc.get("date") or "")


def _subject_doc(subject: str) -> str:
    """The first sentence of the subject module's docstring (what the subject measures), if it imports."""
    try:
        text = importlib.import_module(f"xpuruntime.bench.{subject}").__doc__ or ""
    except Exception:
        return ""
    first = " ".join(text.strip().split("\n\n")[0].split())
    return first


def _suite_order() -> dict[tuple[str, str], int]:
    """Each row's position in the suite, so that a table lists its rows as the subject's module does."""
    from .runner import discover

    return {(r.subject, r.name): i for i, r in enumerate(discover()[0])}


def _run_link(entry: Entry, base: Path) -> str:
    """'[H100 · 1366ff6 · 2026-11-22](benchmarks/results/....json)': the machine, commit and date of the run."""
    machine = entry.doc["machine"].get("gpu") or entry.doc["machine"].get("cpu") or "?"
    machine = machine.replace("NVIDIA ", "").split(" 80GB")[0]
    commit = (entry.doc.get("commit") or "no commit")[:10]
    date = (entry.doc.get("date") or "")[:10]
    target = entry.path.parent / entry.result.source if entry.result.source else entry.path
    return f"[{machine} · {commit} · {date}]({_relative(target, base)})"


def _relative(path: Path, base: Path) -> str:
    return Path(os.path.relpath(Path(path).resolve(), base.resolve())).as_posix()


def _value(value: float | None, units: str) -> str:
    return "—" if value is None else f"{report.fmt(value)} {units}"


def _met(r: Result) -> str:
    if r.status == "wrong":
        return f"**wrong**: {r.message}"
    if r.status != "ok":
        return f"{r.status}: {r.message}"
    if r.met is None:
        return "—"
    return "yes" if r.met else f"**no** ({r.missed_by * 100:.1f} % short)"


def _ratio(r: Result) -> str:
    """Ours over the anchor ('1.34'), or for host-cost rows what ours costs beyond it ('+1.41 µs')."""
    if r.target_kind == "µs over anchor" and r.ours_ms is not None and r.anchor_ms is not None:
        return f"+{(r.ours_ms - r.anchor_ms) * 1e3:.2f} µs"
    return "—" if r.ratio is None else f"{r.ratio:#.3g}"


def _table(entries: Sequence[Entry], base: Path) -> list[str]:
    lines = ["| what | anchor | ours | ratio | target | met | run |", "|---|---|---:|---:|---|---|---|"]
    for e in entries:
        r = e.result
        anchor = r.anchor or "—"
        if r.anchor_value is not None:
            anchor += f": {_value(r.anchor_value, r.units)}"
        what = f"{r.name}" + (f" ({r.doc})" if r.doc else "")
        cells = (what, anchor, _value(r.ours_value, r.units), _ratio(r), report.target_text(r), _met(r),
                 _run_link(e, base))  # fmt: skip
        lines.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
    return lines


def _glance(by_subject: dict[str, list[Entry]]) -> list[str]:
    lines = ["| subject | rows | met | missed | no target | not measured |", "|---|---:|---:|---:|---:|---:|"]
    for subject, entries in by_subject.items():
        rs = [e.result for e in entries]
        measured = [r for r in rs if r.status in MEASURED]
        met = sum(r.met is True for r in measured)
        missed = sum(r.met is False or r.status == "wrong" for r in measured)
        lines.append(f"| [{subject}](#{subject}) | {len(rs)} | {met} | {missed} | "
                     f"{len(measured) - met - missed} | {len(rs) - len(measured)} |")  # fmt: skip
    return lines


def benchmarks_markdown(paths: Iterable[Path], base: Path) -> str:
    """The whole BENCHMARKS.md for these result files; links are relative to `base` (the file's folder)."""
    chosen = latest(paths)
    subjects = sorted({s for s, _ in chosen}, key=lambda s: (SUBJECT_ORDER.index(s) if s in SUBJECT_ORDER else 99, s))
    order = _suite_order()
    by_subject = {s: sorted((e for (subj, _), e in chosen.items() if subj == s),
                            key=lambda e: order.get((e.result.subject, e.result.name), len(order)))
                  for s in subjects}  # fmt: skip
    text = [INTRO, "## At a glance\n", *_glance(by_subject), ""]
    for subject in subjects:
        text += [f"## {subject}\n"]
        about = _subject_doc(subject)
        if about:
            text += [about + "\n"]
        text += [*_table(by_subject[subject], base), "",
                 f"Reproduce: `xpuruntime bench --only {subject}`.", ""]  # fmt: skip
    return "\n".join(text)
