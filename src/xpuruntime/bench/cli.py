"""`xpuruntime bench`: run the rows and write one result file (with its markdown and chart), or `xpuruntime
bench report` to turn result files into BENCHMARKS.md."""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from ..errors import ArgumentError
from ..install import pip_hint
from . import report, summary
from .row import Result
from .runner import discover, run, select
from .timing import TIMERS, default_timer


def add_arguments(parser: Any) -> None:
    """The options of `xpuruntime bench` and its `report` subcommand."""
    parser.add_argument("--only", action="append", help="run rows whose subject, group or name contains this "
                        "(repeatable)")  # fmt: skip
    parser.add_argument("--out", default="bench-results", help="folder for the result file, its .md and .png")
    parser.add_argument("--name", help="file stem of the result (default: GPU_DATE_TIME_COMMIT)")
    parser.add_argument("--list", action="store_true", help="list the rows and their targets, then exit")
    parser.add_argument("--timer", choices=sorted(TIMERS), default="device",
                        help="GPU timing: device events with host latency hidden (default), or do_bench")  # fmt: skip
    sub = parser.add_subparsers(dest="bench_command", metavar="report")
    rep = sub.add_parser("report", help="write BENCHMARKS.md from result files (the latest figure of each row)")
    rep.add_argument("files", nargs="+", type=Path, metavar="RESULT.json", help="result files of `xpuruntime bench`")
    rep.add_argument("--output", type=Path, help="write here (default: print)")


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m xpuruntime.bench`: the same as `xpuruntime bench` (errors as the `xpuruntime` CLI gives them)."""
    from ..cli import main as cli_main

    return cli_main(["bench", *(sys.argv[1:] if argv is None else argv)])


def run_cli(args: Any) -> int:
    """The body of `xpuruntime bench` for parsed options (`add_arguments`)."""
    if getattr(args, "bench_command", None) == "report":
        return report_cli(args)
    console = Console()
    rows, failures = discover()
    for module, error in failures:
        console.print(f"[yellow]bench module {module} failed to import: {error}[/]")
    rows = select(rows, args.only)
    if args.list:
        for row in rows:
            target = report.target_text(Result.for_row(row))
            console.print(f"{row.subject:<12} {row.name:<48} target {target}", markup=False, highlight=False)
        return 0
    if not rows:
        console.print("[red]no benchmark rows selected[/]")
        return 1
    out = _writable_folder(Path(args.out))  # before the first row: a long run must not end in "cannot write"
    doc = report.document([], failures)
    stem = args.name or report.run_name(doc)
    say = functools.partial(console.print, markup=False, highlight=False, soft_wrap=True)  # rows stay whole in pipes

    def finished(done: list[Result]) -> None:
        """Each row as it ends: its line, flushed (a run cut short has shown what it measured), and the reports."""
        say(report.row_line(done[-1]))
        console.file.flush()
        report.write_run(done, out, stem, doc, chart=False)

    results = run(rows, default_timer(args.timer), progress=console.is_terminal, on_result=finished)
    written = report.write_run(results, out, stem, doc)
    say(report.markdown(results, doc))
    say(f"wrote {', '.join(map(str, written))}")
    if report.plottable(results) and len(written) < 3:
        say(f"{stem}.png not drawn: matplotlib is not installed ({pip_hint('bench')})", style="yellow")
    return 0 if all(r.status in ("ok", "skipped") for r in results) else 1


def _writable_folder(out: Path) -> Path:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ArgumentError(f"--out {str(out)!r}: cannot create the folder: {exc.strerror or exc}") from None
    return out


def report_cli(args: Any) -> int:
    """`xpuruntime bench report FILES [--output BENCHMARKS.md]`."""
    for path in args.files:
        if not path.is_file():
            raise ArgumentError(f"report: {str(path)!r} is not a result file")
    base = (args.output.parent if args.output else Path.cwd()).resolve()
    try:
        text = summary.benchmarks_markdown(args.files, base)
    except (ValueError, KeyError, TypeError) as exc:  # JSON that is not a result file
        raise ArgumentError(f"report: cannot read the result files: {type(exc).__name__}: {exc}") from None
    if args.output:
        args.output.write_text(text)
        print(f"wrote {args.output}")
    else:
        print(text, end="")
    return 0
