"""`xpuruntime cache [info|list|clear]`: what the tuning cache holds, for which GPU and library versions, how
much room it takes, and clearing it (all of it, one kind, or only the entries that would be ignored)."""

from __future__ import annotations

import argparse
import datetime
import shutil
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..runtime import tuning_cache
from ..runtime.tuning_cache import Entry

# key fields shown elsewhere in a row, or too long for it
_NOT_SHOWN = {"op", "dtypes", "shape", "shapes", "layout", "arch", "device", "versions", "candidates", "source",
              "timing", "selection", "args", "attrs"}  # fmt: skip


def add_parser(commands: Any) -> None:
    """Register `cache` and its subcommands on the CLI's subparsers."""
    cache = commands.add_parser("cache", help="the tuning cache: what it holds, its size; clear it")
    actions = cache.add_subparsers(dest="cache_command", metavar="info|list|clear")
    actions.add_parser("info", help="the folder, entries per kind, size, stale entries, compiled extensions")
    listing = actions.add_parser("list", help="one line per entry: what was tuned, for which GPU, the result")
    listing.add_argument("--kind", help="only entries of this op or tuned kernel, like matmul")
    listing.add_argument("--stale", action="store_true", help="only entries that would be ignored")
    clear = actions.add_parser("clear", help="delete entries (all of them unless --kind or --stale)")
    clear.add_argument("--kind", help="only entries of this op or tuned kernel")
    clear.add_argument("--stale", action="store_true", help="only entries that would be ignored (other versions, "
                       "corrupt)")  # fmt: skip
    clear.add_argument("--native", action="store_true", help="also the compiled C++ extension (rebuilt on next use)")
    cache.set_defaults(handler=cmd_cache)


def cmd_cache(args: argparse.Namespace, console: Console) -> int:
    """Dispatch to info (the default), list or clear."""
    command = args.cache_command or "info"
    if command == "list":
        return _list(console, _select(args))
    if command == "clear":
        return _clear(console, _select(args), args.native)
    return _info(console)


def _select(args: argparse.Namespace) -> list[Entry]:
    found = tuning_cache.entries()
    if getattr(args, "kind", None):
        found = [e for e in found if e.kind == args.kind]
    if getattr(args, "stale", False):
        found = [e for e in found if e.problem is not None]
    return found


def _size(nbytes: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if nbytes < 1024 or unit == "MiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return ""  # pragma: no cover


def _native_builds() -> list[Path]:
    """The compiled C++ extension's files (one library per PyTorch, Python and source version, and any build
    folder in progress)."""
    folder = tuning_cache.cache_dir() / "native"
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []


def _info(console: Console) -> int:
    found = tuning_cache.entries()
    folder = tuning_cache.cache_dir()
    console.print(f"cache folder: {escape(str(folder))} ({tuning_cache.ENV_CACHE_DIR} moves it)"
                  + ("" if folder.exists() else "; not created yet"), highlight=False)  # fmt: skip
    table = Table(title="Tuning cache", title_justify="left")
    for column in ("kind", "entries", "stale or corrupt", "devices", "size"):
        table.add_column(column, justify="right" if column in ("entries", "stale or corrupt", "size") else "left")
    for kind in sorted({e.kind for e in found}):
        mine = [e for e in found if e.kind == kind]
        archs = sorted({str(e.key.get("arch")) for e in mine if e.key and e.key.get("arch")})
        table.add_row(kind, str(len(mine)), str(sum(e.problem is not None for e in mine)), ", ".join(archs),
                      _size(sum(e.size for e in mine)))  # fmt: skip
    table.add_row("all", str(len(found)), str(sum(e.problem is not None for e in found)), "",
                  _size(sum(e.size for e in found)), style="bold")  # fmt: skip
    console.print(table)
    versions = ", ".join(f"{name} {tuning_cache.library_version(name)}" for name in tuning_cache.LIBRARIES)
    console.print(f"entries are used under: {versions}", highlight=False)
    native = _native_builds()
    console.print(f"compiled C++ extension: {len(native)} file(s), {_size(sum(p.stat().st_size for p in native))}",
                  highlight=False)  # fmt: skip
    return 0


def _signature(key: dict | None) -> str:
    """What was tuned, in a line: dtypes with shapes (or the bucketed shape), layout and other key fields."""
    if key is None:
        return "?"
    dtypes = key.get("dtypes") or []
    if key.get("shapes") is not None:
        parts = [f"{d}[{'x'.join(map(str, s))}]" for d, s in zip(dtypes, key["shapes"])]
    else:
        parts = [*dtypes, *([key["layout"]] if isinstance(key.get("layout"), str) and key["layout"] else []),
                 "x".join(map(str, key.get("shape") or []))]  # fmt: skip
    extra = [f"{k}={v}" for k, v in sorted(key.items()) if k not in _NOT_SHOWN and not isinstance(v, (dict, list))]
    return " ".join(p for p in (*parts, *extra) if p)


def _result(value: dict | None) -> str:
    if value is None:
        return "?"
    result = value.get("kernel") or value.get("config")
    times = value.get("times_us")
    timed = f" (of {len(times)} timed)" if isinstance(times, dict) and times else ""
    return f"{result}{timed}"


def _list(console: Console, found: list[Entry]) -> int:
    table = Table(title=f"Tuning cache: {len(found)} entries", title_justify="left")
    for column in ("kind", "tuned for", "device", "result", "state", "size", "written"):
        table.add_column(column, justify="right" if column == "size" else "left")
    for e in found:
        arch = str((e.key or {}).get("arch") or "")
        written = datetime.datetime.fromtimestamp(e.modified).strftime("%Y-%m-%d %H:%M")
        table.add_row(escape(e.kind), escape(_signature(e.key)), arch, escape(_result(e.value)),
                      escape(e.problem or "in use"), _size(e.size), written)  # fmt: skip
    console.print(table)
    return 0


def _clear(console: Console, found: list[Entry], native: bool) -> int:
    freed = tuning_cache.remove(found)
    console.print(f"removed {len(found)} tuning cache entries ({_size(freed)})", highlight=False)
    if native:
        builds = _native_builds()
        size = sum(p.stat().st_size for p in builds)
        shutil.rmtree(tuning_cache.cache_dir() / "native", ignore_errors=True)
        console.print(f"removed {len(builds)} compiled C++ extension file(s) ({_size(size)}); the next use rebuilds",
                      highlight=False)  # fmt: skip
    return 0
