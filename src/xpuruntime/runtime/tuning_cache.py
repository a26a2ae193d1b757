"""On-disk tuning / JIT cache: remembers autotuning winners (tile sizes, warps, stages...) across processes.

Usage, from a kernel's tuner:

    from xpuruntime.runtime import tuning_cache
    k = tuning_cache.key("matmul", dtypes="bfloat16", layout="nn", shape=(m, n, k), arch=(9, 0),
                         source=matmul_kernel_source)
    config = tuning_cache.get(k)           # dict or None
    if config is None:
        config = autotune(...)
        tuning_cache.put(k, config)

The folder is `~/.cache/xpuruntime/tuning`, or `$XPURUNTIME_CACHE_DIR/tuning`. Each key is its own small
JSON file, written to a temporary file in the same folder and moved into place with `os.replace`, so a
reader sees either the old entry or the new one, never half a file; a writer killed mid-write leaves
only a stray temporary file that readers ignore. Two processes tuning the same key at once both write
a complete entry and the last rename wins, which is fine for a cache: no lock is needed. A file that
does not parse, or whose recorded key or format differs from the one asked for (stale), is ignored with
one warning per file and process, and the next `put` replaces it. A folder that cannot be written is
warned about once; the entries are then kept in memory only.

Files are read and written through `CacheFolder` (runtime/cache_folder.py): never through a link inside the
cache folder, never a file that is not regular (a FIFO or a device is "cannot be read", not a hang), never
more than MAX_ENTRY_BYTES of one entry; `clear()` deletes regular entry files only.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import inspect
import json
import math
import os
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import FileError
from .cache_folder import CacheFolder

ENV_CACHE_DIR = "XPURUNTIME_CACHE_DIR"
FORMAT = 1
MAX_ENTRY_BYTES = 1 << 20  # an entry is a few hundred bytes: anything this large is not one
LIBRARIES = ("xpuruntime", "torch", "triton", "nvmath-python")


class TuningCacheWarning(UserWarning):
    """A cache file was corrupt or stale and was ignored."""


def cache_dir() -> Path:
    """The root cache folder: $XPURUNTIME_CACHE_DIR, else ~/.cache/xpuruntime. FileError when it cannot be
    named (a '~user' that does not exist, no home folder)."""
    override = os.environ.get(ENV_CACHE_DIR)
    try:
        return Path(override).expanduser() if override else Path.home() / ".cache" / "xpuruntime"
    except RuntimeError:  # pathlib's "Could not determine home directory"
        if override:
            home = override.split("/", 1)[0]
            raise FileError(f"{ENV_CACHE_DIR}={override!r}: '{home}' names no user with a home folder here") from None
        raise FileError(f"no home folder for the cache (~/.cache/xpuruntime): set {ENV_CACHE_DIR}") from None


@functools.cache
def library_version(name: str) -> str | None:
    """An installed distribution's version, or None (cached: a process does not change its libraries)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def shape_bucket(shape: Iterable[int]) -> tuple[int, ...]:
    """Each dimension rounded up to a power of two, so nearby sizes share one tuning result."""
    return tuple(0 if n <= 0 else 1 << math.ceil(math.log2(n)) for n in map(int, shape))


def source_hash(source: str | Callable[..., Any] | Any) -> str:
    """A short SHA-256 of a kernel's source text (a string, a function, or a Triton JITFunction)."""
    if not isinstance(source, str):
        text = getattr(source, "src", None)  # triton.JITFunction keeps its source here
        source = text if isinstance(text, str) else inspect.getsource(getattr(source, "fn", source))
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def key(
    op: str,
    *,
    dtypes: str | Iterable[str],
    layout: str = "",
    shape: Iterable[int] = (),
    arch: tuple[int, int] | str | None = None,
    source: str | Callable[..., Any] | Any = "",
    libraries: Iterable[str] = LIBRARIES,
    bucket: bool = True,
    **extra: Any,
) -> str:
    """The canonical cache key (a JSON string) for one tuning problem.

    `shape` is bucketed to powers of two unless `bucket=False`; `arch` is a compute capability like
    (9, 0) or "sm90"; `source` is the kernel (or its source text), hashed; the installed versions of
    `libraries` are included so that an upgrade never reuses an old winner. `extra` adds any other
    JSON-able field (math mode, epilogue...).
    """
    parts = {
        "op": op,
        "dtypes": [dtypes] if isinstance(dtypes, str) else list(dtypes),
        "layout": layout,
        "shape": list(shape_bucket(shape) if bucket else map(int, shape)),
        "arch": f"sm{arch[0]}{arch[1]}" if isinstance(arch, tuple) else arch,
        "source": source_hash(source) if source else "",
        "versions": {name: library_version(name) for name in libraries},
        **extra,
    }
    return canonical(parts)


def canonical(parts: Mapping[str, Any] | str) -> str:
    """A key as sorted, compact JSON (a string key is returned unchanged)."""
    if isinstance(parts, str):
        return parts
    return json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)


class TuningCache:
    """Per-key JSON files under one folder, with an in-memory layer; see the module docstring."""

    def __init__(self, directory: str | os.PathLike | None = None, *, memory_only: bool = False) -> None:
        if directory is None and not memory_only:  # the default folder sits inside the cache root
            root = cache_dir()
            self.directory, self._files, self._prefix = root / "tuning", CacheFolder(root), ("tuning",)
        else:
            self.directory = Path(directory) if directory is not None else None
            self._files = None if memory_only else CacheFolder(self.directory)
            self._prefix = ()
        self._memory: dict[str, dict] = {}
        self._lock = threading.Lock()

    def path(self, key: str | Mapping[str, Any]) -> Path:
        """The file holding `key`'s entry: <dir>/<op>/<sha256 of the key>.json."""
        if self.directory is None:
            raise FileError("this tuning cache keeps its entries in memory only: no file holds them")
        return self.directory.joinpath(*self._parts(canonical(key))[len(self._prefix) :])

    def _parts(self, text: str) -> tuple[str, ...]:
        op = _safe_name(json.loads(text).get("op", "misc")) if text.startswith("{") else "misc"
        return (*self._prefix, op, f"{hashlib.sha256(text.encode()).hexdigest()[:32]}.json")

    def get(self, key: str | Mapping[str, Any]) -> dict | None:
        """The stored value for `key`, or None when absent, corrupt or stale."""
        text = canonical(key)
        with self._lock:
            if text in self._memory:
                return dict(self._memory[text])
        value = self._read(text)
        if value is not None:
            with self._lock:
                self._memory[text] = value
            return dict(value)
        return None

    def put(self, key: str | Mapping[str, Any], value: Mapping[str, Any]) -> None:
        """Store `value` (a JSON-able mapping) for `key`, atomically."""
        text = canonical(key)
        try:
            body = json.dumps({"format": FORMAT, "key": text, "value": dict(value)}, sort_keys=True)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"tuning_cache.put: value must be a JSON-serializable mapping: {exc}") from None
        with self._lock:
            self._memory[text] = json.loads(body)["value"]
        if self._files is None:
            return
        try:
            self._files.write(self._parts(text), body.encode())
        except OSError as exc:  # read-only or full disk, a link inside the cache: tuning works on, from memory
            what = f"tuning cache folder {self.directory} cannot be written ({exc}); keeping results in memory only"
            _warn_once(str(self.directory), what, stacklevel=3)

    def get_or_tune(self, key: str | Mapping[str, Any], tune: Callable[[], Mapping[str, Any]]) -> dict:
        """The cached value, or `tune()`'s result stored and returned."""
        value = self.get(key)
        if value is None:
            value = dict(tune())
            self.put(key, value)
        return value

    def clear(self, memory_only: bool = False) -> None:
        """Forget the in-memory layer, and unless `memory_only` also delete every entry on disk: the regular
        files of the op folders, never anything a link inside the cache points to."""
        with self._lock:
            self._memory.clear()
        if not memory_only and self._files is not None:
            self._files.remove_files(self._prefix, (".json",), depth=1)

    def _read(self, text: str) -> dict | None:
        if self._files is None:
            return None
        parts = self._parts(text)
        path = self._files.path(parts)
        try:
            raw = self._files.read(parts, "tuning cache file", limit=MAX_ENTRY_BYTES)
        except OSError as exc:  # unreadable, not a regular file, a link, too large
            self._warn(path, f"cannot be read ({exc})")
            return None
        if raw is None:
            return None
        try:
            entry = json.loads(raw.decode())
            if not isinstance(entry, dict) or not isinstance(entry.get("value"), dict):
                raise ValueError("no value object")
        except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than the parser goes
            self._warn(path, f"is corrupt ({type(exc).__name__}: {str(exc)[:200]})")
            return None
        if entry.get("format") != FORMAT or entry.get("key") != text:
            self._warn(path, "is stale (written for another format or key)")
            return None
        return entry["value"]

    def _entry(self, below: tuple[str, ...], info: os.stat_result) -> Entry:
        """The entry file at `below` (op folder, file name) as `xpuruntime cache list` shows it."""
        path = self.directory.joinpath(*below)
        try:
            raw = self._files.read((*self._prefix, *below), "tuning cache file", limit=MAX_ENTRY_BYTES)
            entry = json.loads((raw or b"").decode())
            key = json.loads(entry["key"])
            value = entry["value"]
            if not isinstance(key, dict) or not isinstance(value, dict):
                raise ValueError("no key or value object")
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            return Entry(path, below[0], None, None, info.st_size, info.st_mtime, f"corrupt ({exc})")
        problem = None
        if entry.get("format") != FORMAT:
            problem = f"format {entry.get('format')}, not {FORMAT}"
        else:
            changed = [f"{name} {was} -> {library_version(name)}" for name, was in (key.get("versions") or {}).items()
                       if library_version(name) != was]  # fmt: skip
            problem = f"stale: {', '.join(changed)}" if changed else None
        return Entry(path, str(key.get("op", below[0])), key, value, info.st_size, info.st_mtime, problem)

    def _warn(self, path: Path, what: str) -> None:
        _warn_once(str(path), f"tuning cache file {path} {what}; ignoring it", stacklevel=5)


_warned: set[str] = set()  # per process, not per TuningCache: default_cache() makes new ones
_warned_lock = threading.Lock()


def _warn_once(about: str, message: str, stacklevel: int) -> None:
    """Warn about a file or folder once per process (`stacklevel` counts from here to the API's caller)."""
    with _warned_lock:
        if about in _warned:
            return
        _warned.add(about)
    warnings.warn(message, TuningCacheWarning, stacklevel=stacklevel)


def _safe_name(op: Any) -> str:
    text = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(op))
    return text.strip(".") or "misc"


_default: TuningCache | None = None
_default_lock = threading.Lock()


def default_cache() -> TuningCache:
    """The process-wide cache; follows $XPURUNTIME_CACHE_DIR if it changes."""
    global _default
    try:
        directory = cache_dir() / "tuning"
    except FileError as exc:  # no usable folder: tuning works on, from memory
        _warn_once("cache_dir", f"{exc}; tuning results are kept in memory only", stacklevel=4)
        directory = None
    with _default_lock:
        if _default is None or _default.directory != directory:
            _default = TuningCache() if directory is not None else TuningCache(memory_only=True)
        return _default


def get(key: str | Mapping[str, Any]) -> dict | None:
    """The stored tuning result for `key` (from `key(...)`), or None."""
    return default_cache().get(key)


def put(key: str | Mapping[str, Any], value: Mapping[str, Any]) -> None:
    """Store a tuning result for `key` atomically."""
    default_cache().put(key, value)


def get_or_tune(key: str | Mapping[str, Any], tune: Callable[[], Mapping[str, Any]]) -> dict:
    """The cached value for `key`, or `tune()`'s result, stored."""
    return default_cache().get_or_tune(key, tune)


# -- what is cached (for `xpuruntime cache`) -------------------------------------------------------------------
@dataclass(frozen=True)
class Entry:
    """One file of the cache as `xpuruntime cache list` shows it: what was tuned (`kind`: the op or the tuned
    kernel), its key and value, and why it would be ignored (`problem`: corrupt, another format, or written
    under other versions of the libraries the timing depends on), or None when it is in use."""

    path: Path
    kind: str
    key: dict | None
    value: dict | None
    size: int
    modified: float
    problem: str | None


def entries(directory: str | os.PathLike | None = None) -> list[Entry]:
    """Every entry file under the tuning folder (default: the process's), sorted by kind then path; read
    through the cache folder's rules (no link followed, regular files only, at most MAX_ENTRY_BYTES each)."""
    cache = TuningCache(directory) if directory is not None else default_cache()
    if cache._files is None:
        return []
    found = [
        cache._entry(below, info) for below, info in cache._files.files(cache._prefix, (".json",)) if len(below) == 2
    ]
    return sorted(found, key=lambda e: (e.kind, str(e.path)))


def remove(chosen: Iterable[Entry], directory: str | os.PathLike | None = None) -> int:
    """Delete these entries' files (under `directory`, default the process's tuning folder), never through a
    link; returns the bytes freed. Files already gone are skipped."""
    cache = TuningCache(directory) if directory is not None else default_cache()
    freed = 0
    for entry in chosen:
        if cache._files is not None and cache.directory is not None:
            below = entry.path.relative_to(cache.directory).parts
            if cache._files.remove((*cache._prefix, *below)):
                freed += entry.size
    with _default_lock:
        if _default is not None:
            _default.clear(memory_only=True)
    return freed
