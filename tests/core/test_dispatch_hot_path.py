"""What the dispatcher's hot path skips, and when it must not: the stream lookup of ambient-stream
backends, and the launch counting that only a framework front end needs."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_toy_registry

import xpuruntime as xrt
from xpuruntime import dispatch
from xpuruntime.dispatch import LAUNCHING, Dispatcher, track_launches
from xpuruntime.registry import Backend, kernel


def ambient_registry(workspace_bytes: int = 0) -> tuple[object, dict]:
    """The toy op on a backend whose kernels follow the framework's stream, counting stream lookups."""
    seen: dict = {"lookups": 0, "streams": [], "depths": []}

    def current_stream(device: str) -> str:
        seen["lookups"] += 1
        return "the-stream"

    registry = make_toy_registry()
    registry.register_backend(
        Backend("ambient", "cpu", empty=lambda shape, dtype, device, stream: np.empty(shape, dtype),
                current_stream=current_stream, record_event=lambda device, stream: ("event on", stream),
                ambient_stream=True)
    )  # fmt: skip

    @kernel("toy", "ambient_k", backend="ambient", workspace_bytes=lambda ctx: workspace_bytes)
    def launch(args) -> None:
        seen["streams"].append(args.stream)
        seen["depths"].append(LAUNCHING.depth)
        if seen.get("fail"):
            raise RuntimeError("boom")
        np.copyto(args.out, args.inputs[0])

    registry.register_kernel(launch)
    return registry, seen


def test_an_ambient_stream_backend_skips_the_stream_lookup():
    registry, seen = ambient_registry()
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    y = Dispatcher(registry).run("toy", (x,))
    np.testing.assert_array_equal(y, x)
    assert seen["lookups"] == 0 and seen["streams"] == [None]


@pytest.mark.parametrize("why", ["workspace", "full_sync", "event_record"])
def test_an_ambient_stream_backend_still_gets_its_stream_for_workspaces_and_syncs(why):
    registry, seen = ambient_registry(workspace_bytes=64 if why == "workspace" else 0)
    dispatcher = Dispatcher(registry)
    x = np.random.default_rng(1).standard_normal(7).astype(np.float32)
    dispatcher.run("toy", (x,), policy=xrt.KernelPolicy(sync="no_sync" if why == "workspace" else why))
    assert seen["lookups"] == 1 and seen["streams"] == ["the-stream"]
    if why == "event_record":
        assert xrt.last_event() == ("event on", "the-stream")


def test_launches_are_counted_only_while_a_front_end_listens():
    registry, seen = ambient_registry()
    dispatcher = Dispatcher(registry)
    x = np.ones(4, np.float32)
    dispatcher.run("toy", (x,))  # a plan miss (selection) and its launch
    dispatcher.run("toy", (x,))  # a hit
    assert seen["depths"] == [0, 0]
    track_launches(True)
    try:
        dispatcher.run("toy", (x,))
        assert seen["depths"][-1] == 1
        seen["fail"] = True
        with pytest.raises(xrt.LaunchError, match="boom"):  # the count is restored when a launch raises
            dispatcher.run("toy", (x,))
        assert LAUNCHING.depth == 0
    finally:
        track_launches(False)
    assert not dispatch._tracking and LAUNCHING.depth == 0


def test_plan_misses_count_as_launches_even_without_a_front_end():
    """Tuning launches kernels at a plan miss: a kernel calling back into the framework must see it."""
    registry = make_toy_registry({"name": "a"})
    depths = []
    dispatcher = Dispatcher(registry)
    decide = dispatcher.decide

    def deciding(*args, **kwargs):
        depths.append(LAUNCHING.depth)
        return decide(*args, **kwargs)

    dispatcher.decide = deciding
    dispatcher.run("toy", (np.ones(3, np.float32),))
    assert depths[0] == 1 and LAUNCHING.depth == 0
