"""flash_v2 (Triton) through the dispatcher against float64 references: forward, logsumexp, backward.

On a GPU: full-size shapes in bf16 and fp16 and PyTorch's SDPA backends beside it; without one this
module reruns itself under TRITON_INTERPRET=1 on tiny shapes in fp16.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from triton_harness import INTERPRET, ON_GPU, assert_close, f64, kernel_test, rerun_under_interpreter, size, torch

import xpuruntime as xrt
from xpuruntime.errors import KernelFallbackWarning, UnsupportedByPolicyError
from xpuruntime.ops.attention import reference as attention_reference
from xpuruntime.ops.attention_backward import gradients_reference
from xpuruntime.ops.attention_forward import lse_reference
from xpuruntime.ops.attention_forward import reference as forward_reference

DTYPES = ["bfloat16", "float16"] if ON_GPU else ["float16"]
TOL = {"float16": 5e-3, "bfloat16": 2e-2}
FLASH = dict(attention="flash_v2", attention_forward="flash_v2", attention_backward="flash_v2")


@pytest.mark.skipif(INTERPRET, reason="this is the interpreter run itself")
@pytest.mark.skipif(ON_GPU, reason="the GPU run tests the compiled kernels; the CPU CI runs the interpreter")
def test_flash_under_interpreter() -> None:
    rerun_under_interpreter(__file__)


def _tensor(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, bshd: bool = False):
    """Random data; bshd=True gives [B, S, H, D] data viewed as [B, H, S, D] (non-contiguous, no copy)."""
    if bshd:
        b, h, s, d = shape
        shape = (b, s, h, d)
    base = rng.standard_normal(shape)
    if ON_GPU:
        t = torch.tensor(base, dtype=getattr(torch, dtype), device="cuda")
        return t.transpose(1, 2) if bshd else t
    a = base.astype(dtype)
    return a.transpose(0, 2, 1, 3) if bshd else a


def _mask(rng: np.random.Generator, kind: str | None, shape: tuple[int, ...], dtype: str):
    if kind is None:
        return None
    if kind == "bool":
        m = rng.random(shape) > 0.3
        m[..., 0] = True  # every row sees a key (rows that see none are tested apart)
        return torch.tensor(m, device="cuda") if ON_GPU else m
    return _tensor(rng, shape, dtype) if len(shape) == 4 else (
        torch.tensor(rng.standard_normal(shape), dtype=getattr(torch, dtype), device="cuda") if ON_GPU
        else rng.standard_normal(shape).astype(dtype))  # fmt: skip


def _mask64(mask):
    """A mask as the float64 reference takes it: bool stays bool, additive becomes float64."""
    if mask is None:
        return None
    if ON_GPU and mask.dtype == torch.bool:
        return mask.cpu().numpy()
    return mask if isinstance(mask, np.ndarray) and mask.dtype == np.bool_ else f64(mask)


def _empty(shape: tuple[int, ...], dtype: str, fill: float = float("nan")):
    if ON_GPU:
        return torch.full(shape, fill, dtype=getattr(torch, dtype), device="cuda")
    return np.full(shape, fill, dtype)


# B, H, Hk, L, S, D, causal, mask kind (mask shape broadcasts over batch/heads)
CASES = [
    (size(2, 1), 4, 4, size(1000, 37), size(1037, 29), size(128, 32), False, None),
    (size(2, 1), 4, 4, size(777, 29), size(1029, 41), size(64, 16), True, None),
    (size(2, 1), 4, 4, size(1029, 41), size(777, 23), size(128, 32), True, None),
    (size(2, 1), 8, 2, size(513, 33), size(700, 35), size(64, 16), True, None),
    (size(2, 1), 8, 2, size(640, 24), size(640, 24), size(128, 32), False, None),
    (1, 2, 2, size(300, 21), size(500, 27), size(32, 16), False, "bool"),
    (1, 2, 2, size(300, 21), size(500, 27), size(80, 24), False, "add"),
    (1, 2, 2, size(333, 19), size(333, 19), size(96, 48), True, None),
    (1, 2, 2, size(257, 17), size(300, 18), size(256, 32), False, None),
    (1, 2, 1, size(257, 17), size(300, 18), size(256, 32), True, None),
]


def _case_inputs(rng, case, dtype):
    B, H, Hk, L, S, D, causal, mk = case
    q = _tensor(rng, (B, H, L, D), dtype, bshd=True)
    k = _tensor(rng, (B, Hk, S, D), dtype, bshd=True)
    v = _tensor(rng, (B, Hk, S, D), dtype)
    mask_shape = (1, H, L, S) if mk == "add" else (L, S)
    return q, k, v, _mask(rng, mk, mask_shape, dtype), causal, Hk != H


@kernel_test
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_forward_lse_backward(case, dtype) -> None:
    rng = np.random.default_rng()
    q, k, v, mask, causal, gqa = _case_inputs(rng, case, dtype)
    q64, k64, v64, m64 = f64(q), f64(k), f64(v), _mask64(mask)
    out = _empty(tuple(q.shape), dtype)
    with xrt.kernel_policy(strict=True, **FLASH):
        result, lse = xrt.ops.attention_forward(q, k, v, mask, causal, None, gqa, out=out)
        assert result is out
        assert_close(out, forward_reference(q64, k64, v64, m64, None, causal, None, gqa), dtype, TOL[dtype])
        want_lse = lse_reference(q64, k64, m64, causal, None, gqa)
        assert_close(lse, want_lse, "float32", 1e-3)
        do = _tensor(rng, tuple(q.shape), dtype)
        grads = xrt.ops.attention_backward(do, q, k, v, out, lse, mask, causal, None, gqa)
        want = gradients_reference(f64(do), q64, k64, v64, m64, causal, None, gqa)
        for got, ref in zip(grads, want):
            assert_close(got, ref, dtype, TOL[dtype])
        if not gqa:  # the plain attention op (no lse) runs the same forward
            assert_close(xrt.ops.attention(q, k, v, mask, 0.0, causal), attention_reference(q64, k64, v64, m64, causal),
                         dtype, TOL[dtype])  # fmt: skip


@kernel_test
def test_rows_that_see_no_key_follow_the_math_backend() -> None:
    rng = np.random.default_rng()
    L, S, D = size(200, 20), size(300, 21), size(64, 16)
    q, k, v = (_tensor(rng, (1, 2, n, D), "float16") for n in (L, S, S))
    m = rng.random((L, S)) > 0.5
    m[3] = False
    mask = torch.tensor(m, device="cuda") if ON_GPU else m
    with xrt.kernel_policy(strict=True, **FLASH):
        out, lse = xrt.ops.attention_forward(q, k, v, mask)
        ref = forward_reference(f64(q), f64(k), f64(v), m)
        assert_close(out, ref, "float16", TOL["float16"])  # NaN exactly on row 3
        assert np.isposinf(f64(lse)[:, :, 3]).all()
        do = _tensor(rng, (1, 2, L, D), "float16")
        dq, dk, dv = xrt.ops.attention_backward(do, q, k, v, out, lse, mask)
        assert not np.isnan(f64(dk)).any() and (f64(dq)[:, :, 3] == 0).all()
        assert_close(dv, gradients_reference(f64(do), f64(q), f64(k), f64(v), m)[2], "float16", TOL["float16"])


@kernel_test
def test_float32_falls_back_with_one_warning_and_strict_lists_reasons() -> None:
    rng = np.random.default_rng()
    q = rng.standard_normal((1, 2, 9, 16)).astype(np.float32)
    if ON_GPU:
        q = torch.tensor(q, device="cuda")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with xrt.kernel_policy(attention="flash_v2"):
            out = xrt.ops.attention(q, q, q)
            xrt.ops.attention(q, q, q)
    fallbacks = [w for w in caught if issubclass(w.category, KernelFallbackWarning)]
    assert len(fallbacks) == 1 and "flash_v2" in str(fallbacks[0].message) and "float32" in str(fallbacks[0].message)
    assert_close(out, attention_reference(f64(q), f64(q), f64(q)), "float32", 1e-3)
    with pytest.raises(UnsupportedByPolicyError) as info, xrt.kernel_policy(attention="flash_v2", strict=True):
        xrt.ops.attention(q, q, q)
    assert "flash_v2" in str(info.value) and "dtype float32" in str(info.value)


@kernel_test
def test_head_dim_over_256_is_rejected_with_a_reason() -> None:
    rng = np.random.default_rng()
    q = _tensor(rng, (1, 1, 4, 264), "float16")
    explanation = xrt.explain("attention", q, q, q, show=False, policy=xrt.KernelPolicy(attention="flash_v2"))
    reasons = next(c.reasons for c in explanation.candidates if c.kernel.name == "flash_v2")
    assert any("head dim 264" in r for r in reasons)


@pytest.mark.skipif(not ON_GPU, reason="PyTorch's SDPA backends need a CUDA device")
@pytest.mark.parametrize("name", ["torch_flash", "torch_efficient", "torch_cudnn", "torch_math"])
def test_torch_backends_match_reference(name) -> None:
    rng = np.random.default_rng()
    q, k, v = (_tensor(rng, (2, 4, 300, 64), "bfloat16", bshd=True) for _ in range(3))
    with xrt.kernel_policy(strict=True, attention=name):
        out = xrt.ops.attention(q, k, v, is_causal=True)
    assert_close(out, attention_reference(f64(q), f64(k), f64(v), None, True), "bfloat16", TOL["bfloat16"])


@pytest.mark.skipif(not ON_GPU, reason="PyTorch's SDPA backends need a CUDA device")
def test_torch_backend_conditions_say_why() -> None:
    rng = np.random.default_rng()
    q = _tensor(rng, (2, 4, 64, 64), "bfloat16")
    mask = torch.ones(64, 32, dtype=torch.bool, device="cuda")
    explanation = xrt.explain("attention", q, q[:, :, :32], q[:, :, :32], mask, show=False)
    verdicts = {c.kernel.name: c.reasons for c in explanation.candidates}
    assert any("attn_mask" in r for r in verdicts["torch_flash"]) and any(
        "attn_mask" in r for r in verdicts["torch_cudnn"]
    )
    assert not verdicts["torch_efficient"] and not verdicts["flash_v2"]
