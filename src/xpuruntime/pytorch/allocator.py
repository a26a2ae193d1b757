"""Route PyTorch's CUDA allocations into a `torch.cuda.MemPool` that xpuruntime owns.

Why a MemPool and not `CUDAPluggableAllocator`: a pluggable allocator must be installed before the
first CUDA allocation and can never be swapped back, while a pool can be switched on and off at any
time, keeps the caching allocator's stream semantics (blocks are reused only after the streams that
used them are done), works under CUDA-graph capture, and reports its segments. Its blocks are rounded
to 512 bytes, above the runtime's 256-byte alignment. The pool takes the allocations of the thread
that called `set_allocator` (autograd's backward threads keep PyTorch's default pool).
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import XpuRuntimeError


class _State:
    def __init__(self) -> None:
        self.pool: Any = None
        self.context: Any = None
        self.baseline: dict[str, int] = {}
        self.retired: list = []  # pools whose tensors may still be alive


_state = _State()
_COUNTERS = ("allocation.all.allocated", "allocation.all.freed", "allocated_bytes.all.allocated")


def set_allocator(enabled: bool = True) -> None:
    """Send this thread's CUDA allocations to xpuruntime's pool (enabled=False: same as reset_allocator)."""
    if not enabled:
        reset_allocator()
        return
    if _state.pool is not None:
        return
    if not torch.cuda.is_available():
        raise XpuRuntimeError("set_allocator: no CUDA device; the xpuruntime pool holds CUDA memory only")
    pool = torch.cuda.MemPool()
    context = torch.cuda.use_mem_pool(pool)
    context.__enter__()
    stats = torch.cuda.memory_stats()
    _state.pool, _state.context = pool, context
    _state.baseline = {name: int(stats.get(name, 0)) for name in _COUNTERS}


def reset_allocator() -> None:
    """Back to PyTorch's default pool; tensors already allocated in ours stay valid."""
    if _state.context is None:
        return
    _state.context.__exit__(None, None, None)
    _state.retired.append(_state.pool)
    _state.pool = _state.context = None


def allocator_stats() -> dict[str, Any]:
    """The pool's segments, reserved and allocated bytes, and the allocation traffic since enabling."""
    if _state.pool is None:
        return {"enabled": False}
    segments = _state.pool.snapshot()
    stats = torch.cuda.memory_stats()
    traffic = {name: int(stats.get(name, 0)) - base for name, base in _state.baseline.items()}
    return {
        "enabled": True,
        "segments": len(segments),
        "reserved_bytes": sum(int(s["total_size"]) for s in segments),
        "allocated_bytes": sum(int(s["allocated_size"]) for s in segments),
        "active_blocks": sum(1 for s in segments for b in s["blocks"] if b["state"] == "active_allocated"),
        "allocations_since_enabled": traffic["allocation.all.allocated"],
        "frees_since_enabled": traffic["allocation.all.freed"],
        "bytes_allocated_since_enabled": traffic["allocated_bytes.all.allocated"],
    }
