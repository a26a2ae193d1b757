"""CUDA graphs: `capture_graph()` for a block, `CUDAGraphWrapper` for a function (capture, then replay).

Plans, compiled kernels and library handles (nvmath matmul plans, Triton binaries) are made during the
warm-up on a side stream, so nothing is planned, compiled or allocated outside the graph's pool while
capturing. Workspaces lent while capturing are fresh buffers of the graph's own pool
(`WorkspaceManager.per_call`): a slice of the dispatcher's cached buffer would be freed when a later call
grows that buffer, and each replay would write into memory the graph no longer owns. The wrapper keeps the
captured inputs and outputs alive for as long as the graph can replay.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..abi import SyncPolicy
from ..errors import ArgumentError, XpuRuntimeError, argument_error
from ..policy import current_policy
from ..profiling import record_range
from . import tuner
from .router import get_dispatcher


class GraphError(XpuRuntimeError, RuntimeError):
    """A CUDA graph was used wrongly (replayed before capture, captured under a synchronizing policy)."""


def _check_capturable() -> None:
    if not torch.cuda.is_available():
        raise GraphError("CUDA graphs need a CUDA device; none is available")
    if current_policy().sync is SyncPolicy.FULL_SYNC:
        raise GraphError("cannot capture a CUDA graph under a policy with sync='full_sync' (it synchronizes)")


@contextlib.contextmanager
def capture_graph(pool: Any = None, stream: torch.cuda.Stream | None = None) -> Iterator[torch.cuda.CUDAGraph]:
    """Capture the block into a CUDA graph (`graph.replay()` later); warm the block up before."""
    _check_capturable()
    graph = torch.cuda.CUDAGraph()
    with (
        record_range("xpuruntime.capture_graph"),
        _nvtx("xpuruntime.capture_graph"),
        torch.cuda.graph(graph, pool=pool, stream=stream),
        get_dispatcher().workspaces.per_call(),
    ):
        yield graph


class CUDAGraphWrapper:
    """capture(fn, *args, **kwargs) once, then replay() re-runs the captured kernels on the same buffers."""

    def __init__(self, warmup_iters: int = 3, pool: Any = None) -> None:
        if type(warmup_iters) is not int or warmup_iters < 0:  # bool is an int to Python, never a count here
            raise argument_error(
                ArgumentError, "CUDAGraphWrapper", "warmup_iters", "an int >= 0 (warm-up calls before capture)",
                repr(warmup_iters),
            )  # fmt: skip
        self.warmup_iters = warmup_iters
        self.pool = pool
        self.graph: torch.cuda.CUDAGraph | None = None
        self.outputs: Any = None
        self._keep_alive: tuple = ()

    @property
    def captured(self) -> bool:
        """Whether a call has been captured (replay() may run)."""
        return self.graph is not None

    def capture(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Warm up on a side stream (plans and handles made there; autotune charges no routing cost, see
        `tuner.for_graph`), then capture one call; returns its outputs."""
        _check_capturable()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), record_range("xpuruntime.graph_warmup"), tuner.for_graph():
            for _ in range(self.warmup_iters):
                fn(*args, **kwargs)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with (
            record_range("xpuruntime.graph_capture"),
            _nvtx("xpuruntime.graph_capture"),
            torch.cuda.graph(graph, pool=self.pool),
            get_dispatcher().workspaces.per_call(),
        ):
            self.outputs = fn(*args, **kwargs)
        self.graph = graph
        self._keep_alive = (args, kwargs)
        return self.outputs

    def replay(self) -> Any:
        """Re-run the captured kernels; returns the (static) outputs of the captured call."""
        if self.graph is None:
            raise GraphError("CUDAGraphWrapper.replay: nothing captured yet; call capture(fn, *args) first")
        self.graph.replay()
        return self.outputs


@contextlib.contextmanager
def _nvtx(name: str) -> Iterator[None]:
    """An NVTX range for Nsight (no-op without CUDA)."""
    if not torch.cuda.is_available():
        yield
        return
    torch.cuda.nvtx.range_push(name)
    try:
        yield
    finally:
        torch.cuda.nvtx.range_pop()
