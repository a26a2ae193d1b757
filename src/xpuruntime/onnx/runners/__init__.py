"""Runners execute a session's optimized graph on one kind of device (onnxruntime's execution providers):
`CpuRunner` with NumPy arrays, `GpuRunner` with PyTorch tensors and CUDA graphs. The session picks one for
its device; each keeps its own bounded plan cache, one plan per input signature."""

from __future__ import annotations

from typing import Any

from ...dispatch import Dispatcher
from ...graph.ir import Graph
from ...policy import KernelPolicy
from ..options import SessionOptions
from .base import GraphVariant, Runner
from .cpu import CpuRunner


def make_runner(
    device: str, dispatcher: Dispatcher, policy: KernelPolicy | None, options: SessionOptions, graph: Graph
) -> Runner:
    """The runner for `device` ('cpu', 'cuda[:N]'); the GPU one imports PyTorch only when asked for."""
    if device == "cpu":
        return CpuRunner(dispatcher, policy, options)
    from .gpu import GpuRunner

    return GpuRunner(dispatcher, policy, options, device=device, graph=graph)


def gpu_runner_factory(torch_device: str) -> Any:
    """A runner factory for `InferenceSession(runner=...)`: the GPU runner on any PyTorch device, e.g. 'cpu'
    (tests check the GPU path's PyTorch functions this way, without a GPU)."""

    def make(dispatcher: Dispatcher, policy: KernelPolicy | None, options: SessionOptions, graph: Graph) -> Runner:
        from .gpu import GpuRunner

        return GpuRunner(dispatcher, policy, options, device=torch_device, graph=graph)

    return make


__all__ = ["CpuRunner", "GraphVariant", "Runner", "gpu_runner_factory", "make_runner"]
