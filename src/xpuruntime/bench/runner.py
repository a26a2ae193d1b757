"""The runner: finds the rows (one module per subject), runs each one (set up, check, time), and turns the
times into results measured against the row's target. A row never stops the run: errors become its status."""

from __future__ import annotations

import dataclasses
import importlib
import math
import pkgutil
import traceback
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from .row import Result, Row, Setup, Timer
from .timing import default_timer, interleaved

OURS, ANCHOR = "ours", "anchor"
SELECTION_FLOORS = {"auto": 0.95, "autotune": 0.98}  # the fastest kernel's time over the mode's
# the suite's own modules (zoo_models: the models the zoo rows and the zoo tests share)
NOT_SUBJECTS = ("row", "common", "timing", "runner", "report", "summary", "cli", "zoo_models")


def discover(package: str = "xpuruntime.bench") -> tuple[list[Row], list[tuple[str, str]]]:
    """Every `ROWS` of every subject module in `package`, each row's `subject` set to its module's name;
    returns (rows, [(module, why it failed to import)])."""
    pkg = importlib.import_module(package)
    rows: list[Row] = []
    failures: list[tuple[str, str]] = []
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if info.name.startswith("_") or info.name in NOT_SUBJECTS:
            continue
        name = f"{package}.{info.name}"
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # one subject's broken module must not stop the others
            failures.append((name, f"{type(exc).__name__}: {exc}"))
            continue
        rows.extend(r if r.subject else dataclasses.replace(r, subject=info.name) for r in getattr(module, "ROWS", ()))
    return rows, failures


def select(rows: Iterable[Row], only: Sequence[str] | None) -> list[Row]:
    """Rows whose name, group or subject contains any of the substrings in `only` (case-insensitive)."""
    rows = list(rows)
    if not only:
        return rows
    wanted = [s.lower() for s in only]
    return [r for r in rows if any(w in f"{r.subject} {r.group} {r.name}".lower() for w in wanted)]


def _rate(units: str, ms: float, nbytes: int, flops: int) -> float | None:
    if units == "ms":
        return ms
    if units == "µs":
        return ms * 1e3
    work = nbytes if units == "TB/s" else flops
    if not work or ms <= 0:
        return None
    return work / (ms * 1e-3) / 1e12


def _throughput_ratio(ours_ms: float, anchor_ms: float, ours_work: tuple, anchor_work: tuple) -> float:
    """Ours over anchor throughput: time ratio scaled by the work each did (1 when the work is equal)."""
    scale = 1.0
    for mine, theirs in zip(ours_work, anchor_work):
        if mine and theirs and mine != theirs:
            scale = mine / theirs
            break
    return anchor_ms / ours_ms * scale if ours_ms > 0 else math.inf


def _achieved(row: Row, result: Result, setup: Setup) -> float | None:
    """What the row's target is compared with: the ratio, our rate, or our µs beyond the anchor."""
    if row.target_kind == "ratio":
        return result.ratio
    if row.target_kind == "µs over anchor":
        if result.ours_ms is None or result.anchor_ms is None:
            return None
        return (result.ours_ms - result.anchor_ms) * 1e3
    return _rate(row.target_kind, result.ours_ms or 0.0, setup.bytes, setup.flops)


def evaluate(row: Row, setup: Setup, ours_ms: float, anchor_ms: float | None) -> Result:
    """Turn two median times into a Result: rates, ratio and whether the target is met."""
    result = dataclasses.replace(Result.for_row(row), ours_ms=ours_ms, anchor_ms=anchor_ms)
    result.ours_value = _rate(row.units, ours_ms, setup.bytes, setup.flops)
    a_bytes = setup.bytes if setup.anchor_bytes is None else setup.anchor_bytes
    a_flops = setup.flops if setup.anchor_flops is None else setup.anchor_flops
    if anchor_ms is not None:
        result.anchor_value = _rate(row.units, anchor_ms, a_bytes, a_flops)
        result.ratio = _throughput_ratio(ours_ms, anchor_ms, (setup.bytes, setup.flops), (a_bytes, a_flops))
    achieved = None if row.target is None else _achieved(row, result, setup)
    if achieved is not None:
        lower_is_better = row.target_kind == "µs over anchor"
        result.met = bool(achieved <= row.target if lower_is_better else achieved >= row.target)
        if not result.met:
            short = (achieved - row.target) if lower_is_better else (row.target - achieved)
            result.missed_by = float(short / abs(row.target)) if row.target else math.inf
    return result


def _times(setup: Setup, timer: Timer) -> dict[Any, float]:
    """Median ms of ours, the anchor and each alternative (alternatives keyed by a 1-tuple of their name)."""
    if setup.measure is not None:
        measured = setup.measure(timer)
        return {OURS: measured["ours"], **({ANCHOR: measured["anchor"]} if "anchor" in measured else {}),
                **{(k,): v for k, v in measured.items() if k not in (OURS, ANCHOR)}}  # fmt: skip
    variants = {OURS: setup.ours, **({ANCHOR: setup.anchor} if setup.anchor is not None else {})}
    return interleaved({**variants, **{(name,): fn for name, fn in setup.alternatives.items()}}, timer)


def run_row(row: Row, timer: Timer) -> Result:
    """Set up, check, and time one row; never raises (errors become the row's status)."""
    reason = row.requires() if row.requires else None
    if reason:
        return dataclasses.replace(Result.for_row(row), status="skipped", message=reason)
    try:
        setup = row.setup()
        setup.ours()  # first call: compiles / tunes, and gives `check` a result to look at
        problem = setup.check() if setup.check else None
        times = _times(setup, timer)
    except Exception as exc:
        last = traceback.extract_tb(exc.__traceback__)[-1]
        where = f" ({Path(last.filename).name}:{last.lineno})"
        return dataclasses.replace(Result.for_row(row), status="error", message=f"{type(exc).__name__}: {exc}{where}")
    finally:
        _release_memory()
    result = evaluate(row, setup, times[OURS], times.get(ANCHOR))
    alternatives = {key[0]: ms for key, ms in times.items() if isinstance(key, tuple)}
    if alternatives:
        result.alternatives_ms = alternatives
        fastest = min(alternatives.values())
        result.ours_vs_best = fastest / result.ours_ms if result.ours_ms else None
        result.selection_vs_best = {m: fastest / alternatives[m] for m in SELECTION_FLOORS if m in alternatives}
    if problem:  # timed and shown, but a wrong result meets no target
        result.status, result.message, result.met, result.missed_by = "wrong", problem, None, None
    elif setup.note:
        result.message = setup.note
    return result


def _release_memory() -> None:
    """Give cached device memory back between rows so that one row's buffers never crowd the next."""
    import gc
    import sys

    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def run(
    rows: Sequence[Row], timer: Timer | None = None, progress: bool = True,
    on_result: Callable[[list[Result]], Any] | None = None,
) -> list[Result]:  # fmt: skip
    """Run rows in order with a rich progress bar; returns one Result per row. `on_result(results so far)`
    runs after each row (the CLI rewrites its reports there, so a run cut short keeps what it measured)."""
    timer = timer or default_timer()
    results: list[Result] = []

    def one(row: Row) -> None:
        results.append(run_row(row, timer))
        if on_result is not None:
            on_result(results)

    if not progress:
        for row in rows:
            one(row)
        return results
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task("bench", total=len(rows))
        for row in rows:
            bar.update(task, description=f"{row.subject}: {row.name}")
            one(row)
            bar.advance(task)
    return results
