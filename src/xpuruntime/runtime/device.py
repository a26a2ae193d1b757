"""Device manager: the CPU always, CUDA devices when a driver and cuda-python or PyTorch are present.

Probing is lazy (first call) and never raises: a machine without a GPU, a driver or either library
simply has the CPU, and `probe_report()` says why no CUDA device was found.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass

from ..files import read_bytes


@dataclass(frozen=True)
class DeviceInfo:
    name: str  # "cpu", "cuda:0", ...
    kind: str  # "cpu" or "cuda"
    description: str  # product name
    compute_capability: tuple[int, int] | None = None
    multiprocessors: int | None = None  # SMs on a GPU, logical cores on the CPU
    total_memory_bytes: int | None = None
    source: str = ""  # which library reported it


def _cpu() -> DeviceInfo:
    description = platform.processor() or platform.machine()
    try:
        text = read_bytes("/proc/cpuinfo", "CPU description", limit=16 << 20).decode(errors="replace")
        for line in text.splitlines():
            if line.startswith("model name"):
                description = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = None
    return DeviceInfo("cpu", "cpu", description, None, os.cpu_count(), memory, "os")


def _cuda_via_cuda_python() -> list[DeviceInfo]:
    try:
        from cuda.bindings import runtime
    except ImportError:
        from cuda import cudart as runtime  # cuda-python < 12.6
    err, count = runtime.cudaGetDeviceCount()
    if int(err) != 0:
        raise RuntimeError(f"cudaGetDeviceCount failed: {err}")
    found = []
    for i in range(count):
        err, prop = runtime.cudaGetDeviceProperties(i)
        if int(err) != 0:
            raise RuntimeError(f"cudaGetDeviceProperties({i}) failed: {err}")
        name = prop.name.decode(errors="replace").rstrip("\x00") if isinstance(prop.name, bytes) else str(prop.name)
        found.append(
            DeviceInfo(f"cuda:{i}", "cuda", name, (prop.major, prop.minor), prop.multiProcessorCount,
                       prop.totalGlobalMem, "cuda-python")
        )  # fmt: skip
    return found


def _cuda_via_torch() -> list[DeviceInfo]:
    import torch

    if not torch.cuda.is_available():
        return []
    found = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        found.append(
            DeviceInfo(f"cuda:{i}", "cuda", p.name, (p.major, p.minor), p.multi_processor_count, p.total_memory,
                       "torch")
        )  # fmt: skip
    return found


@functools.lru_cache(maxsize=1)
def _probe() -> tuple[tuple[DeviceInfo, ...], tuple[str, ...]]:
    notes = []
    for source, probe in (("cuda-python", _cuda_via_cuda_python), ("torch", _cuda_via_torch)):
        try:
            found = probe()
        except ImportError as exc:
            notes.append(f"{source}: not installed ({exc.msg if hasattr(exc, 'msg') else exc})")
            continue
        except Exception as exc:
            notes.append(f"{source}: {exc}")
            continue
        if found:
            return (_cpu(), *found), tuple(notes)
        notes.append(f"{source}: no CUDA device visible")
    return (_cpu(),), tuple(notes)


def devices() -> list[DeviceInfo]:
    """Every device this process can use; the CPU is always first."""
    return list(_probe()[0])


def probe_report() -> list[str]:
    """Why CUDA devices were or were not found, one line per library tried."""
    return list(_probe()[1])


@functools.lru_cache(maxsize=64)
def compute_capability(device: str) -> tuple[int, int] | None:
    """(major, minor) for a CUDA device name like 'cuda:0'; None for the CPU and unknown devices."""
    if not device.startswith("cuda"):
        return None
    name = device if ":" in device else "cuda:0"
    for info in devices():
        if info.name == name:
            return info.compute_capability
    return None
