"""Streams and events: CPU answers at once; on CUDA events order and time real work."""

from __future__ import annotations

import pytest

from xpuruntime.errors import XpuRuntimeError
from xpuruntime.runtime import streams


def test_cpu_has_no_stream_and_completed_events():
    assert streams.current_stream("cpu") is None
    event = streams.record_event("cpu")
    assert event is streams.COMPLETED and event.query() is True
    event.synchronize()
    event.wait()
    streams.synchronize("cpu")


@pytest.mark.parametrize("device,index", [("cuda", 0), ("cuda:0", 0), ("cuda:3", 3)])
def test_device_index(device, index):
    assert streams.device_index(device) == index


@pytest.mark.gpu
def test_events_follow_work_on_a_side_stream():
    torch = pytest.importorskip("torch")
    side = streams.new_stream("cuda:0")
    assert isinstance(side.handle, int) and side.handle != streams.current_stream("cuda:0").cuda_stream
    x = torch.randn(4096, 4096, device="cuda")
    with side:
        assert torch.cuda.current_stream().cuda_stream == side.handle
        torch.cuda._sleep(100_000_000)
        y = x @ x
        done = streams.record_event("cuda:0", side, timing=True)
    assert done.query() is False, "event reported done while the side stream sleeps"
    done.wait()  # the current stream now waits for the side stream
    z = y.sum()
    done.synchronize()
    assert done.query() is True
    reference = x.double() @ x.double()
    assert torch.isfinite(z) and float((y.double() - reference).norm() / reference.norm()) < 1e-3
    start = side.record_event(timing=True)
    with side:
        torch.cuda._sleep(1_000_000)
    end = side.record_event(timing=True)
    end.synchronize()
    assert start.elapsed_ms(end) > 0
    streams.synchronize("cuda:0", side)
    streams.synchronize("cuda:0")


class FakeStream:
    def __init__(self, handle: int) -> None:
        self.cuda_stream = handle


class FakeTorch:
    """Just enough of torch.cuda for current_stream: a per-device current stream the test switches."""

    def __init__(self) -> None:
        self.current = {0: FakeStream(0), 1: FakeStream(0x100)}
        self.built = 0
        fake = self

        class cuda:
            @staticmethod
            def current_stream(index):
                fake.built += 1
                return fake.current[index]

        class _C:
            @staticmethod
            def _cuda_getCurrentRawStream(index):
                return fake.current[index].cuda_stream

        self.cuda, self._C = cuda, _C


def test_current_stream_follows_switches_and_builds_each_stream_object_once(monkeypatch):
    fake = FakeTorch()
    monkeypatch.setattr(streams, "_torch", lambda: fake)
    monkeypatch.setattr(streams, "_cuda_devices", {})
    monkeypatch.setattr(streams, "_stream_objects", {})
    default0, default1 = fake.current[0], fake.current[1]
    assert streams.current_stream("cuda:0") is default0 and streams.current_stream("cuda") is default0
    assert streams.current_stream("cuda:1") is default1
    side = FakeStream(0xABC)
    fake.current[0] = side  # like entering `with torch.cuda.stream(side)`
    assert streams.current_stream("cuda:0") is side and streams.current_stream("cuda:1") is default1
    fake.current[0] = default0
    built = fake.built
    for _ in range(5):
        assert streams.current_stream("cuda:0") is default0
        assert streams.current_stream("cuda:1") is default1
    assert fake.built == built, "cached stream objects were rebuilt"
    assert streams.current_stream("cpu") is None


def test_stream_and_event_without_pytorch_fail_with_a_clear_error(monkeypatch):
    """cuda.core has no current stream: waiting on 'the current one' or entering a stream must say so."""
    from xpuruntime.runtime import streams

    class CoreEvent:  # a cuda.core event has no .wait of its own
        pass

    monkeypatch.setattr(streams, "_torch", lambda: None)
    with pytest.raises(XpuRuntimeError, match=r"Event\.wait: .*stream="):
        streams.Event(CoreEvent()).wait()
    with pytest.raises(XpuRuntimeError, match="needs PyTorch"), streams.Stream(object()):
        pass
