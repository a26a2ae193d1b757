"""How many bytes fit on a device, and the check an allocation passes before it is asked for.

The dispatcher checks a call's output and workspace when it makes the call's plan (so a plan-cache hit pays
nothing), `xpuruntime run` checks the inputs it makes or loads: an array that cannot fit raises
`OutOfMemoryError` naming what it is for, its shape and its bytes, instead of NumPy's or PyTorch's error
from deep inside a kernel, or the out-of-memory killer.

The bound is the device's whole memory, not what is free right now (that changes between calls, and a plan
is made once): on the CPU the physical memory, lowered by the process's address-space and data limits
(`ulimit -v`, `resource.setrlimit`) and by its cgroup's memory limit (a container); on a GPU its total memory.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Sequence

from ..errors import OutOfMemoryError
from .device import devices

_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def nbytes(shape: Sequence[int], itemsize: int) -> int:
    """Bytes of a dense array (exact: Python integers do not overflow)."""
    return math.prod(int(n) for n in shape) * int(itemsize)


def capacity(device: str) -> int | None:
    """The most bytes one array on `device` can take; None when unknown (no check is made then)."""
    if device.split(":")[0] == "cpu":
        known = [b for b in (_physical_memory(), _cgroup_limit(), _process_limit()) if b is not None]
        return min(known, default=None)
    name = device if ":" in device else f"{device}:0"
    return next((d.total_memory_bytes for d in devices() if d.name == name), None)


def check_fits(what: str, shape: Sequence[int], dtype: str, itemsize: int, device: str) -> None:
    """Raise OutOfMemoryError when an array of `shape` and `dtype` cannot fit on `device`; `what` names it
    ("matmul: output", "run: input 'x'")."""
    check_bytes(f"{what} of shape {tuple(shape)} ({dtype})", nbytes(shape, itemsize), device)


def check_bytes(what: str, size: int, device: str) -> None:
    """Raise OutOfMemoryError when `size` bytes cannot fit on `device`; `what` names them."""
    limit = capacity(device)
    if limit is not None and size > limit:
        raise OutOfMemoryError(
            f"{what} needs {describe_bytes(size)} ({size} bytes), more than the {describe_bytes(limit)} {device} has"
        )


def describe_bytes(size: int) -> str:
    """'335.3 GiB', '12.0 KiB', '17 B'."""
    for unit, scale in (("EiB", 2**60), ("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


@functools.cache
def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


@functools.cache
def _cgroup_limit() -> int | None:
    from ..files import read_bytes

    for path in _CGROUP_LIMITS:
        try:
            text = read_bytes(path, "cgroup memory limit", limit=64).decode().strip()
        except (OSError, UnicodeDecodeError):
            continue
        if text.isdigit() and int(text) < 2**60:  # "max", or v1's "no limit" (a huge number)
            return int(text)
    return None


def _process_limit() -> int | None:
    """The lower of the address-space and data limits (read per call: a process may lower them)."""
    try:
        import resource
    except ImportError:  # not on Unix
        return None
    limits = []
    for which in (resource.RLIMIT_AS, resource.RLIMIT_DATA):
        soft, _ = resource.getrlimit(which)
        if soft != resource.RLIM_INFINITY:
            limits.append(soft)
    return min(limits, default=None)
