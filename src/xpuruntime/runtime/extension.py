"""xpuruntime's C++ extension: the dispatcher's hot path (`hot_path.cpp`: the plan-cache key and the whole
plan-cache hit) and the PyTorch front end's native aten routes (`pytorch/native_routes.cpp`), one library.

It is compiled on first use with PyTorch's C++ extension tools (a C++ compiler and ninja), once per source,
PyTorch and Python version, in a private temporary folder; the first build says so on stderr (it takes about
BUILD_TIME), and a failed one is a warning carrying the compiler's message. Where it cannot be built, or with
XPURUNTIME_NATIVE=0, the Python code serves instead; `status()` (shown by `xpuruntime info`) says which. The
dispatcher asks for it on its first plan-cache miss with a CUDA tensor (`load_soon`: a build then runs on a
background thread, and the Python key serves until it is done; both build the same tuples, so plans made
before stay valid).

A library is loaded only if it was published complete (dlopen of a truncated one kills Python with a bus
error): the built library gets a stamp (a trailer with its size and SHA-256), is written under a temporary
name in the cache folder, fsynced and renamed into place, never through a link inside the cache
(runtime/cache_folder.py). Before loading, the file is read whole (a regular file only) and its stamp
checked, and the checked bytes are what gets loaded, from a private in-memory file, so nothing another
process does to the cache folder meanwhile can change them. A library that fails the check is rebuilt, with
one warning.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np

from .. import arguments, arrays
from ..errors import FileError
from ..files import read_bytes
from .cache_folder import CacheFolder
from .tuning_cache import cache_dir, library_version

SOURCES = (
    Path(__file__).resolve().with_name("hot_path.cpp"),
    Path(__file__).resolve().parents[1] / "pytorch" / "native_routes.cpp",
)
ENV_SWITCH = "XPURUNTIME_NATIVE"
BUILD_TIME = "45-99 s"  # measured for the first build on the machines we know
FORMAT = 2  # of the published file (2: stamped); part of its name, so older files are simply not used
MAX_LIBRARY_BYTES = 1 << 30
FOLDER = "native"
_STAMP = struct.Struct("<16sQ32s")  # magic, size of the library, its SHA-256
_MAGIC = b"xpuruntime-stamp"
_MAX_FILE_BYTES = MAX_LIBRARY_BYTES + _STAMP.size
_EMPTY = "empty or missing"
_COMPILER_ERROR = re.compile(r"(^|[\s:])(fatal )?error:", re.IGNORECASE)  # gcc/clang/ld, not "RuntimeError:"


class NativeExtensionWarning(UserWarning):
    """The C++ extension failed to build, or a published copy was incomplete or corrupt and is rebuilt."""


class _State:
    module: ModuleType | None = None
    tried = False
    building = False
    build_started = 0.0
    why_not: str | None = None


_state = _State()
_lock = threading.Lock()


def load() -> ModuleType | None:
    """The extension's Python module, built and loaded on first call (its aten ops are then in
    `torch.ops.xpuruntime_native`); None where it cannot be (see `status`)."""
    if not _state.tried:
        with _lock:
            if not _state.tried:
                module = _build_and_load()
                if module is not None:
                    _use_c_hot_path(module)  # before anyone can see the module: its key needs this first
                _state.module = module
                _state.tried = True
    return _state.module


def _use_c_hot_path(module: ModuleType) -> None:
    module.use_python(np.ndarray, arrays.signature, arguments.attr_types, arguments.python_plan_key)
    arguments.plan_key = module.plan_key
    for hook in _on_load:
        hook(module)


_on_load: list[Callable[[ModuleType], None]] = []


def on_load(hook: Callable[[ModuleType], None]) -> None:
    """Call hook(module) when the extension loads, before anyone else can see it (the dispatcher's C hit
    path), or at once if it is loaded already."""
    with _lock:
        _on_load.append(hook)
        if _state.module is not None:
            hook(_state.module)


def load_soon() -> None:
    """Load the extension now if it is built, else build it on a background thread (once)."""
    if _state.tried or _state.building:
        return
    if _disabled() or _published():
        load()
        return
    _state.building = True
    threading.Thread(target=load, name="xpuruntime-extension-build", daemon=True).start()


def status() -> str:
    """One line for `xpuruntime info`: disabled, built and loaded, building, failed (and why), built (not
    loaded yet), or not built yet."""
    if _state.module is not None:
        return "built and loaded"
    if _disabled():
        return f"disabled by {ENV_SWITCH}=0"
    if _state.building and not _state.tried:
        return f"building (for {time.time() - _state.build_started:.0f} s; about {BUILD_TIME} in all)"
    if _state.why_not is not None:
        return _state.why_not
    try:
        library = _library()
    except Exception as exc:  # no PyTorch, no usable cache folder
        return f"unavailable: {_first_line(exc)}"
    if _published():
        problem = _stamp_problem(library)
        if problem is None:
            return f"built ({library}); loaded on first use"
        return f"the published library {library} is not a complete build ({problem}); rebuilt on first use"
    failure = _last_failure()
    if failure:
        return f"failed to build last time ({failure}); tried again on first use"
    return f"not built yet: built on first use (about {BUILD_TIME}, once) into {library.parent}"


def _disabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1") == "0"


def _library() -> Path:
    """Where the published library of these sources, this PyTorch and this Python lives."""
    torch_version = library_version("torch")
    if torch_version is None:
        raise ImportError("the C++ extension needs PyTorch, which is not installed")
    digest = hashlib.sha256(f"{FORMAT} {torch_version} {sys.version}".encode())
    for source in SOURCES:
        digest.update(read_bytes(source, "C++ source", limit=MAX_LIBRARY_BYTES))
    return cache_dir() / FOLDER / f"xpuruntime_native_{digest.hexdigest()[:16]}.so"


def _published() -> bool:
    try:
        return _library().is_file()
    except Exception:
        return False


class BuildFailed(RuntimeError):
    """The compiler failed; `reason` is its key line, `message` what it said."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"the build failed: {reason}")
        self.reason, self.message = reason, message


def _build_and_load() -> ModuleType | None:
    if _disabled():
        _state.why_not = f"disabled by {ENV_SWITCH}=0"
        return None
    try:
        library = _library()
        folder = CacheFolder(library.parent.parent)
        parts = (FOLDER, library.name)
        checked = _checked_library(folder, parts)
        if checked is None:
            checked = _compile(folder, parts, library)
        return _load_bytes(library, checked)
    except BuildFailed as exc:
        _state.why_not = f"failed: {exc.reason}"
        warnings.warn(
            "xpuruntime: the C++ extension failed to build, so the Python code serves instead (a slower dispatch "
            f"hot path; no native PyTorch routes). The compiler said:\n{exc.message}",
            NativeExtensionWarning,
            stacklevel=3,
        )
    except Exception as exc:  # no compiler, no ninja, no PyTorch, an unwritable cache: the Python code serves
        _state.why_not = f"failed: {_first_line(exc)}"
        warnings.warn(
            f"xpuruntime: the C++ extension is not available ({exc}); the Python code serves instead",
            NativeExtensionWarning,
            stacklevel=3,
        )
    return None


def _checked_library(folder: CacheFolder, parts: tuple[str, str]) -> bytes | None:
    """The published library's bytes if its stamp checks out; None when it must be built. A file that is
    there but incomplete, corrupt, a link or not a regular file is removed (a link itself, never what it
    points to), with one warning."""
    try:
        library, problem = _unstamped(folder.read(parts, "C++ extension library", limit=_MAX_FILE_BYTES) or b"")
    except FileError as exc:
        library, problem = b"", str(exc)
    if problem is None:
        return library
    if problem != _EMPTY:
        warnings.warn(
            f"xpuruntime: the C++ extension library {folder.path(parts)} is not a complete build ({problem}); "
            "rebuilding it",
            NativeExtensionWarning,
            stacklevel=4,
        )
        *folders, name = parts
        with contextlib.suppress(OSError), folder.folder(folders) as fd:
            os.unlink(name, dir_fd=fd)
    return None


def _stamp_problem(library: Path) -> str | None:
    """Why the published file at `library` would not be loaded (None: it would)."""
    try:
        data = CacheFolder(library.parent.parent).read((FOLDER, library.name), "library", limit=_MAX_FILE_BYTES)
    except FileError as exc:
        return str(exc)
    return _unstamped(data or b"")[1]


def _stamped(library: bytes) -> bytes:
    """The library followed by its stamp: size and SHA-256."""
    return library + _STAMP.pack(_MAGIC, len(library), hashlib.sha256(library).digest())


def _unstamped(data: bytes) -> tuple[bytes, str | None]:
    """(library, None) when the stamp at the end of `data` matches the bytes before it, else (b"", why not)."""
    if not data:
        return b"", _EMPTY
    if len(data) < _STAMP.size:
        return b"", f"{len(data)} bytes, too short to hold a stamp"
    magic, size, digest = _STAMP.unpack(data[-_STAMP.size :])
    library = data[: -_STAMP.size]
    if magic != _MAGIC:
        return b"", "no stamp (truncated, or not written by xpuruntime)"
    if size != len(library):
        return b"", f"{len(library)} bytes where the stamp says {size}"
    if hashlib.sha256(library).digest() != digest:
        return b"", "its SHA-256 differs from the stamp's"
    return library, None


# run in a child process: a build must not touch this process's warning filters (a background build
# would silence every thread's warnings for its duration)
_BUILD = """
import sys, warnings
from torch.utils import cpp_extension
name, folder, *sources = sys.argv[1:]
warnings.simplefilter("ignore")  # e.g. "no CUDA runtime found" on CPU builds
cpp_extension.load(name=name, sources=sources, build_directory=folder, extra_cflags=["-O2"], is_python_module=True)
"""


def _compile(folder: CacheFolder, parts: tuple[str, str], library: Path) -> bytes:
    """Compile in a private temporary folder of this build's own (PyTorch's build lock waits forever on a
    lock file that a killed build left behind), then publish the stamped library (see the module docstring)."""
    _state.build_started = time.time()
    print(
        f"xpuruntime: building the C++ extension (the dispatcher's hot path and the PyTorch routes), once for "
        f"this PyTorch and Python; this takes about {BUILD_TIME} ({ENV_SWITCH}=0 skips it) ...",
        file=sys.stderr,
        flush=True,
    )
    build = Path(tempfile.mkdtemp(prefix=f"xpuruntime-build-{library.stem}-"))
    try:
        command = [sys.executable, "-c", _BUILD, library.stem, str(build), *map(str, SOURCES)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            reason, message = _compiler_message(f"{done.stdout}\n{done.stderr}")
            _record_failure(folder, parts, reason)
            raise BuildFailed(reason, message)
        built = read_bytes(build / library.name, "built C++ extension", limit=MAX_LIBRARY_BYTES)
    finally:
        shutil.rmtree(build, ignore_errors=True)
    folder.write(parts, _stamped(built))
    _clear_failure(folder, parts)
    print(f"xpuruntime: C++ extension built in {time.time() - _state.build_started:.0f} s", file=sys.stderr)
    return built


def _load_bytes(library: Path, data: bytes) -> ModuleType:
    """Import the extension module from exactly `data` (checked before), through a private in-memory file
    where the OS has them; `module.__file__` names the published library."""
    import torch  # noqa: F401  (the library links against PyTorch's, which importing torch loads)

    try:
        fd = os.memfd_create(library.stem, os.MFD_CLOEXEC)
    except (AttributeError, OSError):  # not Linux: the published file itself, checked just before
        return _import(library.stem, str(library))
    try:
        with open(fd, "wb", closefd=False) as file:
            file.write(data)
        module = _import(library.stem, f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)  # the loader keeps its own mapping
    module.__file__ = str(library)
    return module


def _import(name: str, path: str) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    if spec is None:
        raise ImportError(f"not a Python extension: {path}")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _compiler_message(output: str, lines: int = 30) -> tuple[str, str]:
    """(the key line, the part worth showing) of a failed build's output: the compiler's 'error:' lines if
    any, else the last lines (a Python traceback from the build tools ends with its reason)."""
    text = [line for line in output.strip().splitlines() if line.strip()] or ["no output"]
    errors = list(dict.fromkeys(line.strip() for line in text if _COMPILER_ERROR.search(line)))
    shown = errors[:lines] if errors else text[-lines:]
    return (errors[0] if errors else text[-1].strip()), "\n".join(shown)


def _failure_parts(parts: tuple[str, str]) -> tuple[str, str]:
    return parts[0], f"{parts[1]}.failed.json"


def _record_failure(folder: CacheFolder, parts: tuple[str, str], reason: str) -> None:
    """Remember why the last build failed (for `status`, in a process that has not tried)."""
    record = json.dumps({"time": time.time(), "reason": reason[-2000:]})
    with contextlib.suppress(OSError):
        folder.write(_failure_parts(parts), record.encode())


def _clear_failure(folder: CacheFolder, parts: tuple[str, str]) -> None:
    *folders, name = _failure_parts(parts)
    with contextlib.suppress(OSError), folder.folder(folders) as fd:
        os.unlink(name, dir_fd=fd)


def _last_failure() -> str | None:
    try:
        library = _library()
        raw = CacheFolder(library.parent.parent).read(
            _failure_parts((FOLDER, library.name)), "extension build record", limit=1 << 16
        )
        return None if raw is None else str(json.loads(raw)["reason"])
    except Exception:  # an unreadable record says nothing
        return None


def _first_line(what: object) -> str:
    lines = str(what).strip().splitlines()
    return lines[0] if lines else type(what).__name__
