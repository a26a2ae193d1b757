"""What a run writes: one result file (JSON) with the machine, the versions, the commit and the date beside
every row's numbers, and next to it the same rows as a markdown table and a chart of the ratios."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import math
import os
import platform
import re
import subprocess
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..files import read_bytes
from .row import Result

MAX_RESULT_BYTES = 64 << 20  # a result file is tens of KB
FORMAT = 2  # result files written before the subjects split had no "format", "machine" or "commit"
PACKAGES = ("numpy", "torch", "triton", "nvmath-python", "cuda-core", "onnx", "onnxruntime", "xpuruntime")
_NVIDIA_SMI_FIELDS = ("driver_version", "clocks.sm", "clocks.max.sm", "clocks.mem", "power.limit")


def _cpu_name() -> str:
    from ..runtime.device import devices  # the CPU's model name, read through the checked opener

    return devices()[0].description or platform.processor() or platform.machine()


def _nvidia_smi() -> dict[str, str]:
    """Driver and clocks of GPU 0 from nvidia-smi, where it is installed (empty otherwise)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={','.join(_NVIDIA_SMI_FIELDS)}", "--format=csv,noheader", "--id=0"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return {}
    values = [v.strip() for v in out.strip().split(",")]
    return dict(zip(_NVIDIA_SMI_FIELDS, values)) if len(values) == len(_NVIDIA_SMI_FIELDS) else {}


def machine() -> dict[str, Any]:
    """The machine the numbers come from: GPU (name, driver, clocks where readable), CPU, OS."""
    info: dict[str, Any] = {"gpu": None, "cpu": _cpu_name(), "cpu_count": os.cpu_count(), "os": platform.platform()}
    try:
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                        compute_capability=f"{props.major}.{props.minor}", cuda=torch.version.cuda)  # fmt: skip
            info.update(_nvidia_smi())
    except ImportError:
        pass
    return info


def versions() -> dict[str, str | None]:
    """Python and the installed version of every package the numbers depend on (None: not installed)."""
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def commit() -> str | None:
    """The git commit of the checkout this package runs from ("+dirty" with uncommitted changes), or None when
    it is not run from a checkout (an installed wheel). XPURUNTIME_COMMIT overrides it: a copy of the tree on
    another machine may sit in no repository, or in a stale one (a GPU run once named last session's commit)."""
    given = os.environ.get("XPURUNTIME_COMMIT", "").strip()
    if given:
        return given
    here = Path(__file__).resolve().parent

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(here), *args], capture_output=True, text=True, timeout=20,
                              check=True).stdout.strip()  # fmt: skip

    try:
        head = git("rev-parse", "--short=10", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}+dirty" if dirty else head


def run_name(doc: dict[str, Any]) -> str:
    """The file stem of a run: GPU (or CPU), UTC date and time, commit, e.g. 'h100_2026-11-27_1402_1366ff6899'."""
    gpu = doc["machine"].get("gpu") or "cpu"
    slug = (re.findall(r"[A-Z]\d{2,4}[A-Za-z]*", gpu) or [re.sub(r"\W+", "-", gpu).strip("-")])[0].lower()
    stamp = (doc.get("date") or "undated")[:16].replace("T", "_").replace(":", "")
    return f"{slug}_{stamp}_{(doc.get('commit') or 'nocommit').replace('+', '-')}"


def document(results: Sequence[Result], failures: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
    """The result file's content: format, date, commit, machine, versions, rows, modules that failed."""
    return {
        "format": FORMAT,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": commit(),
        "machine": machine(),
        "versions": versions(),
        "rows": [dataclasses.asdict(r) for r in results],
        "module_failures": [{"module": m, "error": e} for m, e in failures],
    }


OLD_GROUPS = {"gemv": "gemm", "reduction": "elementwise"}  # groups of format-1 rows outside their subject's name


def load(path: Path) -> dict[str, Any]:
    """A result file as a document of the current format (older files had `environment` instead of `machine`,
    `versions` and `date`, and rows without a subject)."""
    doc = json.loads(read_bytes(path, "benchmark result file", limit=MAX_RESULT_BYTES))
    if doc.get("format") == FORMAT:
        return doc
    env = doc.get("environment", {})
    for row in doc.get("rows", []):
        row.setdefault("subject", OLD_GROUPS.get(row.get("group"), row.get("group")))
    return {
        "format": FORMAT, "date": env.get("time_utc"), "commit": doc.get("commit"),
        "machine": {"gpu": env.get("device")},
        "versions": {k: env.get(k) for k in ("python", "numpy", "torch", "triton", "nvmath")},
        "rows": doc.get("rows", []), "module_failures": doc.get("module_failures", []),
    }  # fmt: skip


def results_of(doc: dict[str, Any]) -> list[Result]:
    """The rows of a result document as Results (fields a file lacks keep their defaults)."""
    names = {f.name for f in dataclasses.fields(Result)}
    return [Result(**{k: v for k, v in row.items() if k in names}) for row in doc["rows"]]


# -- the markdown table ---------------------------------------------------------------------------------------
def fmt(value: float | None, digits: int = 3) -> str:
    """A number for a table: 3 significant digits, no exponent below 1000, '—' for none."""
    if value is None:
        return "—"
    return f"{value:.{digits}g}" if abs(value) < 1000 else f"{value:.0f}"


def target_text(r: Result) -> str:
    """'≥ 1.3×', '≥ 2.6 TB/s' or '≤ 3 µs over anchor'."""
    if r.target is None:
        return "—"
    if r.target_kind == "ratio":
        return f"≥ {r.target:.3g}×"
    if r.target_kind == "µs over anchor":
        return f"≤ +{r.target:g} µs"
    return f"≥ {r.target:g} {r.target_kind}"


def verdict(r: Result) -> str:
    """'met', 'missed by 4.2 %', or the row's status and message."""
    if r.status not in ("ok",):
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
    """'auto 0.99 · autotune 0.97 ⚠': the fastest kernel's time over each selection mode's, flagged below its
    floor (auto 0.95, autotune 0.98)."""
    from .runner import SELECTION_FLOORS

    parts = [f"{mode} {ratio:.3f}" for mode, ratio in r.selection_vs_best.items()]
    low = [mode for mode, ratio in r.selection_vs_best.items() if ratio < SELECTION_FLOORS[mode]]
    return " · ".join(parts) + (f" ⚠ {', '.join(low)} below floor" if low else "") if parts else "—"


def row_line(r: Result) -> str:
    """One finished row in one line, as a run prints it: ours, the anchor, the alternatives, ratio, verdict."""
    alternatives = "".join(f", {name} {fmt(ms)} ms" for name, ms in r.alternatives_ms.items())
    where = f"{r.subject}: " if r.subject else ""
    return (f"{where}{r.name}: ours {fmt(r.ours_value)} {r.units}, anchor {fmt(r.anchor_value)}{alternatives}; "
            f"ratio {fmt(r.ratio)} (target {target_text(r)}): {verdict(r)}")  # fmt: skip


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def header(doc: dict[str, Any]) -> str:
    """One line naming the machine, versions, commit and date of a run."""
    m, v = doc.get("machine", {}), doc.get("versions", {})
    gpu = m.get("gpu") or "no GPU"
    extra = ", ".join(f"{k} {m[k]}" for k in ("driver_version", "clocks.max.sm") if m.get(k))
    libs = ", ".join(f"{k} {v[k]}" for k in ("torch", "triton", "nvmath-python", "onnxruntime") if v.get(k))
    cpu = f"; CPU {m['cpu']}" if m.get("cpu") else ""
    return (f"{gpu}{f' ({extra})' if extra else ''}{cpu}; Python {v.get('python')}, {libs}; "
            f"commit {doc.get('commit') or 'unknown'}; {doc.get('date')}.")  # fmt: skip


def markdown(results: Sequence[Result], doc: dict[str, Any]) -> str:
    """The run as markdown: its header, then one table per subject (ours, anchor, ratio, target, verdict, how
    close the fastest registered kernel and the selection modes come)."""
    text = [f"{header(doc)} Ratio = ours over anchor throughput (> 1: ours faster).\n"]
    for subject in dict.fromkeys(r.subject for r in results):
        text += [
            f"\n### {subject or 'rows'}\n",
            "| row | anchor | ours | anchor value | units | ratio | target | verdict | fastest kernel / ours "
            "| fastest / selection |",
            "|---|---|---:|---:|---|---:|---|---|---|---|",
        ]
        for r in (r for r in results if r.subject == subject):
            text.append(
                f"| {_cell(r.name)} | {_cell(r.anchor or '—')} | {fmt(r.ours_value)} | {fmt(r.anchor_value)} | "
                f"{r.units} | {fmt(r.ratio)} | {target_text(r)} | {_cell(verdict(r))} | {_best_text(r)} | "
                f"{_selection_text(r)} |"
            )
    failures = doc.get("module_failures") or []
    if failures:
        text.append("\nModules that failed to import:\n")
        text += [f"- `{f['module']}`: {f['error']}" for f in failures]
    return "\n".join(text) + "\n"


# -- the chart ------------------------------------------------------------------------------------------------
def plottable(results: Sequence[Result]) -> list[Result]:
    """Rows with a finite, positive ratio."""
    return [r for r in results if r.ratio is not None and math.isfinite(r.ratio) and r.ratio > 0]


def ratio_chart(results: Sequence[Result], path: Path, title: str = "") -> bool:
    """A PNG of each row's ratio (ours over anchor) on a log scale, so that 0.004 and 1.3 both show, with
    each ratio target marked; False if nothing to plot or matplotlib (the `bench` extra) is missing."""
    plotted = plottable(results)
    if not plotted:
        return False
    try:
        import matplotlib
    except ImportError:
        return False

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator

    fig, ax = plt.subplots(figsize=(9.0, max(3.0, 0.28 * len(plotted) + 1.8)))
    y = list(range(len(plotted)))[::-1]
    colors = ["tab:green" if r.met else "tab:red" if r.met is False else "tab:gray" for r in plotted]
    ax.barh(y, [r.ratio - 1.0 for r in plotted], left=1.0, color=colors)  # from 1: left is slower, right faster
    ax.plot([r.ratio for r in plotted], y, "o", color="black", markersize=3)  # visible at a ratio of 1 too
    ax.set_xscale("log")
    targets = [r.target for r in plotted if r.target is not None and r.target_kind == "ratio" and r.target > 0]
    for yi, r in zip(y, plotted):
        if r.target is not None and r.target_kind == "ratio" and r.target > 0:
            ax.vlines(r.target, yi - 0.4, yi + 0.4, colors="black", linestyles="dashed")
    values = [r.ratio for r in plotted] + targets + [1.0]
    ax.set_xlim(min(values) / 1.25, max(values) * 1.25)
    ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 1.5, 2.0, 3.0, 5.0, 7.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    ax.axvline(1.0, color="gray", linewidth=0.8)
    ax.set_yticks(y, [f"{r.subject}: {r.name}" if r.subject else r.name for r in plotted], fontsize=7)
    ax.set_xlabel("ours / anchor throughput (log scale; right of 1: ours faster)")
    ax.set_title(
        "\n".join(textwrap.wrap(title or "xpuruntime vs anchors", 110))
        + "\ndashed: ratio target; green met, red missed",
        fontsize=7,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_run(results: Sequence[Result], out_dir: Path, stem: str, doc: dict[str, Any],
              chart: bool = True) -> list[Path]:  # fmt: skip
    """STEM.json (the result file), STEM.md and (with `chart`) STEM.png in `out_dir`; returns the files written.
    `doc` is the run's document (`document`), its rows replaced by `results`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {**doc, "rows": [dataclasses.asdict(r) for r in results]}
    json_path, md_path, png_path = (out_dir / f"{stem}{suffix}" for suffix in (".json", ".md", ".png"))
    json_path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    md_path.write_text(markdown(results, doc))
    written = [json_path, md_path]
    if chart and ratio_chart(results, png_path, header(doc)):
        written.append(png_path)
    else:
        png_path.unlink(missing_ok=True)  # an older chart of this stem must not pass for this run's
    return written
