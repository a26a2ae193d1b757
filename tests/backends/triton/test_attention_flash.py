"""flash_v2 (Triton) and PyTorch's SDPA kernels as attention kernels: forward, logsumexp and backward against
float64 references, their support conditions and launch configs (each decline with its reason), masked key
blocks before very negative scores, and rows that see no key.

On a GPU: full-size shapes in bf16 and fp16 and PyTorch's SDPA backends beside flash_v2; without one this
module reruns itself under TRITON_INTERPRET=1 on tiny shapes in fp16.
"""

from __future__ import annotations

import dataclasses
import warnings

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
    size,
    torch,
)  # fmt: skip

import xpuruntime as xrt
from xpuruntime.abi import ArgPack, LaunchConfig, MathMode, TensorSpec
from xpuruntime.context import DispatchContext
from xpuruntime.errors import KernelFallbackWarning, NoKernelError, UnsupportedByPolicyError
from xpuruntime.ops.attention import reference as attention_reference
from xpuruntime.ops.attention_backward import gradients_reference
from xpuruntime.ops.attention_forward import lse_reference
from xpuruntime.ops.attention_forward import reference as forward_reference
from xpuruntime.registry import default_registry

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


def _half(rng: np.random.Generator, shape: tuple[int, ...], fill: float | None = None):
    base = rng.standard_normal(shape) if fill is None else np.full(shape, fill)
    return torch.tensor(base, dtype=torch.float16, device="cuda") if ON_GPU else base.astype(np.float16)


def _device(x):
    return torch.tensor(x, device="cuda") if ON_GPU else x


def _context(op: str, specs: tuple, **attrs) -> DispatchContext:
    """A normalized context for `op` on an sm90 device (conditions and launch configs need no arrays)."""
    schema = default_registry().op(op)
    values = {**schema.defaults, **attrs}
    ctx = DispatchContext(
        op=op, arg_names=schema.inputs, inputs=specs, attrs={a: values.get(a) for a in schema.attrs},
        attr_names=schema.attrs, device="cuda:0", compute_capability=(9, 0), math_mode=MathMode.for_dtype("float16"),
    )  # fmt: skip
    ctx = dataclasses.replace(ctx, attrs=schema.normalize_attrs(ctx))
    return dataclasses.replace(ctx, out_shape=schema.infer_shape(ctx))


def _specs(op: str, B: int, H: int, L: int, S: int, D: int, mask: TensorSpec | None = None) -> tuple:
    q = TensorSpec((B, H, L, D), "float16", device="cuda:0")
    kv = TensorSpec((B, H, S, D), "float16", device="cuda:0")
    lse = TensorSpec((B, H, L), "float32", device="cuda:0")
    return {
        "attention": (q, kv, kv, mask),
        "attention_forward": (q, kv, kv, mask, lse),
        "attention_backward": (q, q, kv, kv, q, lse, mask),
    }[op]


OPS = ["attention", "attention_forward", "attention_backward"]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("D", [8, 16])
def test_flash_v2_has_launch_configs_for_head_dims_up_to_16(op, D) -> None:
    """BLOCK_D 16 had no row in the H100 config tables: launch_config raised KeyError((16, False))."""
    spec = default_registry().kernel(op, "flash_v2")
    for causal in (False, True):
        ctx = _context(op, _specs(op, 2, 4, 64, 64, D), is_causal=causal)
        assert spec.not_supported_reasons(ctx) == []
        params = spec.launch_config(ctx).params
        assert params["fwd"].block_m and params["bwd"].dq.block_m


@pytest.mark.parametrize("op", OPS)
def test_flash_v2_declines_more_than_65535_batch_heads(op) -> None:
    """Every flash_v2 kernel puts batch*heads on grid dimension 1 (CUDA's limit 65535): windowed attention
    with 4096 windows of 16 heads failed at launch instead of falling back."""
    spec = default_registry().kernel(op, "flash_v2")
    reasons = spec.not_supported_reasons(_context(op, _specs(op, 4096, 16, 49, 49, 32)))
    assert any("batch*heads = 65536 > 65535" in r for r in reasons), reasons
    assert spec.not_supported_reasons(_context(op, _specs(op, 4095, 16, 49, 49, 32))) == []


@pytest.mark.parametrize("op", OPS)
def test_flash_v2_declines_slices_past_int32_offsets(op) -> None:
    """The kernels compute row * row_stride in int32 within a (batch, head) slice: a 65536 x 65536 mask or a
    [B, S, H, D] view with S*H*D >= 2**31 wrapped around."""
    spec = default_registry().kernel(op, "flash_v2")
    L = 65536
    mask = TensorSpec((L, L), "bool", device="cuda:0")
    reasons = spec.not_supported_reasons(_context(op, _specs(op, 1, 2, L, L, 64, mask)))
    assert any("'attn_mask' spans" in r and "int32" in r for r in reasons), reasons
    q = TensorSpec((1, 64, 1 << 19, 128), "float16", strides=(1 << 32, 128, 64 * 128, 1), device="cuda:0")
    small = TensorSpec((1, 64, 64, 128), "float16", device="cuda:0")
    lse = TensorSpec((1, 64, 1 << 19), "float32", device="cuda:0")
    specs = {"attention": (q, small, small, None), "attention_forward": (q, small, small, None, lse)}.get(op)
    if specs is not None:
        reasons = spec.not_supported_reasons(_context(op, specs))
        assert any("'q' spans" in r for r in reasons), reasons
    assert spec.not_supported_reasons(_context(op, _specs(op, 1, 2, 4096, 4096, 64, TensorSpec((4096, 4096), "bool",
                                                                                                device="cuda:0")))) == []  # fmt: skip


@kernel_test
def test_flash_v2_forward_declines_a_negative_scale() -> None:
    """The unmasked key loop takes max(q k^T) * scale as the row max: for a scale < 0 that is the minimum and
    exp2 overflowed (NaN rows). The forward declines (the fallback is right); the backward, which reads the
    logsumexp, computes it."""
    rng = np.random.default_rng(1)
    q, k, v = _half(rng, (1, 2, 5, 24)), _half(rng, (1, 2, 19, 24)), _half(rng, (1, 2, 19, 24))
    ref = attention_reference(f64(q), f64(k), f64(v), None, False, -0.7)
    with pytest.raises(UnsupportedByPolicyError) as info, xrt.kernel_policy(strict=True, **FLASH):
        xrt.ops.attention(q, k, v, scale=-0.7)
    assert "scale -0.7 < 0" in str(info.value)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", KernelFallbackWarning)
        with xrt.kernel_policy(**FLASH):
            out = xrt.ops.attention(q, k, v, scale=-0.7)
            assert_close(out, ref, "float16", 5e-3)
            if ON_GPU:  # PyTorch's flash and cuDNN kernels decline it too (NaN): no GPU kernel is left
                with pytest.raises(NoKernelError, match=r"scale -0\.7 < 0"):
                    xrt.ops.attention_forward(q, k, v, scale=-0.7)
    lse = _device(lse_reference(f64(q), f64(k), None, False, -0.7).astype(np.float32))
    do = _half(rng, (1, 2, 5, 24))
    with xrt.kernel_policy(strict=True, attention_backward="flash_v2"):
        grads = xrt.ops.attention_backward(do, q, k, v, out, lse, scale=-0.7)
    for got, want in zip(grads, gradients_reference(f64(do), f64(q), f64(k), f64(v), None, False, -0.7)):
        assert_close(got, want, "float16", 5e-3)


@kernel_test
def test_flash_v2_masked_first_key_block_then_very_negative_scores() -> None:
    """The masked forward reset a running max of -inf to 0 after a fully masked key block, so later scores below
    about -87 (natural log) underflowed exp2: NaN instead of the softmax."""
    L, S, D = (64, 256, 64) if ON_GPU else (4, 32, 16)
    hidden = 64 if ON_GPU else 16  # the masked forward's first key block (64 on the GPU, 16 interpreted)
    rng = np.random.default_rng(2)
    q, k = _half(rng, (1, 1, L, D), 3.0), _half(rng, (1, 1, S, D), -3.0)  # scores -9 * D * scale
    v = _half(rng, (1, 1, S, D))
    m = np.ones((L, S), bool)
    m[:, :hidden] = False
    ref = attention_reference(f64(q), f64(k), f64(v), m, False, 16.0 / D)  # every score -144
    with xrt.kernel_policy(strict=True, **FLASH):
        out = xrt.ops.attention(q, k, v, _device(m), scale=16.0 / D)
    assert_close(out, ref, "float16", 5e-3)


# Hidden key blocks per pattern, in units of the masked kernels' key block (BLOCK_N: 64 on the GPU, 16
# interpreted; the backward's blocks divide it), over 5 key blocks.
HIDDEN_BLOCKS = {
    "first": [0],
    "three in a row": [0, 1, 2],
    "middle": [2],
    "first and middle": [0, 2, 3],
}


def _negative_scores(rng: np.random.Generator, L: int, S: int, D: int):
    """q near 3 and k near -3 with scale 16 / D: every score near -144 (exp2 of it with a shift of 0 underflows),
    with enough spread that the softmax and its gradients are not flat."""
    q = _device((3.0 + 0.1 * rng.standard_normal((1, 2, L, D))).astype(np.float16))
    k = _device((-3.0 + 0.1 * rng.standard_normal((1, 2, S, D))).astype(np.float16))
    v, do = (_half(rng, (1, 2, n, D)) for n in (S, L))
    return q, k, v, do, 16.0 / D


def _keep(L: int, S: int, block: int, hidden: list[int]) -> np.ndarray:
    keep = np.ones((L, S), bool)
    for j in hidden:
        keep[:, j * block : (j + 1) * block] = False
    keep[1] = False  # a row that sees no key: NaN, lse = +inf, no gradient
    keep[2, : S - 1] = False  # a row that sees only the last key
    return keep


def _check_training(q, k, v, do, keep: np.ndarray, scale: float, mask=None) -> None:
    """attention_forward and attention_backward through flash_v2 against the float64 references."""
    q64, k64, v64 = f64(q), f64(k), f64(v)
    with xrt.kernel_policy(strict=True, **FLASH):
        out, lse = xrt.ops.attention_forward(q, k, v, _device(keep) if mask is None else mask, scale=scale)
        grads = xrt.ops.attention_backward(do, q, k, v, out, lse, _device(keep) if mask is None else mask,
                                           scale=scale)  # fmt: skip
    assert_close(out, attention_reference(q64, k64, v64, keep, False, scale), "float16", 5e-3)
    want_lse = lse_reference(q64, k64, keep, False, scale)
    got_lse = f64(lse)
    assert (np.isposinf(got_lse) == np.isposinf(want_lse)).all(), got_lse
    finite = np.isfinite(want_lse)
    np.testing.assert_allclose(got_lse[finite], want_lse[finite], rtol=1e-4)
    for got, want in zip(grads, gradients_reference(f64(do), q64, k64, v64, keep, False, scale)):
        assert_close(got, want, "float16", 1e-2)


@kernel_test
@pytest.mark.parametrize("pattern", list(HIDDEN_BLOCKS))
@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_flash_v2_masked_key_blocks_then_very_negative_scores_forward_and_backward(pattern, kind) -> None:
    """Whole key blocks hidden (first, several in a row, in the middle) before scores near -144: out and lse as
    the float64 reference (NaN and +inf on the row that sees no key), and the backward, which reads that lse,
    gives the reference's gradients. The additive mask hides keys with -inf."""
    block = 64 if ON_GPU else 16
    L, S, D = (96, 5 * block, 64) if ON_GPU else (5, 5 * block, 16)
    rng = np.random.default_rng(len(pattern))
    q, k, v, do, scale = _negative_scores(rng, L, S, D)
    keep = _keep(L, S, block, HIDDEN_BLOCKS[pattern])
    mask = None
    if kind == "additive":
        bias = np.where(keep, 0.5 * rng.standard_normal((L, S)), -np.inf).astype(np.float16)
        mask = _device(bias)
        keep = bias.astype(np.float64)  # the references take the additive mask as it is
    _check_training(q, k, v, do, keep, scale, mask)


@kernel_test
def test_flash_v2_causal_bool_mask_with_a_hidden_first_block() -> None:
    """A causal mask passed as a bool mask that also hides the first key block: rows of that block see no key
    (NaN), later rows see only keys past it, every score near -144."""
    block = 64 if ON_GPU else 16
    L = S = 3 * block
    D = 64 if ON_GPU else 16
    rng = np.random.default_rng(5)
    q, k, v, do, scale = _negative_scores(rng, L, S, D)
    keep = np.tril(np.ones((L, S), bool))
    keep[:, :block] = False
    _check_training(q, k, v, do, keep, scale)


@kernel_test
def test_flash_v2_kernels_with_causal_and_a_mask_together() -> None:
    """The kernels' CAUSAL and MASK_KIND specializations together (the op passes one or the other; the kernels
    take both): a mask hiding the first two key blocks of every row under the causal structure."""
    from xpuruntime.backends.triton import flash

    block = 64 if ON_GPU else 16
    L = S = 4 * block
    D = 64 if ON_GPU else 16
    rng = np.random.default_rng(6)
    dev = "cuda" if ON_GPU else "cpu"
    q, k, v, do, scale = (torch.as_tensor(f64(t), dtype=torch.float16, device=dev) if not isinstance(t, float) else t
                          for t in _negative_scores(rng, L, S, D))  # fmt: skip
    keep = np.ones((L, S), bool)
    keep[:, : 2 * block] = False
    keep[block + 3, 2 * block :] = False  # and a row that sees no key below the diagonal either
    mask = torch.tensor(keep, device=dev).expand(1, 2, L, S)
    fwd = flash.SMALL_FWD if INTERPRET else flash.FwdConfig(64, 64, 4, 2)
    bwd = flash.SMALL_BWD if INTERPRET else flash.bwd_config(D, True)
    out = torch.full_like(q, float("nan"))
    lse = torch.empty(2 * L, dtype=torch.float32, device=dev)
    flash.forward(q, k, v, out, lse, mask, True, scale, fwd)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    flash.backward(do, q, k, v, out, lse, mask, True, scale, dq, dk, dv, bwd)
    both = keep & np.tril(np.ones((L, S), bool))
    q64, k64, v64 = f64(q), f64(k), f64(v)
    assert_close(out, attention_reference(q64, k64, v64, both, False, scale), "float16", 5e-3)
    want_lse = lse_reference(q64, k64, both, False, scale).reshape(-1)
    got_lse = f64(lse)
    assert (np.isposinf(got_lse) == np.isposinf(want_lse)).all()
    np.testing.assert_allclose(got_lse[np.isfinite(want_lse)], want_lse[np.isfinite(want_lse)], rtol=1e-4)
    for got, want in zip((dq, dk, dv), gradients_reference(f64(do), q64, k64, v64, both, False, scale)):
        assert_close(got, want, "float16", 1e-2)


@pytest.mark.skipif(not ON_GPU, reason="the compiled kernels' launch configs exist on the GPU only")
@pytest.mark.parametrize("D", [8, 16])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_flash_v2_runs_head_dims_up_to_16_forward_and_backward(D, causal) -> None:
    """Head dims up to 16 take the 32 row of the tuned tables: the kernels must compute with those tiles."""
    rng = np.random.default_rng(D)
    q, k, v, dout = (_half(rng, (2, 3, n, D)) for n in (200, 333, 333, 200))
    with xrt.kernel_policy(strict=True, **FLASH):
        out, lse = xrt.ops.attention_forward(q, k, v, is_causal=causal)
        grads = xrt.ops.attention_backward(dout, q, k, v, out, lse, is_causal=causal)
    assert_close(out, attention_reference(f64(q), f64(k), f64(v), None, causal), "float16")
    for got, want in zip(grads, gradients_reference(f64(dout), f64(q), f64(k), f64(v), None, causal)):
        assert_close(got, want, "float16", 2e-2)


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_sdpa_math_gives_nan_on_rows_that_see_no_key(kind) -> None:
    """PyTorch >= 2.5's math backend gives 0 on a fully masked row; the op (reference, flash_v2, CPU) gives NaN.
    torch_math (and torch_efficient, the same `_sdpa` path) is called directly on CPU tensors."""
    rng = np.random.default_rng(3)
    q, k, v = (torch.tensor(rng.standard_normal((2, 3, n, 8)), dtype=torch.float32) for n in (5, 7, 7))
    keep = rng.random((3, 5, 7)) > 0.3
    keep[:, :, 0] = True
    keep[1, 2] = False
    keep[0, 4] = False
    mask = torch.tensor(keep) if kind == "bool" else torch.where(torch.tensor(keep), 0.0, float("-inf"))
    attrs = {"is_causal": False, "scale": 0.4, "bounded_mask": False, "batch": (2, 3), "L": 5, "S": 7}
    launch = default_registry().kernel("attention", "torch_math").launch
    ref = attention_reference(q.double().numpy(), k.double().numpy(), v.double().numpy(), keep, False, 0.4)
    out = launch(ArgPack((q, k, v, mask), None, attrs, LaunchConfig()))
    assert_close(out.numpy(), ref, "float32", 1e-5)
    poisoned = torch.full((2, 3, 5, 8), float("nan"))
    assert launch(ArgPack((q, k, v, mask), poisoned, attrs, LaunchConfig())) is poisoned
    assert_close(poisoned.numpy(), ref, "float32", 1e-5)


def test_sdpa_math_takes_a_bounded_mask_as_it_is() -> None:
    """With bounded_mask=True (the fusion's HF mask, fill raised to mask_floor) torch_math runs SDPA on the mask as
    given, without the blind-row scan: rows whose keys all hold the floor average v, as the float64 reference
    of that mask does."""
    from xpuruntime.ops.attention import mask_floor

    rng = np.random.default_rng(5)
    q, k, v = (torch.tensor(rng.standard_normal((2, 3, n, 8)), dtype=torch.float32) for n in (5, 7, 7))
    keep = rng.random((2, 1, 5, 7)) > 0.3
    keep[..., 0] = True
    keep[1, 0, 2] = False  # a row that sees no key
    floor = mask_floor("float32")
    mask = torch.where(torch.tensor(keep), 0.0, floor)
    attrs = {"is_causal": False, "scale": 0.4, "bounded_mask": True, "batch": (2, 3), "L": 5, "S": 7}
    launch = default_registry().kernel("attention", "torch_math").launch
    ref = attention_reference(*(t.double().numpy() for t in (q, k, v)), mask.double().numpy(), False, 0.4)
    np.testing.assert_allclose(ref[1, :, 2], v[1].double().numpy().mean(axis=1), rtol=1e-12)
    out = launch(ArgPack((q, k, v, mask), None, attrs, LaunchConfig()))
    assert_close(out.numpy(), ref, "float32", 1e-5)


@pytest.mark.skipif(not ON_GPU, reason="PyTorch's CUDA SDPA backends")
@pytest.mark.parametrize("kernel_name", ["torch_math", "torch_efficient"])
def test_cuda_sdpa_backends_give_nan_on_rows_that_see_no_key(kernel_name) -> None:
    """On the H100 both give 0 there natively (PyTorch >= 2.5); the op, like flash_v2, gives NaN."""
    rng = np.random.default_rng(4)
    q, k, v = (_half(rng, (2, 3, n, 64)) for n in (5, 7, 7))
    keep = rng.random((2, 3, 5, 7)) > 0.3
    keep[..., 0] = True
    keep[1, 2, 3] = False
    with xrt.kernel_policy(strict=True, attention=kernel_name):
        out = xrt.ops.attention(q, k, v, _device(keep))
    assert_close(out, attention_reference(f64(q), f64(k), f64(v), keep), "float16")


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("kernel_name", ["torch_flash", "torch_cudnn"])
def test_pytorch_fused_kernels_decline_a_negative_scale(op, kernel_name) -> None:
    """PyTorch's flash and cuDNN SDPA kernels return NaN for a scale < 0 (H100, PyTorch 2.11): they decline."""
    spec = default_registry().kernel(op, kernel_name)
    reasons = spec.not_supported_reasons(_context(op, _specs(op, 1, 2, 64, 64, 64), scale=-0.7))
    assert any("scale -0.7 < 0" in r for r in reasons), reasons
    assert spec.not_supported_reasons(_context(op, _specs(op, 1, 2, 64, 64, 64), scale=0.7)) == []


@pytest.mark.parametrize("op", ["attention", "attention_forward", "attention_backward"])
def test_torch_flash_declines_causal_with_l_not_s(op: str) -> None:
    """PyTorch's flash kernel aligns causal masks bottom-right when L != S; the ops align them top-left."""
    registry = default_registry()
    schema = registry.op(op)
    q, kv = (
        TensorSpec((2, 4, 64, 64), "float16", device="cuda:0"),
        TensorSpec((2, 4, 128, 64), "float16", device="cuda:0"),
    )
    lse = TensorSpec((2, 4, 64), "float32", device="cuda:0")
    specs = {
        "attention": (q, kv, kv, None),
        "attention_forward": (q, kv, kv, None, lse),
        "attention_backward": (q, q, kv, kv, q, lse, None),
    }[op]
    attrs = {**schema.defaults, "is_causal": True}
    ctx = DispatchContext(
        op=op, arg_names=schema.inputs, inputs=specs, attrs={a: attrs.get(a) for a in schema.attrs},
        attr_names=schema.attrs, device="cuda:0", compute_capability=(9, 0), math_mode=MathMode.for_dtype("float16"),
    )  # fmt: skip
    ctx = dataclasses.replace(ctx, attrs=schema.normalize_attrs(ctx))
    reasons = registry.kernel(op, "torch_flash").not_supported_reasons(ctx)
    assert any("bottom-right" in r for r in reasons), reasons
    square = dataclasses.replace(ctx, attrs={**ctx.attrs, "S": ctx.attrs["L"]})
    assert registry.kernel(op, "torch_flash").not_supported_reasons(square) == []


@pytest.mark.skipif(not ON_GPU, reason="the TMA descriptors of flash_v2 exist on the GPU only")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_flash_v2_keys_and_values_broadcast_over_the_batch(causal):
    """k and v expanded over the batch (stride 0): the kernel computes them right or declines, never wrong."""
    from xpuruntime.ops.attention import reference as attention_reference

    rng = np.random.default_rng(5)
    q = make(rng, (3, 4, 256, 64), "bfloat16")
    k, v = (make(rng, (1, 4, 256, 64), "bfloat16").expand(3, -1, -1, -1) for _ in range(2))
    with xrt.kernel_policy(attention="flash_v2", strict=True):
        out = xrt.ops.attention(q, k, v, is_causal=causal)
    assert_close(out, attention_reference(f64(q), f64(k), f64(v), is_causal=causal), "bfloat16")


@kernel_test
def test_flash_v2_attention_with_grouped_query_heads() -> None:
    """The `attention` op's enable_gqa on flash_v2: k and v keep their own heads (the kernel's H // Hk), an
    additive mask, against the float64 reference."""
    rng = np.random.default_rng(11)
    q = _half(rng, (2, 4, 33, 16))
    k, v = _half(rng, (2, 2, 40, 16)), _half(rng, (2, 2, 40, 16))
    mask = np.where(rng.random((2, 1, 33, 40)) > 0.2, 0.0, -1e4).astype(np.float16)
    with xrt.kernel_policy(strict=True, attention="flash_v2"):
        got = xrt.ops.attention(q, k, v, _device(mask), enable_gqa=True)
    want = attention_reference(f64(q), f64(k), f64(v), f64(mask), enable_gqa=True)
    assert_close(got, want, "float16")
