"""Benchmark runner: times our kernels beside their anchors in one process and reports ratios to targets.

Each module in this package that exposes `ROWS` (a list of `Row`) contributes rows. A row's `setup`
builds random inputs and returns a `Setup` with two callables, ours and the anchor (PyTorch, cuBLAS,
a copy, ...), and the bytes / FLOPs one call moves / does. On a GPU the runner times each call by device
events from a flushed L2 cache, the device kept busy until the call's first launch is queued (the
autotuner's sampler): GPU time, without the host latency before the first kernel; a row's variants are
sampled call by call in rotating order and each reports its median.
`--timer do_bench` uses `triton.testing.do_bench` instead, where that latency counts whenever it exceeds
the L2 flush: on an H100 host it made the same cuDNN kernel 7 % slower when a row entered a policy scope
first. Without a GPU, a host-clock median. Writes `results.json`, `results.md` and `ratios.png`.

    python -m xpuruntime.bench [--only SUBSTRING] [--out DIR] [--timer device|do_bench] [--list]

A target is either a ratio (ours over anchor, in throughput: > 1 means ours is faster) or an absolute
rate in TB/s or TFLOP/s for ours.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import math
import pkgutil
import platform
import statistics
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TARGET_KINDS = ("ratio", "TB/s", "TFLOP/s")
UNITS = ("TB/s", "TFLOP/s", "ms")


@dataclass
class Setup:
    """What a row's setup returns: the two callables to time and the work one call does.

    `anchor_bytes` / `anchor_flops` default to ours (same problem); set them when the anchor does a
    different amount of work (a plain copy as the bandwidth anchor, say). `check` runs after one call of
    `ours` and may return a message when ours computed a wrong result; the runner reports it beside the
    timing.
    """

    ours: Callable[[], Any]
    anchor: Callable[[], Any] | None = None
    bytes: int = 0
    flops: int = 0
    anchor_bytes: int | None = None
    anchor_flops: int | None = None
    check: Callable[[], str | None] | None = None
    note: str = ""
    alternatives: dict[str, Callable[[], Any]] = field(default_factory=dict)  # from `kernel_alternatives`


@dataclass(frozen=True)
class Row:
    """One benchmark line: `setup()` builds inputs (lazily, when the row runs) and returns a `Setup`.

    `target` is a ratio (ours over anchor throughput) when `target_kind` is "ratio", else an absolute
    rate of ours in `target_kind` units. `units` is what the table reports for each side.
    `requires` returns a reason string when the row cannot run here (no GPU, no nvmath), else None.
    """

    name: str
    group: str
    setup: Callable[[], Setup]
    target: float | None = None
    target_kind: str = "ratio"
    units: str = "TB/s"
    requires: Callable[[], str | None] | None = None
    doc: str = ""

    def __post_init__(self) -> None:
        if self.target_kind not in TARGET_KINDS:
            raise ValueError(f"Row {self.name}: target_kind must be one of {TARGET_KINDS}, got {self.target_kind!r}")
        if self.units not in UNITS:
            raise ValueError(f"Row {self.name}: units must be one of {UNITS}, got {self.units!r}")


@dataclass
class Result:
    """The measured outcome of one row (what the JSON holds per row)."""

    name: str
    group: str
    units: str
    target: float | None
    target_kind: str
    ours_ms: float | None = None
    anchor_ms: float | None = None
    ours_value: float | None = None  # in `units`
    anchor_value: float | None = None
    ratio: float | None = None  # ours over anchor throughput (anchor time over ours for equal work)
    met: bool | None = None
    missed_by: float | None = None  # fraction of the target short, e.g. 0.12 = 12 % short
    status: str = "ok"  # ok | skipped | error | wrong
    message: str = ""
    alternatives_ms: dict[str, float] = field(default_factory=dict)  # each registered kernel, forced by policy
    ours_vs_best: float | None = None  # fastest alternative's time over ours
    selection_vs_best: dict[str, float] = field(default_factory=dict)  # "auto"/"autotune": fastest time over theirs


Timer = Callable[[Callable[[], Any]], float]


# -- discovery -----------------------------------------------------------------------------------
def discover(package: str = __name__) -> tuple[list[Row], list[tuple[str, str]]]:
    """Every `ROWS` of every module in `package`; returns (rows, [(module, why it failed to import)])."""
    pkg = importlib.import_module(package)
    rows: list[Row] = []
    failures: list[tuple[str, str]] = []
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        name = f"{package}.{info.name}"
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # one area's broken module must not stop the others
            failures.append((name, f"{type(exc).__name__}: {exc}"))
            continue
        rows.extend(getattr(module, "ROWS", ()))
    return rows, failures


def select(rows: Iterable[Row], only: Sequence[str] | None) -> list[Row]:
    """Rows whose name or group contains any of the substrings in `only` (case-insensitive)."""
    rows = list(rows)
    if not only:
        return rows
    wanted = [s.lower() for s in only]
    return [r for r in rows if any(w in r.name.lower() or w in r.group.lower() for w in wanted)]


# -- timing --------------------------------------------------------------------------------------
def device_timer(warmup_ms: int = 25, rep_ms: int = 40) -> Timer:
    """Median milliseconds of one call by device events, each from a flushed L2 cache with the host latency
    before its first launch hidden (`autotune.cuda_sampler`). Its `sample` attribute (one call, µs) lets
    `interleaved` alternate variants call by call."""
    import torch

    from ..autotune import cuda_sampler

    measure = cuda_sampler(f"cuda:{torch.cuda.current_device()}", None)

    def timer(fn: Callable[[], Any]) -> float:
        until = time.perf_counter() + warmup_ms / 1e3
        once = measure(fn)
        while time.perf_counter() < until:
            once = measure(fn)
        reps = max(5, min(1000, int(rep_ms * 1e3 / max(once, 1.0))))
        return statistics.median(measure(fn) for _ in range(reps)) / 1e3

    timer.sample = measure  # type: ignore[attr-defined]
    timer.budget_ms = ROUNDS * rep_ms  # type: ignore[attr-defined]
    return timer


def gpu_timer(warmup_ms: int = 25, rep_ms: int = 40) -> Timer:
    """Median milliseconds through `triton.testing.do_bench` (device events, L2 flushed between runs)."""
    from triton.testing import do_bench

    def timer(fn: Callable[[], Any]) -> float:
        return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))

    return timer


def host_timer(warmup: int = 3, repeat: int = 11) -> Timer:
    """Median milliseconds by the host clock (for CPU-only machines and tests)."""

    def timer(fn: Callable[[], Any]) -> float:
        for _ in range(warmup):
            fn()
        samples = []
        for _ in range(repeat):
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e3)
        return statistics.median(samples)

    return timer


TIMERS = {"device": device_timer, "do_bench": gpu_timer}


def default_timer(kind: str = "device") -> Timer:
    """On a CUDA device `device_timer` (or `gpu_timer` for kind "do_bench"), the host clock otherwise."""
    try:
        import torch

        if torch.cuda.is_available():
            return TIMERS[kind]()
    except ImportError:
        pass
    return host_timer()


# -- evaluation ----------------------------------------------------------------------------------
def _rate(units: str, ms: float, nbytes: int, flops: int) -> float | None:
    if units == "ms":
        return ms
    work = nbytes if units == "TB/s" else flops
    if not work or ms <= 0:
        return None
    return work / (ms * 1e-3) / 1e12


def evaluate(row: Row, setup: Setup, ours_ms: float, anchor_ms: float | None) -> Result:
    """Turn two median times into a Result: rates, ratio and whether the target is met."""
    result = Result(row.name, row.group, row.units, row.target, row.target_kind, ours_ms, anchor_ms)
    result.ours_value = _rate(row.units, ours_ms, setup.bytes, setup.flops)
    a_bytes = setup.bytes if setup.anchor_bytes is None else setup.anchor_bytes
    a_flops = setup.flops if setup.anchor_flops is None else setup.anchor_flops
    if anchor_ms is not None:
        result.anchor_value = _rate(row.units, anchor_ms, a_bytes, a_flops)
        result.ratio = _throughput_ratio(ours_ms, anchor_ms, (setup.bytes, setup.flops), (a_bytes, a_flops))
    if row.target is None:
        return result
    if row.target_kind == "ratio":
        achieved = result.ratio
    else:
        achieved = _rate(row.target_kind, ours_ms, setup.bytes, setup.flops)
    if achieved is not None:
        result.met = bool(achieved >= row.target)
        result.missed_by = None if result.met else float((row.target - achieved) / row.target)
    return result


def _throughput_ratio(ours_ms: float, anchor_ms: float, ours_work: tuple, anchor_work: tuple) -> float:
    """Ours over anchor throughput: time ratio scaled by the work each did (1 when the work is equal)."""
    scale = 1.0
    for mine, theirs in zip(ours_work, anchor_work):
        if mine and theirs and mine != theirs:
            scale = mine / theirs
            break
    return anchor_ms / ours_ms * scale if ours_ms > 0 else math.inf


def kernel_alternatives(op: str, call: Callable[[], Any], *inputs: Any, **attrs: Any) -> dict[str, Callable[[], Any]]:
    """One callable per registered kernel that supports this call (`inputs`/`attrs` as for `explain`), each
    running `call` under a strict policy naming that kernel, and "auto": `call` itself (no policy). Put
    them in `Setup.alternatives`: the report shows how close auto (and autotune, where a row adds it)
    comes to the fastest kernel."""
    import xpuruntime as xrt

    explanation = xrt.explain(op, *inputs, show=False, **attrs)
    names = [c.kernel.name for c in explanation.candidates if c.supported]

    def forced(name: str) -> Callable[[], Any]:
        def run_forced() -> Any:
            with xrt.kernel_policy(strict=True, **{op: name}):
                return call()

        return run_forced

    return {**{name: forced(name) for name in names}, "auto": call}


OURS, ANCHOR = "ours", "anchor"
SELECTION_FLOORS = {"auto": 0.95, "autotune": 0.98}  # fastest kernel's time over the mode's: DESIGN §4
ROUNDS = 4


def interleaved(variants: dict[Any, Callable[[], Any]], timer: Timer, rounds: int = ROUNDS) -> dict[Any, float]:
    """The best of `rounds` timings of each variant, the rounds interleaved so that drift (GPU clocks,
    host load) hits every variant alike: one pass over the variants showed 4 % spreads between calls
    of the same kernel. Each round starts further into the list (rotated by len / rounds), so no variant
    always runs right after the same heavy neighbour or at the same point of a round. A timer that can
    take single samples alternates the variants call by call instead (`interleaved_samples`)."""
    if getattr(timer, "sample", None) is not None:
        return interleaved_samples(variants, timer.sample, timer.budget_ms)  # type: ignore[attr-defined]
    best = dict.fromkeys(variants, float("inf"))
    order = list(variants)
    for r in range(rounds):
        shift = r * len(order) // rounds
        for key in order[shift:] + order[:shift]:
            best[key] = min(best[key], float(timer(variants[key])))
    return best


def interleaved_samples(
    variants: dict[Any, Callable[[], Any]], sample: Callable[[Callable[[], Any]], float], budget_ms: float,
    min_reps: int = 15, max_reps: int = 400,
) -> dict[Any, float]:  # fmt: skip
    """Median milliseconds of each variant, sampled one call at a time, variant after variant in an order
    rotated every pass, about `budget_ms` of calls per variant. At S8192 attention the H100 runs at its
    700 W cap and its clock moved between 1.7 and 2.0 GHz: the same cuDNN kernel measured 3.24 to 3.81 ms
    from one block of samples to the next, while neighbouring single calls see the same clock."""
    order = list(variants)
    for fn in variants.values():  # compile, tune, fill caches
        fn()
    first = [sample(variants[key]) for key in order]
    reps = max(min_reps, min(max_reps, int(budget_ms * 1e3 / max(statistics.mean(first), 1.0))))
    samples: dict[Any, list[float]] = {key: [] for key in order}
    for r in range(reps):
        shift = r % len(order)
        for key in order[shift:] + order[:shift]:
            samples[key].append(sample(variants[key]))
    return {key: statistics.median(values) / 1e3 for key, values in samples.items()}


def run_row(row: Row, timer: Timer) -> Result:
    """Set up, check, and time one row; never raises (errors become the row's status)."""
    base = Result(row.name, row.group, row.units, row.target, row.target_kind)
    reason = row.requires() if row.requires else None
    if reason:
        return dataclasses.replace(base, status="skipped", message=reason)
    try:
        setup = row.setup()
        setup.ours()  # first call: compiles / tunes, and gives `check` a result to look at
        problem = setup.check() if setup.check else None
        variants = {OURS: setup.ours, **({ANCHOR: setup.anchor} if setup.anchor is not None else {})}
        times = interleaved({**variants, **{(name,): fn for name, fn in setup.alternatives.items()}}, timer)
        ours_ms, anchor_ms = times[OURS], times.get(ANCHOR)
        alternatives = {key[0]: ms for key, ms in times.items() if isinstance(key, tuple)}
    except Exception as exc:
        last = traceback.extract_tb(exc.__traceback__)[-1]
        where = f" ({Path(last.filename).name}:{last.lineno})"
        return dataclasses.replace(base, status="error", message=f"{type(exc).__name__}: {exc}{where}")
    finally:
        _release_memory()
    result = evaluate(row, setup, ours_ms, anchor_ms)
    if alternatives:
        result.alternatives_ms = alternatives
        fastest = min(alternatives.values())
        result.ours_vs_best = fastest / ours_ms if ours_ms > 0 else None
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
            bar.update(task, description=f"{row.group}: {row.name}")
            one(row)
            bar.advance(task)
    return results


# -- reports -------------------------------------------------------------------------------------
def environment() -> dict[str, Any]:
    """Versions and the device, recorded beside the numbers."""
    env: dict[str, Any] = {"python": platform.python_version(), "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                          time.gmtime())}  # fmt: skip
    for name in ("numpy", "torch", "triton", "nvmath"):
        try:
            env[name] = importlib.import_module(name).__version__
        except Exception:
            env[name] = None
    try:
        import torch

        if torch.cuda.is_available():
            env["device"] = torch.cuda.get_device_name()
    except ImportError:
        pass
    env.setdefault("device", platform.processor() or platform.machine())
    return env


def _fmt(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}g}" if abs(value) < 1000 else f"{value:.0f}"


def _target_text(r: Result) -> str:
    if r.target is None:
        return "—"
    return f"≥ {r.target:g}×" if r.target_kind == "ratio" else f"≥ {r.target:g} {r.target_kind}"


def _verdict(r: Result) -> str:
    if r.status != "ok":
        return f"{r.status}: {r.message}"
    if r.met is None:
        return "—" if r.target is None else "no rate (bytes/FLOPs missing)"
    return "met" if r.met else f"missed by {r.missed_by * 100:.1f} %"


def _best_text(r: Result) -> str:
    """'0.98 (triton)': the fastest registered kernel's time over ours."""
    if r.ours_vs_best is None:
        return "—"
    return f"{r.ours_vs_best:.3f} ({min(r.alternatives_ms, key=r.alternatives_ms.get)})"


def _selection_text(r: Result) -> str:
    """'auto 0.99 · autotune 0.97 ⚠': the fastest kernel's time over each selection mode's, flagged below
    its floor (auto 0.95, autotune 0.98)."""
    parts = [f"{mode} {ratio:.3f}" for mode, ratio in r.selection_vs_best.items()]
    low = [mode for mode, ratio in r.selection_vs_best.items() if ratio < SELECTION_FLOORS[mode]]
    return " · ".join(parts) + (f" ⚠ {', '.join(low)} below floor" if low else "") if parts else "—"


def markdown(results: Sequence[Result], env: dict[str, Any]) -> str:
    """A markdown table: ours, anchor (in the row's units), ratio, target, met or by how much missed."""
    head = (f"Device: {env.get('device')}; torch {env.get('torch')}, triton {env.get('triton')}; "
            f"{env.get('time_utc')}. Ratio = ours over anchor throughput (> 1: ours faster).\n\n")  # fmt: skip
    lines = [
        "| group | row | ours | anchor | units | ours ms | anchor ms | ratio | target | verdict | best kernel / ours "
        "| fastest / selection |",
        "|---|---|---:|---:|---|---:|---:|---:|---|---|---|---|",
    ]
    for r in results:
        verdict = _verdict(r).replace("|", "\\|").replace("\n", " ")
        lines.append(
            f"| {r.group} | {r.name} | {_fmt(r.ours_value)} | {_fmt(r.anchor_value)} | {r.units} | "
            f"{_fmt(r.ours_ms, 4)} | {_fmt(r.anchor_ms, 4)} | {_fmt(r.ratio)} | {_target_text(r)} | {verdict} | "
            f"{_best_text(r)} | {_selection_text(r)} |"
        )
    return head + "\n".join(lines) + "\n"


def _plottable(results: Sequence[Result]) -> list[Result]:
    return [r for r in results if r.ratio is not None and math.isfinite(r.ratio)]


def bar_chart(results: Sequence[Result], path: Path) -> bool:
    """A PNG of each row's ratio (ours over anchor) with its ratio target marked; False if nothing to plot
    or matplotlib (the `bench` extra) is not installed."""
    plotted = _plottable(results)
    if not plotted:
        return False
    try:
        import matplotlib
    except ImportError:
        return False

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(plotted) + 2), 4.5))
    colors = ["tab:green" if r.met else "tab:red" if r.met is False else "tab:gray" for r in plotted]
    ax.bar(range(len(plotted)), [r.ratio for r in plotted], color=colors)
    for i, r in enumerate(plotted):
        if r.target is not None and r.target_kind == "ratio":
            ax.hlines(r.target, i - 0.4, i + 0.4, colors="black", linestyles="dashed")
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_xticks(range(len(plotted)), [r.name for r in plotted], rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("ours / anchor (throughput)")
    ax.set_title("xpuruntime vs anchors (dashed: target; green met, red missed)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_reports(
    results: Sequence[Result], out_dir: Path, failures: Sequence[tuple[str, str]] = (), chart: bool = True
) -> dict:
    """results.json, results.md and (with `chart`) ratios.png in `out_dir`; returns the JSON document."""
    out_dir.mkdir(parents=True, exist_ok=True)
    env = environment()
    doc = {
        "environment": env,
        "rows": [dataclasses.asdict(r) for r in results],
        "module_failures": [{"module": m, "error": e} for m, e in failures],
    }
    (out_dir / "results.json").write_text(json.dumps(doc, indent=2, default=str))
    text = markdown(results, env)
    if failures:
        text += "\nModules that failed to import:\n\n" + "".join(f"- `{m}`: {e}\n" for m, e in failures)
    (out_dir / "results.md").write_text(text)
    if chart and not bar_chart(results, out_dir / "ratios.png"):
        (out_dir / "ratios.png").unlink(missing_ok=True)  # an older run's chart must not pass for this one's
    return doc


def add_arguments(parser: Any) -> None:
    """The options of `xpuruntime bench` (here and in the `xpuruntime` command)."""
    parser.add_argument("--only", action="append", help="run rows whose name or group contains this (repeatable)")
    parser.add_argument("--out", default="bench-results", help="folder for results.json / .md / ratios.png")
    parser.add_argument("--list", action="store_true", help="list the rows and exit")
    parser.add_argument("--timer", choices=sorted(TIMERS), default="device",
                        help="GPU timing: device events with host latency hidden (default), or do_bench")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """`xpuruntime bench`: run the selected rows and write the reports (errors as the `xpuruntime` CLI gives them)."""
    import sys

    from ..cli import main as cli_main

    return cli_main(["bench", *(sys.argv[1:] if argv is None else argv)])


def run_cli(args: Any) -> int:
    """The body of `main` for parsed options (`add_arguments`), callable from the `xpuruntime` CLI."""
    only, out, timer = args.only, Path(args.out), args.timer
    from rich.console import Console

    console = Console()
    rows, failures = discover()
    for module, error in failures:
        console.print(f"[yellow]bench module {module} failed to import: {error}[/]")
    rows = select(rows, only)
    if args.list:
        for row in rows:
            console.print(f"{row.group:<12} {row.name:<40} target {_target_text(Result(**_target_fields(row)))}")
        return 0
    if not rows:
        console.print("[red]no benchmark rows selected[/]")
        return 1
    try:  # before the first row: a run of many minutes must not end in "cannot write"
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        from ..errors import ArgumentError

        raise ArgumentError(f"--out {str(out)!r}: cannot create the folder: {exc.strerror or exc}") from None
    results = run(rows, default_timer(timer), on_result=lambda done: write_reports(done, out, failures, chart=False))
    doc = write_reports(results, out, failures)
    say = functools.partial(console.print, markup=False, highlight=False, soft_wrap=True)  # rows stay whole in pipes
    say(markdown(results, doc["environment"]))  # the same header as results.md
    written = [out / name for name in ("results.json", "results.md", "ratios.png") if (out / name).exists()]
    say(f"wrote {', '.join(map(str, written))}")
    if _plottable(results) and not (out / "ratios.png").exists():
        say("ratios.png not drawn: matplotlib is not installed (pip install 'xpuruntime[bench]')", style="yellow")
    return 0 if all(r.status in ("ok", "skipped") for r in results) else 1


def _target_fields(row: Row) -> dict:
    return {"name": row.name, "group": row.group, "units": row.units, "target": row.target,
            "target_kind": row.target_kind}  # fmt: skip


__all__ = [
    "Result", "Row", "Setup", "add_arguments", "default_timer", "device_timer", "discover", "evaluate", "gpu_timer",
    "host_timer", "kernel_alternatives", "main", "markdown", "run", "run_row", "select", "write_reports",
]  # fmt: skip
