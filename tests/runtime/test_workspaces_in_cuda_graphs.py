"""Workspaces lent while a CUDA graph is captured are fresh buffers of the graph's own pool.

The dispatcher keeps one scratch buffer per (thread, device, stream) and grows it when a call needs more,
dropping the old one. A graph captured with a slice of that buffer kept writing there on every replay after
a later capture (on the same capture stream) grew it: memory the graph no longer owned, and an illegal
address once the allocator gave it back to the driver (the zoo's BERT fp16 GPU row faulted so). Each capture
site (the ONNX GPU runner, `capture_graph`, `CUDAGraphWrapper`) lends per call while capturing."""

from __future__ import annotations

import contextlib
import types

import pytest

torch = pytest.importorskip("torch")

from xpuruntime.onnx.runners import gpu  # noqa: E402
from xpuruntime.runtime.workspace import WorkspaceManager  # noqa: E402


def fake_cuda(events: list[str]) -> types.SimpleNamespace:
    """Enough of torch.cuda for GpuPlanEntry.capture on a machine without a GPU; records the capture."""

    @contextlib.contextmanager
    def graph(g: object):
        events.append("capture begins")
        yield
        events.append("capture ends")

    stream = types.SimpleNamespace(wait_stream=lambda other: None)
    return types.SimpleNamespace(
        Stream=lambda: stream, stream=lambda s: contextlib.nullcontext(), current_stream=lambda: stream,
        CUDAGraph=object, graph=graph, synchronize=lambda: None,
    )  # fmt: skip


def test_the_onnx_runner_captures_with_fresh_workspaces(monkeypatch) -> None:
    events: list[str] = []
    workspaces = WorkspaceManager()

    def empty(shape: tuple, dtype: str, device: str, stream: object) -> torch.Tensor:
        return torch.empty(shape, dtype=torch.uint8)

    class Plan:
        def run(self, inputs: list) -> list:
            events.append(f"lend, per call {getattr(workspaces._local, 'per_call', 0)}")
            return [workspaces.lend(64, "cpu", empty, None)]

    monkeypatch.setattr(gpu, "_torch_module", types.SimpleNamespace(cuda=fake_cuda(events)))
    entry = gpu.GpuPlanEntry(Plan(), [])
    entry.capture([torch.ones(3)], workspaces)
    assert entry.note == "CUDA graph captured", entry.note
    # the warm-up calls lend the cached buffer; the captured call a fresh one, kept by nothing in the manager
    assert events == ["lend, per call 0", "lend, per call 0", "capture begins", "lend, per call 1", "capture ends"]
    assert workspaces._local.per_call == 0


def test_lends_inside_per_call_are_not_the_cached_buffer() -> None:
    workspaces = WorkspaceManager()
    empty = lambda shape, dtype, device, stream: torch.empty(shape, dtype=torch.uint8)  # noqa: E731
    cached = workspaces.lend(256, "cpu", empty, None)
    with workspaces.per_call():
        fresh = workspaces.lend(256, "cpu", empty, None)
    grown = workspaces.lend(1 << 20, "cpu", empty, None)  # grows (and drops) the cached buffer
    assert fresh.data_ptr() != cached.data_ptr() and grown.untyped_storage() is not fresh.untyped_storage()


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs_cuda
def test_a_graph_replays_right_after_another_capture_grew_the_workspace() -> None:
    """Graph A lends a small workspace; graph B, captured after it on the same capture stream, a large one
    (the cached buffer grows, the old one is dropped); memory is handed back and reused; A still replays right."""
    from xpuruntime.pytorch.graphs import capture_graph
    from xpuruntime.pytorch.router import get_dispatcher

    workspaces = get_dispatcher().workspaces
    empty = lambda shape, dtype, device, stream: torch.empty(shape, dtype=torch.uint8, device=device)  # noqa: E731
    x = torch.randn(4096, device="cuda")
    out_a, out_b = torch.empty_like(x), torch.empty_like(x)

    def body(nbytes: int, out: torch.Tensor) -> None:
        scratch = workspaces.lend(nbytes, "cuda:0", empty, torch.cuda.current_stream())[: x.numel() * 4]
        scratch = scratch.view(torch.float32)
        scratch.copy_(x)
        torch.mul(scratch, 2.0, out=out)

    for nbytes, out in ((x.numel() * 4, out_a), (256 << 20, out_b)):
        body(nbytes, out)  # warm-up outside capture
    torch.cuda.synchronize()
    with capture_graph() as graph_a:
        body(x.numel() * 4, out_a)
    with capture_graph() as graph_b:
        body(256 << 20, out_b)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    junk = torch.full((64 << 20,), float("nan"), device="cuda")  # reuses whatever was handed back
    out_a.zero_()
    graph_a.replay()
    graph_b.replay()
    torch.cuda.synchronize()
    assert torch.equal(out_a, x * 2) and torch.equal(out_b, x * 2)
    del junk
