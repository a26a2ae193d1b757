"""The `xpuruntime` command: info, kernels, explain, demo, run, bench and cache.

    xpuruntime info
    xpuruntime kernels matmul
    xpuruntime explain matmul --shape 256x512 --shape 512x128 --dtype float16 --policy matmul=blocked
    xpuruntime demo --trace trace.json
    xpuruntime bench --only norm --out bench-results
    xpuruntime cache list

Errors the runtime reports (unknown names, bad shapes, bad policies) become a one-line message on stderr
and exit code 2, as argparse does for usage errors.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import sys
from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .. import __version__
from ..errors import ArgumentError, FileError, XpuRuntimeError, cut

OPTIONAL_PACKAGES = (
    "torch", "triton", "nvmath-python", "cuda-core", "cuda-python", "cuda-bindings", "onnx", "onnxruntime",
)  # fmt: skip
_WORDS = {"true": True, "false": False, "none": None, "null": None}
PIPE_WIDTH = 160  # columns for output that is not a terminal (pipes, CI logs, tests) instead of rich's 80

Handler = Callable[[argparse.Namespace, Console], int]


# -- parsing helpers ---------------------------------------------------------------------------
def parse_shape(text: str) -> tuple[int, ...]:
    """'256x512' -> (256, 512); '' or 'scalar' -> () for a 0-d tensor."""
    text = text.strip().lower()
    if text in ("", "scalar", "()"):
        return ()
    try:
        shape = tuple(int(part) for part in text.split("x"))
    except ValueError:
        raise ArgumentError(f"bad --shape {text!r}: expected sizes separated by 'x', like 256x512") from None
    if any(n < 0 for n in shape):
        raise ArgumentError(f"bad --shape {text!r}: sizes must be >= 0")
    return shape


def parse_literal(text: str) -> Any:
    """A small literal parser for --attr values: ints, floats, true/false, None, tuples '(0,1)' or '0,1'."""
    text = text.strip()
    if text.lower() in _WORDS:
        return _WORDS[text.lower()]
    if (text[:1] in "([" and text[-1:] in ")]") or "," in text:
        inner = text[1:-1] if text[:1] in "([" else text
        return tuple(parse_literal(part) for part in inner.split(",") if part.strip())
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def parse_attr(text: str) -> tuple[str, Any]:
    """'axis=-1' -> ('axis', -1)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip() or not value.strip():
        raise ArgumentError(f"bad --attr {text!r}: expected name=value, like axis=-1")
    return key.strip(), parse_literal(value)


def tensor_specs(shapes: Sequence[str], dtypes: Sequence[str]) -> list[Any]:
    """One TensorSpec per --shape, with one --dtype for all or one per shape."""
    from ..abi import TensorSpec

    if len(dtypes) > 1 and len(dtypes) != len(shapes):
        raise ArgumentError(
            f"give one --dtype for all shapes or one per --shape (got {len(dtypes)} dtypes for {len(shapes)} shapes)"
        )
    dtypes = list(dtypes) * len(shapes) if len(dtypes) == 1 else list(dtypes)
    specs = []
    for shape, dtype in zip(shapes, dtypes):
        sizes = parse_shape(shape)
        try:
            specs.append(TensorSpec(sizes, dtype))
        except ArgumentError as exc:  # TensorSpec names its field; the user typed an option
            raise ArgumentError(f"bad --dtype {dtype!r}: {str(exc).partition(' expected ')[2]}") from None
    return specs


# -- small formatting helpers --------------------------------------------------------------------
def _table(title: str, columns: Sequence[str], right: Sequence[str] = ()) -> Table:
    """A titled table with the given columns, those in `right` right-aligned (numbers)."""
    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column, justify="right" if column in right else "left")
    return table


def make_console() -> Console:
    """A rich console; wide tables stay readable when piped (COLUMNS, if set, still wins)."""
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = PIPE_WIDTH
    return console


def _yes(flag: bool) -> str:
    """'yes' or '-', so set flags stand out in a column."""
    return "yes" if flag else "-"


def _package_version(name: str) -> str:
    """Installed version from the package metadata, without importing the package."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _gib(nbytes: int | None) -> str:
    """Memory size in GiB, '-' when unknown."""
    return "-" if nbytes is None else f"{nbytes / 2**30:.1f} GiB"


# -- commands ------------------------------------------------------------------------------------
def cmd_info(args: argparse.Namespace, console: Console) -> int:
    """Versions, backends (and why any is missing), devices and the CUDA probe report."""
    import numpy

    from ..registry import default_registry
    from ..runtime import extension
    from ..runtime.device import devices, probe_report
    from ..runtime.tuning_cache import cache_dir

    versions = _table("Versions", ("package", "version"))
    versions.add_row("xpuruntime", __version__)
    versions.add_row("Python", f"{platform.python_version()} ({platform.python_implementation()})")
    versions.add_row("numpy", numpy.__version__)
    for name in OPTIONAL_PACKAGES:
        versions.add_row(name, _package_version(name))
    console.print(versions)

    registry = default_registry()
    backends = _table("Backends", ("backend", "device", "status", "kernels", "doc"), right=("kernels",))
    for backend in registry.backends.values():
        reason = backend.unavailable_reason
        status = "[green]available[/]" if reason is None else f"[red]unavailable:[/] {escape(reason)}"
        count = sum(k.backend == backend.name for table in registry.kernels.values() for k in table.values())
        backends.add_row(backend.name, backend.device_type, status, str(count), escape(backend.doc))
    for module, reason in registry.missing_backends.items():
        backends.add_row(module, "-", f"[red]not loaded:[/] {escape(reason)}", "0", "")
    console.print(backends)

    table = _table("Devices", ("device", "description", "compute capability", "SMs / cores", "memory", "source"))
    for d in devices():
        cc = "-" if d.compute_capability is None else "sm{}{}".format(*d.compute_capability)
        cores = "-" if d.multiprocessors is None else str(d.multiprocessors)
        table.add_row(d.name, escape(d.description), cc, cores, _gib(d.total_memory_bytes), d.source)
    console.print(table)
    for line in probe_report() or ["a CUDA device was found"]:
        console.print(f"CUDA probe: {escape(line)}", highlight=False)
    gpu = [b.name for b in registry.backends.values() if b.device_type == "cuda" and b.unavailable_reason is None]
    console.print(f"GPU backends available: {', '.join(gpu) or 'none'}", highlight=False)
    try:
        folder = escape(str(cache_dir()))
    except FileError as exc:
        folder = f"[red]unusable:[/] {escape(str(exc))}"
    console.print(f"Tuning cache: {folder} (set XPURUNTIME_CACHE_DIR to move it)", highlight=False)
    console.print(f"C++ extension: {escape(extension.status())}", highlight=False)
    return 0


def cmd_kernels(args: argparse.Namespace, console: Console) -> int:
    """The registry: every kernel of one op (or all ops) with its hints and availability."""
    from ..registry import default_registry

    registry = default_registry()
    ops = [args.op] if args.op else sorted(registry.ops)
    columns = ("op", "kernel", "backend", "priority", "fused", "tensor cores", "deterministic", "dtypes",
               "available", "doc")  # fmt: skip
    table = _table("Registered kernels", columns, right=("priority",))
    for op in ops:
        for k in registry.kernels_for(op):  # raises UnknownOpError (with a suggestion) for an unknown op
            reason = registry.backends[k.backend].unavailable_reason
            available = "[green]yes[/]" if reason is None else f"[red]no:[/] {escape(reason)}"
            dtypes = "any" if k.dtypes is None else ", ".join(sorted(k.dtypes))
            table.add_row(op, k.name, k.backend, str(k.priority), _yes(k.fused), _yes(k.tensor_cores),
                          _yes(k.deterministic), dtypes, available, escape(k.doc))  # fmt: skip
        table.add_section()
    console.print(table)
    return 0


def cmd_explain(args: argparse.Namespace, console: Console) -> int:
    """Every candidate kernel for a call described by shapes and dtypes; exit 1 if none would run."""
    from ..dispatch import explain

    specs = tensor_specs(args.shape, args.dtype or ["float32"])
    attrs = dict(parse_attr(text) for text in args.attr)
    explanation = explain(args.op, *specs, policy=args.policy, show=False, **attrs)
    explanation.print(console)
    return 0 if explanation.error is None else 1


def cmd_demo(args: argparse.Namespace, console: Console) -> int:
    """The built-in demo: an encoder forward pass under four policies (see xpuruntime.demo)."""
    from ..profiling import check_trace_path
    from .demo import run_demo

    if args.trace is not None:  # before any work, and `--trace ""` too: the message names the option
        check_trace_path(args.trace, "--trace")
    return run_demo(console, iterations=args.iterations, size=args.size, trace=args.trace)


def cmd_bench(args: argparse.Namespace, console: Console) -> int:
    """Our kernels beside their anchors (see xpuruntime.bench): JSON, markdown and a PNG of ratios."""
    from ..bench import run_cli

    return run_cli(args)


# -- the parser ----------------------------------------------------------------------------------
MAX_ITERATIONS = 100_000  # a bound on repeated runs: a mistyped count must not run for days


def bounded_int(low: int, high: int = MAX_ITERATIONS) -> Callable[[str], int]:
    """argparse type: an integer in [low, high], in ASCII digits ('²' is a digit to str.isdigit)."""

    def parse(text: str) -> int:
        digits = text.strip()
        if not (digits.isascii() and digits.isdigit()) or not low <= int(digits) <= high:
            raise argparse.ArgumentTypeError(f"expected an integer from {low} to {high}, got {cut(text, 40)!r}")
        return int(digits)

    return parse


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser; each subcommand stores its handler in `handler`."""
    parser = argparse.ArgumentParser(prog="xpuruntime", description="Pick, explain and run kernels.")
    parser.add_argument("--version", action="version", version=f"xpuruntime {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    info = commands.add_parser("info", help="versions, backends, devices")
    info.set_defaults(handler=cmd_info)

    kernels = commands.add_parser("kernels", help="list registered kernels")
    kernels.add_argument("op", nargs="?", help="only this op's kernels")
    kernels.set_defaults(handler=cmd_kernels)

    ex = commands.add_parser("explain", help="explain kernel selection for a call")
    ex.add_argument("op")
    ex.add_argument("--shape", action="append", default=[], help="one per input: 256x512, 4x16x2048x128, scalar")
    ex.add_argument("--dtype", action="append", help="one for all inputs, or one per --shape (default float32)")
    ex.add_argument("--policy", help="a policy string, like matmul=blocked,strict=true")
    ex.add_argument("--attr", action="append", default=[], help="op attribute name=value, like axis=-1")
    ex.set_defaults(handler=cmd_explain)

    demo = commands.add_parser("demo", help="run the built-in encoder demo under several policies")
    demo.add_argument("--iterations", type=bounded_int(1), default=3, help="forward passes per policy (default 3)")
    demo.add_argument("--trace", help="profile the auto run and write a Chrome trace here")
    demo.add_argument("--size", choices=("small", "medium"), default="small")
    demo.set_defaults(handler=cmd_demo)

    bench = commands.add_parser("bench", help="benchmark our kernels beside their anchors (GPU)")
    from ..bench import add_arguments as bench_arguments

    bench_arguments(bench)
    bench.set_defaults(handler=cmd_bench)

    from .cache import add_parser as add_cache_parser
    from .run import add_parser as add_run_parser  # the InferenceSession command lives in its own module

    add_run_parser(commands)
    add_cache_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `xpuruntime` console script and `python -m xpuruntime`; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version and usage errors: argparse has printed the message
        return int(exc.code or 0)
    handler: Handler = args.handler
    try:
        return handler(args, make_console())
    except (XpuRuntimeError, OSError) as exc:
        print(f"xpuruntime {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except MemoryError as exc:  # what was asked for does not fit (sizes are checked first where they are known)
        print(f"xpuruntime {args.command}: error: out of memory: {exc or 'an allocation failed'}", file=sys.stderr)
        return 2
