"""The Triton backend as the runtime sees it: availability, explicit-only under the interpreter, reasons
and fallbacks for calls its kernels cannot run, clear errors, the matmul tuner and its disk cache."""

from __future__ import annotations

import json

import numpy as np
import pytest
from triton_harness import (
    INTERPRET,
    ON_GPU,
    assert_close,
    f64,
    kernel_test,
    make,
    rerun_under_interpreter,
    torch,
)  # fmt: skip

import xpuruntime as xrt
from xpuruntime.errors import DeviceMismatchError, KernelFallbackWarning, UnsupportedByPolicyError
from xpuruntime.ops.elementwise import reference as sin_affine_reference
from xpuruntime.registry import default_registry

if not (INTERPRET or ON_GPU):  # CPU-only machines (CI): run this module again under the interpreter

    def test_backend_under_interpreter() -> None:
        rerun_under_interpreter(__file__)


@kernel_test
def test_backend_is_registered_with_its_device_type() -> None:
    backend = default_registry().backends["triton"]
    assert backend.device_type == ("cpu" if INTERPRET else "cuda")
    assert backend.explicit_only is INTERPRET
    assert backend.unavailable_reason is None
    names = {k.name for k in default_registry().kernels_for("matmul") if k.backend == "triton"}
    assert names == {"triton", "triton_splitk", "triton_gemv", "triton_gemv_t"}


if INTERPRET:  # explicit-only and NumPy views exist only for the interpreter backend

    def test_interpreter_kernels_run_only_where_the_policy_names_them(rng) -> None:
        x = make(rng, (4, 5), "float32")
        explanation = xrt.explain("softmax", x, show=False)
        assert explanation.selected != "triton"
        reasons = next(c.reasons for c in explanation.candidates if c.kernel.name == "triton")
        assert any("only where the policy names it" in r for r in reasons)
        with xrt.kernel_policy(softmax="triton", strict=True):
            assert xrt.explain("softmax", x, show=False).selected == "triton"


@kernel_test
def test_unsupported_dtype_is_a_reason_then_a_fallback(rng) -> None:
    x = make(rng, (6, 7), "float32")
    x = (x * 10).astype(np.int32) if not ON_GPU else (x * 10).to(torch.int32)
    with xrt.kernel_policy(sum="triton", strict=True), pytest.raises(UnsupportedByPolicyError) as info:
        xrt.ops.sum(x)
    assert "dtype int32 not in" in str(info.value) and "triton" in str(info.value)
    with xrt.kernel_policy(sum="triton"), pytest.warns(KernelFallbackWarning, match="triton"):
        out = xrt.ops.sum(x)
    assert np.array_equal(f64(out), f64(x).sum(-1))


@kernel_test
def test_layout_the_kernel_cannot_index_is_a_reason_then_a_fallback(rng) -> None:
    x = make(rng, (3, 2, 5, 4, 3), "float32")
    a, b = make(rng, (2, 1, 4, 1), "float32"), make(rng, (5, 1, 3), "float32")
    with xrt.kernel_policy(sin_affine="triton", strict=True), pytest.raises(UnsupportedByPolicyError, match="5 dims"):
        xrt.ops.sin_affine(x, a, b)
    if ON_GPU:
        return  # no other GPU kernel for sin_affine to fall back to
    with xrt.kernel_policy(sin_affine="triton"), pytest.warns(KernelFallbackWarning):
        out = xrt.ops.sin_affine(x, a, b)
    assert_close(out, sin_affine_reference(f64(x), f64(a), f64(b)), "float32")


if INTERPRET:  # negative strides exist only for NumPy arrays

    def test_reversed_numpy_view_is_refused_with_a_reason(rng) -> None:
        x = make(rng, (5, 6), "float32")[::-1]
        with (
            xrt.kernel_policy(softmax="triton", strict=True),
            pytest.raises(UnsupportedByPolicyError, match="negative"),
        ):
            xrt.ops.softmax(x)


@kernel_test
def test_split_k_is_rejected_when_the_policy_asks_for_determinism(rng) -> None:
    a, b = make(rng, (8, 600), "float32"), make(rng, (600, 8), "float32")
    explanation = xrt.explain(
        "matmul", a, b, policy=xrt.KernelPolicy(matmul="triton_splitk", deterministic=True), show=False
    )
    reasons = next(c.reasons for c in explanation.candidates if c.kernel.name == "triton_splitk")
    assert any("not deterministic" in r for r in reasons)


@kernel_test
def test_norm_backward_shape_errors_name_the_argument(rng) -> None:
    x, dy = make(rng, (4, 6), "float32"), make(rng, (4, 5), "float32")
    with xrt.kernel_policy(layer_norm_backward="triton"), pytest.raises(xrt.errors.ShapeError, match="'dy'"):
        xrt.ops.layer_norm_backward(dy, x, 6)


@pytest.mark.gpu
@kernel_test
def test_device_mismatch_is_an_error(rng) -> None:
    x = make(rng, (4, 8), "float32")
    w = np.ones(8, np.float32)
    with pytest.raises(DeviceMismatchError):
        xrt.ops.layer_norm(x, 8, torch.from_numpy(w))


@pytest.mark.gpu
@kernel_test
def test_matmul_tuner_stores_its_winner_on_disk(rng, tmp_path, monkeypatch) -> None:
    from xpuruntime.backends.triton import matmul as tm
    from xpuruntime.runtime import tuning_cache

    monkeypatch.setenv(tuning_cache.ENV_CACHE_DIR, str(tmp_path))  # the default cache follows the variable
    monkeypatch.setattr(tm, "_WINNERS", {})
    a, b = make(rng, (512, 768), "bfloat16"), make(rng, (768, 640), "bfloat16")
    with xrt.kernel_policy(matmul="triton", strict=True):
        out = xrt.ops.matmul(a, b)
    assert_close(out, (a.double() @ b.double()).cpu().numpy(), "bfloat16")
    (winner,) = tm._WINNERS.values()
    (file,) = tmp_path.rglob("*.json")
    assert tuple(json.loads(file.read_text())["value"]["config"]) == winner
    monkeypatch.setattr(tm, "_WINNERS", {})  # a new process: the winner comes from disk, no search
    monkeypatch.setattr(tm, "_search", lambda *args: pytest.fail("searched again despite a cached winner"))
    with xrt.kernel_policy(matmul="triton", strict=True):
        xrt.ops.matmul(make(rng, (512, 768), "bfloat16"), b)


def test_launch_hooks_count_only_when_something_would_run() -> None:
    from triton.knobs import HookChain

    from xpuruntime.backends.triton.common import hook_active

    chain = HookChain()
    assert not hook_active(None) and not hook_active(chain)  # Triton >= 3.5 keeps an empty chain
    chain.add(print)
    assert hook_active(chain) and hook_active(print)


def test_direct_launch_passes_every_parameter_after_the_positional_ones() -> None:
    import triton
    import triton.language as tl

    from xpuruntime.backends.triton.common import _constexpr_tail

    @triton.jit
    def kernel(x, n, BLOCK: tl.constexpr, FLAG: tl.constexpr = False):
        pass

    assert _constexpr_tail(kernel, 2, {"BLOCK": 64}) == (64, False)
    assert _constexpr_tail(kernel, 2, {"FLAG": True, "BLOCK": 8}) == (8, True)
    with pytest.raises(TypeError, match="missing \\['BLOCK'\\]"):
        _constexpr_tail(kernel, 2, {})
    assert _constexpr_tail(kernel, 1, {"n": 3, "BLOCK": 8}) == (3, 8, False)  # keywords fill in order
    with pytest.raises(TypeError, match="'OTHER'"):
        _constexpr_tail(kernel, 2, {"BLOCK": 8, "OTHER": 1})


@pytest.mark.gpu
@kernel_test
def test_repeat_launches_skip_tritons_python_launch_path(rng, monkeypatch) -> None:
    from triton.runtime.jit import JITFunction

    x = make(rng, (257, 33), "float32")
    with xrt.kernel_policy(sin_affine="triton", strict=True):
        xrt.ops.sin_affine(x, 1.5, 0.25)  # the first launch compiles and keeps the kernel
        monkeypatch.setattr(JITFunction, "run", lambda *a, **k: pytest.fail("went through JITFunction.run"))
        y = make(rng, (257, 33), "float32")
        out = xrt.ops.sin_affine(y, 1.5, 0.25)
    assert_close(out, sin_affine_reference(f64(y), 1.5, 0.25), "float32")


def test_launch_key_inlines_tensors_and_ints_like_spec() -> None:
    from xpuruntime.backends.triton.common import _spec, _specs

    base = torch.arange(16, dtype=torch.float32)
    args = (base, base[1:], torch.nn.Parameter(base.clone()), 1, 0, -3, -16, 48, 2**31, -(2**31) - 1, 0.5, None,
            True, "s")  # fmt: skip
    assert _specs(args) == tuple(map(_spec, args))
    assert _specs((base[1:],))[0][1] is False and _specs((48,)) == ((False, True, True),)


@pytest.mark.parametrize(
    "stored", [None, {}, {"config": "128x128"}, {"config": [999, 999, 64, 8, 3, 1]}, {"config": [1, 2, 3]}, "config"]
)
def test_triton_matmul_retunes_a_cached_winner_that_is_not_a_candidate(stored) -> None:
    """A tuning-cache entry that is not one of the candidate configs (hand-edited, foreign) is a miss."""
    from xpuruntime.backends.triton.matmul import _stored_winner, candidates

    a, b = torch.empty((1, 256, 64), dtype=torch.float16), torch.empty((1, 64, 256), dtype=torch.float16)
    assert _stored_winner(stored, a, b, splitk=False) is None
    winner = (*candidates(256, 256, 2)[0], 1)
    assert _stored_winner({"config": list(winner)}, a, b, splitk=False) == winner
