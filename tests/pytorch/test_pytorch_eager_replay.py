"""Replayed eager bodies of the fused ops (custom_ops.replay): a recipe relaunches what the body launched, at
the recorded offsets into the new call's tensors, and rebuilds its outputs as the same views; on a GPU, every
fused op's forward and backward replayed on fresh tensors equals the body run without replaying, bit for bit,
and the bodies that allocate, view and launch only are the ones replayed."""

from __future__ import annotations

import ctypes

import pytest
import torch

from xpuruntime.pytorch.custom_ops import replay
from xpuruntime.pytorch.state import STATE


class _CopyBytes:
    """A stand-in compiled kernel: run(..., src, dst, n) copies n bytes (pointers as the recipe passes them)."""

    function, packed_metadata = None, None

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def run(self, g0, g1, g2, stream, function, metadata, *rest) -> None:
        src, dst, n = rest[3:6]
        self.calls.append((g0, g1, g2, stream))
        ctypes.memmove(dst, src, n)


def test_a_recipe_relaunches_at_the_recorded_offsets_and_rebuilds_the_outputs(monkeypatch) -> None:
    monkeypatch.setattr(replay, "current_stream", lambda device: "stream")
    kernel = _CopyBytes()
    x = torch.arange(64, dtype=torch.uint8)
    buffer = torch.empty(32, dtype=torch.uint8)
    sources = [x, buffer]
    launch = replay._launch_of((kernel, (3,), (x[16:], buffer[8:], 8), ()), sources)
    assert launch[3] == ((0, 0, 16), (1, 1, 8))  # (argument position, source, byte offset)
    outputs = replay._outputs_of((buffer[8:16], None, x), sources)
    recipe = replay.Recipe(0, ((tuple(buffer.shape), buffer.stride(), buffer.dtype),), (launch,), outputs)

    fresh = torch.randint(0, 255, (64,), dtype=torch.uint8)
    view, nothing, same = recipe.replay((fresh,))
    assert kernel.calls == [(3, 1, 1, "stream")]
    assert torch.equal(view, fresh[16:24]) and view.shape == (8,)
    assert nothing is None and same is fresh


def test_a_tensor_outside_every_source_or_in_two_is_not_replayable() -> None:
    x, y = torch.zeros(8), torch.zeros(8)
    with pytest.raises(replay._Unmapped):
        replay._source_of(torch.zeros(4), [x, y])
    with pytest.raises(replay._Unmapped):
        replay._source_of(x[2:], [x, x[1:]])
    assert replay._source_of(y[3:], [x, y]) == (1, 12)


def test_calls_off_cuda_are_never_keyed() -> None:
    from xpuruntime.policy import KernelPolicy

    assert replay._key(lambda *a: None, (torch.zeros(2), 1.0), KernelPolicy()) is None


# -- on a GPU -------------------------------------------------------------------------------------------------


def _cases() -> dict:
    from xpuruntime.pytorch.custom_ops.add_norm import add_layer_norm, add_rms_norm
    from xpuruntime.pytorch.custom_ops.glu import geglu, swiglu
    from xpuruntime.pytorch.custom_ops.norm import layer_norm, rms_norm
    from xpuruntime.pytorch.custom_ops.rotary import rotary_embedding

    return {
        "swiglu": (((4, 37, 96), (4, 37, 96)), lambda p, g, u: swiglu(g, u, p)),
        "swiglu packed": (((4, 37, 192),), lambda p, gu: swiglu(gu, None, p)),
        "geglu tanh": (((3, 50, 80), (3, 50, 80)), lambda p, g, u: geglu(g, u, "tanh", p)),
        "rms_norm llama": (
            ((4, 37, 320), (320,)),
            lambda p, x, w: rms_norm(x, (320,), w, 1e-6, casting="llama", pinned=p),
        ),
        "add_rms_norm": (
            ((4, 37, 320), (4, 37, 320), (320,)),
            lambda p, x, r, w: add_rms_norm(x, r, w, 1e-6, casting="llama", pinned=p),
        ),
        "layer_norm": (((5, 33, 256), (256,), (256,)), lambda p, x, w, b: layer_norm(x, (256,), w, b, 1e-5, p)),
        "add_layer_norm": (
            ((5, 33, 256), (5, 33, 256), (256,), (256,)),
            lambda p, x, r, w, b: add_layer_norm(x, r, w, b, 1e-5, p),
        ),
        "rotary": (
            ((2, 8, 33, 64), (2, 2, 33, 64), (2, 33, 64), (2, 33, 64)),
            lambda p, q, k, c, s: rotary_embedding(q, k, c.detach(), s.detach(), None, 1, False, p),
        ),
    }


def _run(fn, pinned, shapes, seed: int, dtype: torch.dtype) -> list:
    g = torch.Generator(device="cuda").manual_seed(seed)
    leaves = [torch.randn(*s, device="cuda", generator=g).to(dtype).requires_grad_() for s in shapes]
    outs = fn(pinned, *leaves)
    outs = outs if isinstance(outs, tuple) else (outs,)
    weights = [torch.randn(o.shape, device="cuda", generator=g).to(o.dtype) for o in outs]
    torch.autograd.backward(list(outs), weights)
    return [o.detach().clone() for o in outs] + [t.grad for t in leaves]


def _compare_with_bodies(fn, pinned, shapes, monkeypatch) -> None:
    """Calls 1-2 run the body (the second records), 3-5 replay, on fresh tensors each time; each equals the same
    call with replaying off, bit for bit, in values and layout."""
    replay.forget()
    for seed in range(5):
        replayed = _run(fn, pinned, shapes, seed, torch.bfloat16)
        monkeypatch.setattr(replay, "ENABLED", False)
        plain = _run(fn, pinned, shapes, seed, torch.bfloat16)
        monkeypatch.setattr(replay, "ENABLED", True)
        for a, b in zip(replayed, plain):
            assert (a is None) == (b is None)
            if a is not None:
                assert a.shape == b.shape and a.stride() == b.stride() and torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", list(_cases()))
def test_replayed_fused_ops_equal_their_bodies_bit_for_bit(name: str, monkeypatch) -> None:
    from xpuruntime.bench.hf_training import PATCH_POLICY
    from xpuruntime.policy import KernelPolicy
    from xpuruntime.pytorch.router import pin

    shapes, fn = _cases()[name]
    _compare_with_bodies(fn, pin(KernelPolicy.from_string(PATCH_POLICY)), shapes, monkeypatch)
    recipes = [r for r in STATE.replay.recipes.values() if isinstance(r, replay.Recipe)]
    assert len(recipes) == 2, f"{name}: forward and backward bodies replayed ({STATE.replay.recipes.values()})"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_routed_norms_replay_bit_for_bit(op: str, monkeypatch) -> None:
    import torch.nn.functional as F

    import xpuruntime.pytorch as xtorch

    def norm(pinned, x, w, b):
        return F.layer_norm(x, (256,), w, b, 1e-5) if op == "layer_norm" else F.rms_norm(x, (256,), w, 1e-5)

    with xtorch.kernel_policy(**{op: "triton"}):
        _compare_with_bodies(norm, None, ((6, 41, 256), (256,), (256,)), monkeypatch)
    recipes = [r for r in STATE.replay.recipes.values() if isinstance(r, replay.Recipe)]
    assert len(recipes) == 2, f"{op}: forward and backward bodies replayed ({STATE.replay.recipes.values()})"


def test_an_unhashable_argument_runs_the_body(monkeypatch) -> None:
    from xpuruntime.policy import KernelPolicy

    monkeypatch.setattr(replay, "_key", lambda body, args, policy: (body, {"unhashable": 1}))
    assert replay.call(lambda x, policy: x + 1, (1,), KernelPolicy()) == 2
