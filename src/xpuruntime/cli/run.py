"""`xpuruntime run [MODEL.onnx]`: run a model with random or given inputs; print output shapes, timing,
the pass summary (nodes before and after each pass) and the plan summary (steps per kernel).
Without a model it runs the built-in encoder made with onnx.helper (no download, no PyTorch)."""

from __future__ import annotations

import argparse
import os
import time
import zipfile
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from ..errors import ArgumentError, FileError
from ..files import open_binary, open_fd
from ..runtime.capacity import check_fits

_NUMPY = {"tensor(float)": "float32", "tensor(double)": "float64", "tensor(float16)": "float16",
          "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(int8)": "int8", "tensor(uint8)": "uint8",
          "tensor(bool)": "bool"}  # fmt: skip


def _dims(pairs: list[str]) -> dict[str, int]:
    result = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        value = value.strip()
        if not name.strip() or not (value.isascii() and value.isdigit()):  # isdigit alone takes '²'
            raise ArgumentError(f"run: --dim expected NAME=INT with a name and a size in digits, got {pair!r}")
        result[name.strip()] = int(value)
    return result


def _check_dims(session: Any, dims: dict[str, int]) -> None:
    """Every --dim names a symbolic dim of the model's inputs."""
    known = {str(d) for arg in session.get_inputs() for d in arg.shape if not isinstance(d, int)}
    unknown = sorted(set(dims) - known)
    if unknown:
        raise ArgumentError(
            f"run: --dim {', '.join(map(repr, unknown))}: the model's inputs have no such symbolic dim "
            f"(they have: {', '.join(sorted(known)) or 'none'})"
        )


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
    table (token ids into an embedding) lie within it; other integers in [0, 10). An input that cannot fit in
    memory raises OutOfMemoryError before anything is allocated."""
    rng = np.random.default_rng(seed)
    limits = index_limits(session.original)
    feed = {}
    for arg in session.get_inputs():
        shape = [d if isinstance(d, int) else dims.get(str(d), 2) for d in arg.shape]
        dtype = np.dtype(_NUMPY.get(arg.type, "float32"))
        check_fits(f"run: input '{arg.name}'", shape, dtype.name, dtype.itemsize, "cpu")
        if dtype.kind == "f":
            feed[arg.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            feed[arg.name] = rng.random(shape) < 0.5
        else:
            feed[arg.name] = rng.integers(0, max(limits.get(arg.name, 10), 1), shape).astype(dtype)
    return feed


def _load_feed(path: str) -> dict[str, np.ndarray]:
    """The arrays of an .npz file, each checked to fit in memory (from its header) before it is read."""
    expected = f"--inputs {path!r}: expected a .npz file (np.savez) with one array per model input"
    try:
        with open_binary(path, "--inputs file") as file:
            data = np.load(file)  # allow_pickle stays off: a feed is arrays, never code
            if not isinstance(data, np.lib.npyio.NpzFile):
                raise ArgumentError(expected)
            with data:
                for name in data.files:
                    shape, dtype = _npy_header(data.zip, name)
                    check_fits(f"--inputs {path!r}: array '{name}'", shape, dtype.name, dtype.itemsize, "cpu")
                return {k: data[k] for k in data.files}
    except FileError as exc:
        raise ArgumentError(f"run: {exc}") from None
    except OSError as exc:
        raise ArgumentError(f"--inputs {path!r}: cannot read it: {exc.strerror or exc}") from None
    except (ValueError, zipfile.BadZipFile, EOFError):  # not an archive (NumPy guesses a pickle), object arrays
        raise ArgumentError(expected) from None


def _npy_header(archive: zipfile.ZipFile, name: str) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of one array of an .npz archive, read from its header alone."""
    with archive.open(f"{name}.npy") as member:
        version = np.lib.format.read_magic(member)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(member)
    return shape, dtype


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    """Run a model (or the built-in encoder) and print what happened."""
    from ..onnx import InferenceSession, SessionOptions
    from ..onnx.builtin import encoder_inputs, encoder_model

    options = SessionOptions(graph_optimization_level=args.level)
    dims = _dims(args.dim)
    if args.model:
        os.close(open_fd(args.model, "ONNX model file"))  # a regular file: a FIFO would block the loader forever
    model = args.model if args.model else encoder_model().SerializeToString()
    session = InferenceSession(model, options, policy=args.policy, device=args.device)
    _check_dims(session, dims)
    if args.inputs:
        feed = _load_feed(args.inputs)
    elif args.model:
        feed = random_feed(session, dims)
    else:
        batch, seq = dims.get("batch", 2), dims.get("seq", 16)
        check_fits("run: inputs 'input_ids' and 'attention_mask'", (2, batch, seq), "int64", 8, "cpu")
        feed = encoder_inputs(batch, seq)
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
    from . import bounded_int

    run = commands.add_parser("run", help="run an ONNX model (default: a built-in encoder)")
    run.add_argument("model", nargs="?", help="MODEL.onnx (default: the built-in encoder)")
    run.add_argument("--device", default="cpu", help="cpu or cuda")
    run.add_argument("--policy", help="a policy string, like matmul=numpy_blas")
    run.add_argument("--inputs", help="a .npz file with one array per model input")
    run.add_argument("--level", default="all", choices=("disabled", "basic", "extended", "all"))
    run.add_argument("--dim", action="append", default=[], help="symbolic dim size NAME=INT (default 2)")
    run.add_argument("--iterations", type=bounded_int(0), default=10, help="timed runs after the first (default 10)")
    run.add_argument("--explain", action="store_true", help="print each step's kernel and why")
    run.set_defaults(handler=cmd_run)
