"""`xpuruntime run [MODEL.onnx]`: run a model with random or given inputs; print output shapes, timing,
the pass summary (nodes before and after each pass) and the plan summary (steps per kernel).
Without a model it runs the built-in encoder made with onnx.helper (no download, no PyTorch)."""

from __future__ import annotations

import argparse
import time
import zipfile
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from ..errors import ArgumentError

_NUMPY = {"tensor(float)": "float32", "tensor(double)": "float64", "tensor(float16)": "float16",
          "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(int8)": "int8", "tensor(uint8)": "uint8",
          "tensor(bool)": "bool"}  # fmt: skip


def _dims(pairs: list[str]) -> dict[str, int]:
    result = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        if not value.strip().isdigit():
            raise ArgumentError(f"run: --dim expected NAME=INT, got {pair!r}")
        result[name.strip()] = int(value)
    return result


SHAPE_PRESERVING = ("Cast", "Identity", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Expand")


def index_limits(graph: Any) -> dict[str, int]:
    """For each integer input that indexes a constant table (a Gather's indices, directly or through casts and
    reshapes: token ids, token types, positions), the smallest table size along a gathered axis."""
    consumers = graph.consumers()
    limits: dict[str, int] = {}
    for value in graph.inputs:
        frontier, seen = [value.name], {value.name}
        while frontier:
            name = frontier.pop()
            for node in consumers.get(name, []):
                if node.domain:
                    continue
                table = graph.constant(node.inputs[0]) if node.op == "Gather" and node.inputs[1:2] == [name] else None
                if table is not None and table.ndim:
                    size = int(table.shape[node.attrs.get("axis", 0)])
                    limits[value.name] = min(limits.get(value.name, size), size)
                elif node.op in SHAPE_PRESERVING and node.inputs[0] == name and node.outputs[0] not in seen:
                    seen.add(node.outputs[0])
                    frontier.append(node.outputs[0])
    return limits


def random_feed(session: Any, dims: dict[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs of the model's declared types; symbolic dims from `dims` (default 2). Integers that index a
    table (token ids into an embedding) lie within it; other integers in [0, 10)."""
    rng = np.random.default_rng(seed)
    limits = index_limits(session.original)
    feed = {}
    for arg in session.get_inputs():
        shape = [d if isinstance(d, int) else dims.get(str(d), 2) for d in arg.shape]
        dtype = np.dtype(_NUMPY.get(arg.type, "float32"))
        if dtype.kind == "f":
            feed[arg.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            feed[arg.name] = rng.random(shape) < 0.5
        else:
            feed[arg.name] = rng.integers(0, max(limits.get(arg.name, 10), 1), shape).astype(dtype)
    return feed


def _load_feed(path: str) -> dict[str, np.ndarray]:
    expected = f"--inputs {path!r}: expected a .npz file (np.savez) with one array per model input"
    try:
        data = np.load(path)  # allow_pickle stays off: a feed is arrays, never code
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise ArgumentError(expected)
        with data:
            return {k: data[k] for k in data.files}
    except OSError as exc:
        raise ArgumentError(f"--inputs {path!r}: cannot read it: {exc.strerror or exc}") from None
    except (ValueError, zipfile.BadZipFile):  # not an archive (NumPy guesses a pickle), or object arrays
        raise ArgumentError(expected) from None


def _non_negative_int(text: str) -> int:
    """argparse type for --iterations: an integer >= 0."""
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return int(text)


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    """Run a model (or the built-in encoder) and print what happened."""
    from ..onnx import InferenceSession, SessionOptions
    from ..onnx.builtin import encoder_inputs, encoder_model

    options = SessionOptions(graph_optimization_level=args.level)
    model = args.model if args.model else encoder_model().SerializeToString()
    session = InferenceSession(model, options, policy=args.policy, device=args.device)
    dims = _dims(args.dim)
    if args.inputs:
        feed = _load_feed(args.inputs)
    elif args.model:
        feed = random_feed(session, dims)
    else:
        feed = encoder_inputs(dims.get("batch", 2), dims.get("seq", 16))
    start = time.perf_counter()
    outputs = session.run(None, feed)
    first_ms = (time.perf_counter() - start) * 1e3
    times = []
    for _ in range(args.iterations):
        start = time.perf_counter()
        session.run(None, feed)
        times.append((time.perf_counter() - start) * 1e3)
    name = args.model or "built-in encoder (onnx.helper)"
    console.print(f"[bold]{name}[/bold] on {session.device}, level {options.graph_optimization_level.name}")
    table = Table(title="outputs")
    for column in ("output", "shape", "dtype"):
        table.add_column(column)
    for arg, value in zip(session.get_outputs(), outputs):
        table.add_row(arg.name, str(tuple(value.shape)), str(value.dtype))
    console.print(table)
    median = f"{np.median(times):.3f} ms" if times else "-"
    console.print(f"first run (plans made) {first_ms:.3f} ms; median of {len(times)} runs {median}")
    passes = Table(title="passes")
    for column in ("pass", "nodes before", "nodes after", "changes"):
        passes.add_column(column, justify="right" if column != "pass" else "left")
    for record in session.pass_summary:
        passes.add_row(record.name, str(record.before), str(record.after), str(record.changes))
    console.print(passes)
    plans = Table(title="plan (steps per kernel)")
    plans.add_column("kernel")
    plans.add_column("steps", justify="right")
    for kernel_name, count in sorted(session.plan_summary().items(), key=lambda kv: -kv[1]):
        plans.add_row(kernel_name, str(count))
    console.print(plans)
    if args.explain:
        console.print(session.explain(verbose=True), markup=False, highlight=False)
    return 0


def add_parser(commands: Any) -> None:
    """Register the `run` subcommand on the CLI's subparsers."""
    run = commands.add_parser("run", help="run an ONNX model (default: a built-in encoder)")
    run.add_argument("model", nargs="?", help="MODEL.onnx (default: the built-in encoder)")
    run.add_argument("--device", default="cpu", help="cpu or cuda")
    run.add_argument("--policy", help="a policy string, like matmul=numpy_blas")
    run.add_argument("--inputs", help="a .npz file with one array per model input")
    run.add_argument("--level", default="all", choices=("disabled", "basic", "extended", "all"))
    run.add_argument("--dim", action="append", default=[], help="symbolic dim size NAME=INT (default 2)")
    run.add_argument("--iterations", type=_non_negative_int, default=10, help="timed runs after the first (default 10)")
    run.add_argument("--explain", action="store_true", help="print each step's kernel and why")
    run.set_defaults(handler=cmd_run)
