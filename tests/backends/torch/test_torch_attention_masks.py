"""Additive masks as Hugging Face builds them (finfo(dtype).min where a key is hidden) with left padding, so that
some query rows see no key: the attention op averages v over such a row, as the exported graph does. PyTorch's
memory-efficient kernel scales its scores by log2(e) and turns finfo(float32).min into -inf (NaN rows); the
torch backend hands it a mask raised to finfo.min / 2 (exp2_safe_mask), which changes no result.

On the CPU: what exp2_safe_mask changes and that SDPA's answer stays the float64 reference's. On a GPU: every
attention kernel that takes a mask, forced by policy, against the reference on such masks."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import xpuruntime as xrt  # noqa: E402
from xpuruntime.backends.torch.attention import exp2_safe_mask  # noqa: E402
from xpuruntime.ops.attention import reference  # noqa: E402
from xpuruntime.registry import default_registry  # noqa: E402


def padded_causal_mask(dtype: torch.dtype, keep_from: tuple[int, ...], length: int) -> torch.Tensor:
    """[B, 1, L, L]: causal, and batch b's first keep_from[b] keys hidden (left padding), as HF's additive mask:
    0 where a key is seen, finfo(dtype).min where not. Rows before keep_from[b] see no key."""
    rows = torch.arange(length).reshape(length, 1)
    cols = torch.arange(length).reshape(1, length)
    keep = torch.stack([(cols <= rows) & (cols >= start) for start in keep_from])[:, None]
    return torch.where(keep, 0.0, torch.finfo(dtype).min).to(dtype)


def qkv(batch: int, heads: int, length: int, dim: int, dtype: torch.dtype, device: str = "cpu") -> list:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(batch, heads, length, dim, generator=gen, dtype=torch.float64).to(device, dtype)
            for _ in range(3)]  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_exp2_safe_mask_raises_only_what_would_overflow(dtype: torch.dtype) -> None:
    low, floor = torch.finfo(dtype).min, torch.finfo(dtype).min / 2
    mask = torch.tensor([[0.0, -1.0, -1e30, low, float("-inf"), low * 0.75]], dtype=dtype)
    safe = exp2_safe_mask(mask)
    want = torch.tensor([[0.0, -1.0, -1e30, floor, float("-inf"), floor]], dtype=dtype)
    assert torch.equal(safe, want)
    assert torch.isfinite(safe[torch.isfinite(safe)].float() * 1.4426950408889634).all()  # no overflow in exp2


def test_exp2_safe_mask_leaves_boolean_and_half_masks_alone() -> None:
    boolean = torch.tensor([[True, False]])
    half = torch.tensor([[0.0, torch.finfo(torch.float16).min]], dtype=torch.float16)
    assert exp2_safe_mask(boolean) is boolean and exp2_safe_mask(half) is half and exp2_safe_mask(None) is None


def test_safe_mask_gives_the_reference_on_rows_that_see_no_key() -> None:
    """SDPA's math backend with the raised mask: rows hidden entirely average v (the float64 reference, which adds
    finfo.min itself), the other rows unchanged."""
    q, k, v = qkv(2, 3, 9, 16, torch.float32)
    mask = padded_causal_mask(torch.float32, (0, 4), 9)
    want = reference(q.numpy(), k.numpy(), v.numpy(), mask.numpy())
    blind = want[1, :, :4]
    np.testing.assert_allclose(blind, np.broadcast_to(v[1, :, None].double().numpy().mean(axis=2), blind.shape),
                               rtol=1e-6, atol=1e-6)  # fmt: skip
    got = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=exp2_safe_mask(mask))
    np.testing.assert_allclose(got.double().numpy(), want, rtol=1e-5, atol=1e-5)


MASKED_KERNELS = {"float32": ["torch_efficient", "torch_math"], "bfloat16": ["torch_efficient", "torch_math", "flash_v2"]}  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("bounded", [False, True])
@pytest.mark.parametrize(("dtype", "kernel"), [(d, k) for d, ks in MASKED_KERNELS.items() for k in ks])
def test_masked_kernels_average_v_on_rows_that_see_no_key(dtype: str, kernel: str, bounded: bool) -> None:
    """GPT-2 / Llama with left padding on the GPU: each kernel taking an additive mask gives the reference on
    HF's finfo.min masks (before exp2_safe_mask, torch_efficient and flash_v2 gave NaN on the padded rows). Not
    float16: finfo(float16).min does not swamp the scores, and what such a row gives depends on rounding.
    `bounded`: the ONNX attention fusion's form of that mask, the fill raised to mask_floor and bounded_mask=True
    (the kernels skip their scans of the mask), still the reference of the original mask."""
    from xpuruntime.ops.attention import mask_floor

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    reason = default_registry().backends[default_registry().kernel("attention", kernel).backend].unavailable_reason
    if reason:
        pytest.skip(reason)
    torch_dtype = getattr(torch, dtype)
    q, k, v = qkv(2, 4, 37, 64, torch_dtype, "cuda")
    mask = padded_causal_mask(torch_dtype, (0, 11), 37).cuda()
    want = reference(*(t.double().cpu().numpy() for t in (q, k, v)), mask.double().cpu().numpy())
    given = mask.clamp_min(mask_floor(dtype)) if bounded else mask
    with xrt.kernel_policy(strict=True, attention=kernel):
        got = xrt.ops.attention(q, k, v, attn_mask=given, bounded_mask=bounded)
    tolerance = {"float32": 1e-4, "bfloat16": 3e-2}[dtype]
    np.testing.assert_allclose(got.double().cpu().numpy(), want, rtol=tolerance, atol=tolerance)
