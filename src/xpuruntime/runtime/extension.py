"""xpuruntime's C++ extension: the dispatcher's hot path (`hot_path.cpp`: the plan-cache key and the whole
plan-cache hit) and the PyTorch front end's native aten routes (`pytorch/native_routes.cpp`), one library.

It is compiled on first use with PyTorch's C++ extension tools (a C++ compiler and ninja) into the cache
folder, once per source, PyTorch and Python version. Where it cannot be built, or with XPURUNTIME_NATIVE=0,
the Python code serves instead (`status()` says why). The dispatcher asks for it on its first plan-cache
miss with a CUDA tensor (`load_soon`: a build then runs on a background thread, and the Python key serves
until it is done; both build the same tuples, so plans made before stay valid).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np

from .. import arguments, arrays
from .tuning_cache import cache_dir

SOURCES = (
    Path(__file__).resolve().with_name("hot_path.cpp"),
    Path(__file__).resolve().parents[1] / "pytorch" / "native_routes.cpp",
)
ENV_SWITCH = "XPURUNTIME_NATIVE"
STALE_BUILD_S = 3600.0  # a build folder older than this was left by a killed process

log = logging.getLogger("xpuruntime")


class _State:
    module: ModuleType | None = None
    tried = False
    building = False
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
    if _library().exists() or os.environ.get(ENV_SWITCH, "1") == "0":
        load()
        return
    _state.building = True
    threading.Thread(target=load, name="xpuruntime-extension-build", daemon=True).start()


def status() -> str:
    if _state.module is not None:
        return "built and loaded"
    return _state.why_not or "not built yet"


def _library() -> Path:
    import torch

    digest = hashlib.sha256(f"{torch.__version__} {sys.version}".encode())
    for source in SOURCES:
        digest.update(source.read_bytes())
    return cache_dir() / "native" / f"xpuruntime_native_{digest.hexdigest()[:16]}.so"


def _build_and_load() -> ModuleType | None:
    if os.environ.get(ENV_SWITCH, "1") == "0":
        _state.why_not = f"disabled by {ENV_SWITCH}=0"
        return None
    try:
        library = _library()
        return _import(library) if library.exists() else _compile(library)
    except Exception as exc:  # no compiler, no ninja, unwritable cache: the Python code serves
        _state.why_not = f"could not build the C++ extension ({type(exc).__name__}: {str(exc).splitlines()[0]})"
        log.info("xpuruntime: %s; the Python code serves instead", _state.why_not)
        return None


# run in a child process: a build must not touch this process's warning filters (a background build
# would silence every thread's warnings for its duration)
_BUILD = """
import sys, warnings
from torch.utils import cpp_extension
name, folder, *sources = sys.argv[1:]
warnings.simplefilter("ignore")  # e.g. "no CUDA runtime found" on CPU builds
cpp_extension.load(name=name, sources=sources, build_directory=folder, extra_cflags=["-O2"], is_python_module=True)
"""


def _compile(library: Path) -> ModuleType:
    """Compile in a folder of this build's own (PyTorch's build lock waits forever on a lock file that a
    killed build left behind), publish the library with an atomic rename, load it."""
    library.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_builds(library.parent)
    build = Path(tempfile.mkdtemp(prefix=f"build-{library.stem}-", dir=library.parent))
    try:
        command = [sys.executable, "-c", _BUILD, library.stem, str(build), *map(str, SOURCES)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            lines = (done.stderr or done.stdout).strip().splitlines() or ["no output"]
            raise RuntimeError(f"the compiler failed: {lines[-1]}")
        os.replace(build / library.name, library)
    finally:
        shutil.rmtree(build, ignore_errors=True)
    return _import(library)


def _import(library: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(library.stem, library)
    if spec is None or spec.loader is None:
        raise ImportError(f"not a Python extension: {library}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _remove_stale_builds(folder: Path) -> None:
    for build in folder.glob("build-*"):
        try:
            if time.time() - build.stat().st_mtime > STALE_BUILD_S:
                shutil.rmtree(build, ignore_errors=True)
        except OSError:
            pass
