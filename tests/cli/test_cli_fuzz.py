"""CLI fuzz test (issue 26, "Done when"): every `xpuruntime` subcommand, found in the argparse parser (a new
subcommand or option is fuzzed without editing this file), run with random arguments: valid values, junk
text, huge numbers, odd dims ('n=²', 'batch=99999999999', '=5'), empty attributes ('axis='), special files
(a FIFO, /dev/zero, a folder) as models, inputs, traces and output folders, and a hostile environment
(bad policies, a policy file that is a FIFO, XPURUNTIME_CACHE_DIR='~nouser/x').

The contract: no traceback; exit code 0, 1 (a documented "nothing to run", e.g. explain finding no kernel)
or 2 with a one-line `error:` message for a user error. The commands run in one child process with a
timeout and a memory limit, so a hang (a FIFO read) or a runaway allocation fails the test instead of CI."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
from guarded import assert_clean, run_guarded

EXAMPLES = {"info": 3, "kernels": 12, "explain": 60, "demo": 2, "bench": 2, "run": 20}  # others: DEFAULT_EXAMPLES
DEFAULT_EXAMPLES = 12
ALWAYS = {"bench": ("--only",)}  # every bench row on the CPU takes most of a minute: the fuzz narrows the run
SEED = int(os.environ.get("XPURUNTIME_FUZZ_SEED", "26"))


def subcommands() -> dict[str, argparse.ArgumentParser]:
    from xpuruntime.cli import build_parser

    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def value_pools(files: dict[str, str]) -> dict[str, tuple[list[str], list[str]]]:
    """(valid values, invalid values) by option name (`dest`); other options draw from "junk"."""
    junk = ["", " ", "x", "-1", "²", "=", "a=b", "None", "\xff", "x" * 3000, "99999999999",
            files["fifo"], files["dev zero"], files["folder"], files["missing"]]  # fmt: skip
    return {
        "junk": (["0", "3", "1e3"], junk),
        "op": (["softmax", "sum", "sin_affine", "matmul"], ["nope", "matmull", "", "x" * 3000]),
        "shape": (["3x4", "4x4", "4"], ["", "0x3", "x", "-1x2", "3xx4", "2x3x4", "99999999999x99999999999"]),
        "dtype": (["float32"], ["float64", "float16", "bfloat16", "int64", "float", "nope", ""]),
        "attr": (
            ["axis=-1", "keepdims=true", "normalized_shape=4", "eps=1e-5"],
            [
                "=",
                "axis",
                "axis=",
                "axis=(0,1)",
                "is_causal=yes",
                "nope=1",
                "axis=[0",
                "eps=1e400",
                "scale=" + "9" * 400,
            ],
        ),
        "policy": (
            ["matmul=blocked", "sum=numpy", "softmax=numpy,strict=true"],
            ["strictt=1", "sum=nope", ",", "=", "x" * 3000],
        ),
        "dim": (["batch=3", "seq=5", "batch=1"], ["n=²", "batch=99999999999", "=5", "batch=", "batch=-1", "nope=4"]),
        "iterations": (["0", "1", "2"], ["-2", "x", "99999999999999999999", ""]),
        "model": ([files["model"]], [files["garbage"], files["empty"], *junk[-4:]]),
        "inputs": ([files["feed"]], [files["garbage"], files["empty"], *junk[-4:]]),
        "trace": ([files["trace"]], [files["folder"], files["fifo"], files["missing dir"], ""]),
        "out": ([files["out"]], [files["fifo"], files["dev zero"], "/proc/version", ""]),
        "device": (["cpu"], ["cuda:7", "nope", ""]),
        "only": (["norm", "gemm"], ["nope"]),  # "" selects every row: a long run, left out
    }


def draw_argv(rng: random.Random, command: str, parser: argparse.ArgumentParser, pools: dict) -> list[str]:
    """A command line for `command`: each option of its parser present or not, with a drawn value (now and
    then an invalid one, so that both what works and what is refused are reached)."""
    argv = [command]
    valid_share = rng.choice([1.0, 0.8])  # half the lines valid throughout, the others with junk here and there
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if not action.option_strings:  # a positional: usually there
            if rng.random() < (0.95 if action.nargs is None else 0.7):
                argv.append(_value(rng, action, pools, valid_share))
            continue
        for _ in range(rng.choice([0, 0, 1, 1, 2]) if action.nargs != 0 else rng.choice([0, 1])):
            argv.append(action.option_strings[0])
            if action.nargs != 0:
                argv.append(_value(rng, action, pools, valid_share))
    for option in ALWAYS.get(command, ()):
        if option not in argv:
            argv += [option, rng.choice(pools[option.lstrip("-")][0])]
    if rng.random() < 0.05 * (valid_share < 1):
        argv.append(rng.choice(["--nope", "extra", "-x", "--"]))
    return argv


def _value(rng: random.Random, action: argparse.Action, pools: dict, valid_share: float) -> str:
    valid, invalid = pools.get(action.dest, pools["junk"])
    if action.choices:
        valid = [str(c) for c in action.choices]
    return rng.choice(valid if rng.random() < valid_share else invalid)


ENVIRONMENTS = [{}] * 9 + [{"XPURUNTIME_POLICY": "sum=numpy"}, {"XPURUNTIME_POLICY": "strictt=1"},
                            {"XPURUNTIME_POLICY_FILE": "fifo"}, {"XPURUNTIME_CACHE_DIR": "~nouser/x"}]  # fmt: skip


def make_files(folder: Path) -> dict[str, str]:
    """A valid model and feed, and every kind of file a user should not hand us."""
    from xpuruntime.onnx.builtin import encoder_inputs, encoder_model

    files = {name: folder / name for name in ("model.onnx", "feed.npz", "garbage.onnx", "empty", "fifo", "folder")}
    files["model.onnx"].write_bytes(encoder_model().SerializeToString())
    np.savez(files["feed.npz"], **encoder_inputs(2, 8))
    files["garbage.onnx"].write_bytes(os.urandom(300))
    files["empty"].write_bytes(b"")
    os.mkfifo(files["fifo"])
    files["folder"].mkdir()
    return {
        "model": str(files["model.onnx"]), "feed": str(files["feed.npz"]), "garbage": str(files["garbage.onnx"]),
        "empty": str(files["empty"]), "fifo": str(files["fifo"]), "folder": str(files["folder"]),
        "dev zero": "/dev/zero", "missing": str(folder / "missing.onnx"), "trace": str(folder / "trace.json"),
        "missing dir": str(folder / "no" / "such" / "trace.json"), "out": str(folder / "bench-out"),
    }  # fmt: skip


def run_one(argv: list[str], environ: dict[str, str]) -> tuple[int, str]:
    """`xpuruntime argv` in this process under `environ`; (exit code, everything printed)."""
    from xpuruntime import policy
    from xpuruntime.cli import main

    saved = {k: os.environ.get(k) for k in environ}
    os.environ.update(environ)
    policy.forget_environment()
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            code = main(argv)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        policy.forget_environment()
    return code, out.getvalue()


def child_main(folder: str) -> None:
    """Run every subcommand's examples (in the child process); print one JSON report."""
    os.chdir(folder)
    rng = random.Random(SEED)
    files = make_files(Path(folder))
    pools = value_pools(files)
    problems, counts, seconds = [], {}, {}
    for command, parser in sorted(subcommands().items()):
        codes = counts.setdefault(command, {})
        start = time.perf_counter()
        for _ in range(EXAMPLES.get(command, DEFAULT_EXAMPLES)):
            argv = draw_argv(rng, command, parser, pools)
            environ = {k: (files["fifo"] if v == "fifo" else v) for k, v in rng.choice(ENVIRONMENTS).items()}
            print(f"xpuruntime {argv} {environ}", file=sys.__stderr__, flush=True)  # the last one, if it hangs
            code, output = run_one(argv, environ)
            codes[code] = codes.get(code, 0) + 1
            problem = judge(code, output)
            if os.environ.get("XPURUNTIME_FUZZ_VERBOSE"):
                print(code, argv, environ, output.strip().splitlines()[-1:], file=sys.__stderr__)
            if problem:
                problems.append({"argv": argv, "env": environ, "problem": problem, "output": output[-1500:]})
        seconds[command] = round(time.perf_counter() - start, 1)
    print(json.dumps({"problems": problems, "counts": counts, "seconds": seconds}))


def judge(code: int, output: str) -> str | None:
    """What is wrong with one run, if anything."""
    if "Traceback" in output:
        return "printed a traceback"
    if code not in (0, 1, 2):
        return f"exit code {code}"
    if code == 2 and "error:" not in output:
        return "exit code 2 without an 'error:' message"
    if code != 2 and "error:" in output.lower() and "xpuruntime" in output and ": error:" in output:
        return f"an error message with exit code {code} (user errors exit with 2)"
    return None


CHILD = textwrap.dedent(
    """
    import sys
    sys.path[:0] = [sys.argv[2], sys.argv[3]]  # this folder, and tests/ for the shared helpers
    import test_cli_fuzz
    test_cli_fuzz.child_main(sys.argv[1])
    """
)


def test_every_subcommand_survives_random_arguments(tmp_path):
    done = run_guarded(
        CHILD, args=(str(tmp_path), str(Path(__file__).parent), str(Path(__file__).parents[1])), timeout=420,
        memory=3 << 30,
        env={"XPURUNTIME_CACHE_DIR": str(tmp_path / "cache"), "XPURUNTIME_NATIVE": "0", "COLUMNS": "160"},
    )  # fmt: skip
    assert_clean(done)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(report["counts"]) == set(subcommands()), report["counts"]
    for command, codes in report["counts"].items():
        assert sum(codes.values()) == EXAMPLES.get(command, DEFAULT_EXAMPLES)
    assert not report["problems"], json.dumps(report["problems"][:5], indent=1)
    print(report["counts"], report["seconds"])  # exit codes per command: 0 ran, 1 nothing to run, 2 refused


REPRODUCERS = [  # issue 26 item 11: each was a traceback or was taken for something else
    (["run", "--dim", "batch=²", "--iterations", "0"], {}, "--dim expected NAME=INT"),
    (["run", "--dim", "batch=99999999999", "--iterations", "0"], {}, "needs 23.3 TiB"),
    (["run", "--dim", "=5", "--iterations", "0"], {}, "--dim expected NAME=INT"),
    (["run", "--dim", "n=5", "--iterations", "0"], {}, "no such symbolic dim (they have: batch, seq)"),
    (["explain", "softmax", "--shape", "2x3", "--attr", "axis="], {}, "bad --attr 'axis='"),
    (["run", "--iterations", "99999999999999999999"], {}, "expected an integer from 0 to 100000"),
]


def test_the_issue_reproducers_are_one_line_errors(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    for argv, environ, message in REPRODUCERS:
        code, output = run_one(argv, environ)
        assert code == 2 and message in output and "Traceback" not in output, (argv, output)
    code, output = run_one(["info"], {"XPURUNTIME_CACHE_DIR": "~nouser/x", "COLUMNS": "300"})
    assert code == 0 and "Traceback" not in output
    assert "Tuning cache: unusable: XPURUNTIME_CACHE_DIR='~nouser/x': '~nouser' names no user" in output
