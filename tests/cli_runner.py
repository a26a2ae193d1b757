"""Helpers for tests of the `xpuruntime` command line: run it in-process and read what it printed."""

from __future__ import annotations

import pytest

from xpuruntime.cli import main


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run `xpuruntime ARGV...` in this process: (exit code, stdout, stderr)."""
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line_error(err: str, command: str) -> bool:
    """Whether `err` is the one-line usage error of `xpuruntime COMMAND` (no traceback)."""
    return err.startswith(f"xpuruntime {command}: error: ") and len(err.strip().splitlines()) == 1


def table_rows(out: str) -> list[list[str]]:
    """The cells of every rich table row in `out` (rows drawn with '│' borders)."""
    return [[cell.strip() for cell in line.split("│")[1:-1]] for line in out.splitlines() if line.count("│") >= 3]


@pytest.fixture
def wide_plain_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rich output without colour and wide enough that no asserted phrase is wrapped."""
    monkeypatch.setenv("COLUMNS", "250")
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)
