"""Run Python code in a child process with a wall-clock timeout and memory limits, so that a regression (a
hang, a runaway allocation, a crash) fails the test that meets it instead of stalling or killing CI.

    done = run_guarded("import xpuruntime as xrt; ...", timeout=30, memory=1 << 30)
    assert_clean(done)            # exit 0, no traceback, no signal

The child gets an address-space limit (`resource.RLIMIT_AS`: a runaway allocation fails inside it with a
MemoryError, or its kernel refuses it, long before the machine runs short), no core files, and is killed at
`timeout` (the test then fails, saying it hung).
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _limits(memory: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def run_guarded(
    code: str,
    *,
    timeout: float = 60,
    memory: int = 2 << 30,
    env: Mapping[str, str] | None = None,
    args: tuple[str, ...] = (),
    cwd: str | os.PathLike | None = None,
) -> subprocess.CompletedProcess:
    """`python -c code *args` in a child limited to `memory` bytes of address space; fails the test if it is
    still running after `timeout` seconds."""
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]), **(env or {})}
    command = [sys.executable, "-c", code, *args]
    try:
        return subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, env=environ, cwd=cwd,
            preexec_fn=lambda: _limits(memory),
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"hung: still running after {timeout} s\nstdout: {exc.stdout!r}\nstderr: {exc.stderr!r}")


def describe(done: subprocess.CompletedProcess) -> str:
    """How a child ended, for assertion messages."""
    how = f"exit code {done.returncode}"
    if done.returncode < 0:
        how = f"killed by {signal.Signals(-done.returncode).name}"
    return f"{how}\nstdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"


def assert_clean(done: subprocess.CompletedProcess) -> None:
    """Exit code 0 and no traceback on stderr."""
    assert done.returncode == 0 and "Traceback" not in done.stderr, describe(done)
