"""PyTorch's fused SDPA backends (torch_flash, torch_cudnn) as kernels of the training ops attention_forward
and attention_backward (PyTorch's efficient backend is deliberately not one: wrong gradients, never fastest).

On any machine: the kernels are registered (cuDNN above flash_v2 above torch_flash), declare why they cannot
run (explain; L = S = 1 included), and call the aten ops with arguments this PyTorch accepts (their meta
kernels). On a CUDA machine (tests marked gpu): each kernel's forward and backward against the float64
references, mixed forward/backward pairs with flash_v2, causal with L != S, odd lengths, GQA, masks and
L = S = 1 declined, [B, S, H, D] views, poisoned outputs, the backwards' own (dq, dk, dv) without out=,
and auto / autotune selection.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import xpuruntime as xrt  # noqa: E402
from xpuruntime.abi import TensorSpec  # noqa: E402
from xpuruntime.context import build_context  # noqa: E402
from xpuruntime.dispatch import run as dispatch_run  # noqa: E402
from xpuruntime.ops.attention_backward import gradients_reference  # noqa: E402
from xpuruntime.ops.attention_forward import lse_reference  # noqa: E402
from xpuruntime.ops.attention_forward import reference as forward_reference  # noqa: E402
from xpuruntime.policy import KernelPolicy  # noqa: E402
from xpuruntime.registry import default_registry  # noqa: E402

ON_GPU = torch.cuda.is_available()
TORCH_KERNELS = ("torch_flash", "torch_cudnn")
OPS = ("attention_forward", "attention_backward")
TOL = {"float16": 5e-3, "bfloat16": 2e-2, "float32": 1e-3}
DTYPES = ["bfloat16", "float16"]
needs_gpu = pytest.mark.skipif(not ON_GPU, reason="PyTorch's fused SDPA kernels need a CUDA device")


def f64(x):
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.float64).numpy()
    return np.asarray(x, np.float64)


def assert_close(out, ref, tol: float) -> None:
    """max |out - ref| / max |ref| <= tol over finite reference entries; NaN / inf exactly where ref has them."""
    got, ref = f64(out), np.asarray(ref, np.float64)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert np.array_equal(np.isnan(got), np.isnan(ref)), f"NaN at {np.argwhere(np.isnan(got) != np.isnan(ref))[:5]}"
    assert np.array_equal(np.isposinf(got), np.isposinf(ref)), "+inf differs"
    finite = np.isfinite(ref)
    if not finite.any():
        return
    scale = max(float(np.abs(ref[finite]).max()), 1e-30)
    err = float(np.abs(got[finite] - ref[finite]).max()) / scale
    assert err <= tol, f"relative error {err:.3e} > {tol:.1e}"


# ---------------------------------------------------------------------------------------------- any machine


def test_module_imports_without_cuda() -> None:
    code = (
        "import xpuruntime.backends.torch.attention_training as m, xpuruntime as xrt;"
        "from xpuruntime.registry import default_registry as r;"
        "names = {k.name for k in r().kernels_for('attention_backward')};"
        "assert {'torch_flash', 'torch_cudnn'} <= names and 'torch_efficient' not in names, names"
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("op", OPS)
def test_kernels_are_registered_with_their_hints(op) -> None:
    table = {k.name: k for k in default_registry().kernels_for(op)}
    for name in TORCH_KERNELS:
        assert table[name].backend == "torch" and table[name].fused and table[name].tensor_cores
        assert table[name].deterministic is (op == "attention_forward")  # the fused backwards use atomics
        assert table[name].returns_output  # aten's own out, and dq, dk, dv: no allocation, no packing
    assert not table["flash_v2"].returns_output  # writes into the dispatcher's (packed) output directly
    # auto ranks by measured forward+backward on an H100: cuDNN, then flash_v2, then PyTorch's flash
    assert table["torch_cudnn"].priority > table["flash_v2"].priority > table["torch_flash"].priority
    assert "torch_efficient" not in table  # wrong gradients on the H100 and never the fastest
    assert table["torch_cudnn"].dtypes == table["torch_flash"].dtypes == frozenset({"float16", "bfloat16"})


def test_explain_on_cpu_tensors_says_why() -> None:
    q = torch.randn(1, 2, 8, 16)
    lse = torch.empty(1, 2, 8)
    explanation = xrt.explain("attention_forward", q, q, q, None, lse, show=False)
    assert explanation.selected == "math"
    verdicts = {c.kernel.name: " ".join(c.reasons) for c in explanation.candidates}
    for name in TORCH_KERNELS:
        assert "cuda" in verdicts[name].lower(), verdicts[name]  # "no CUDA device" / "runs on cuda"
    out, do = torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16)
    explanation = xrt.explain("attention_backward", do, q, q, q, out, lse, show=False)
    assert explanation.selected == "math"
    assert all("cuda" in " ".join(c.reasons).lower() for c in explanation.candidates if c.kernel.name in TORCH_KERNELS)


def _spec(shape, dtype="bfloat16", strides=None):
    return TensorSpec(tuple(shape), dtype, strides=strides, device="cuda:0")


def _reasons(op: str, *, B=2, H=8, Hk=8, L=256, S=256, D=128, Dv=None, causal=False, mask=None, dtype="bfloat16",
             cc=(9, 0), q_strides=None) -> dict[str, list[str]]:  # fmt: skip
    """Each torch kernel's reasons for a call described by shapes on a (pretend) CUDA device of arch `cc`."""
    Dv = D if Dv is None else Dv
    q, k, v = _spec((B, H, L, D), dtype, q_strides), _spec((B, Hk, S, D), dtype), _spec((B, Hk, S, Dv), dtype)
    m = None if mask is None else _spec(mask, "bool")
    lse = _spec((B, H, L), "float32")
    if op == "attention_forward":
        inputs = (q, k, v, m, lse)
    else:
        inputs = (_spec((B, H, L, Dv), dtype), q, k, v, _spec((B, H, L, Dv), dtype), lse, m)
    schema = default_registry().op(op)
    ctx = build_context(schema, inputs, (causal, None, Hk != H), None, KernelPolicy())
    ctx = dataclasses.replace(ctx, compute_capability=cc)
    return {name: default_registry().kernel(op, name).not_supported_reasons(ctx) for name in TORCH_KERNELS}


@pytest.mark.parametrize("op", OPS)
def test_conditions_say_why_a_backend_cannot_run(op) -> None:
    assert _reasons(op) == {name: [] for name in TORCH_KERNELS}  # bf16 [B, H, S, D] D128 on sm90: all run
    gqa = _reasons(op, Hk=2)
    assert not gqa["torch_flash"] and not gqa["torch_cudnn"]  # both take fewer key/value heads natively
    masked = _reasons(op, mask=(256, 256))
    assert any("attn_mask" in r for r in masked["torch_flash"]) and any("attn_mask" in r for r in masked["torch_cudnn"])
    skewed = _reasons(op, L=200, S=333, causal=True)
    assert any("bottom-right" in r for r in skewed["torch_flash"])
    assert any("L=200 != S=333" in r for r in skewed["torch_cudnn"])
    single = _reasons(op, L=1, S=1, D=64)
    assert all(any("L = S = 1" in r for r in single[name]) for name in TORCH_KERNELS), single
    assert _reasons(op, L=1, S=77, D=64) == {name: [] for name in TORCH_KERNELS}  # only both 1 is declined
    wide = _reasons(op, D=256)
    assert not wide["torch_flash"] and any("head dim 256" in r for r in wide["torch_cudnn"])
    odd = _reasons(op, D=100)
    assert all(any("multiple of 8" in r for r in odd[name]) for name in TORCH_KERNELS)
    fp32 = _reasons(op, dtype="float32")
    assert all(any("dtype float32" in r for r in fp32[name]) for name in TORCH_KERNELS)
    old = _reasons(op, cc=(7, 5))
    assert any("sm80" in r for r in old["torch_flash"]) and any("sm80" in r for r in old["torch_cudnn"])
    strided = _reasons(op, q_strides=(256 * 8 * 256, 256 * 256, 256, 2), D=128)
    assert all(any("last-dim stride 2" in r for r in strided[name]) for name in TORCH_KERNELS)


def test_aten_calls_match_this_pytorch() -> None:
    """The calls the kernels make, on meta tensors: argument order and the logsumexp layouts converted."""
    from xpuruntime.backends.torch import attention as A
    from xpuruntime.backends.torch import attention_training as T

    def meta(*shape):
        return torch.empty(*shape, dtype=torch.bfloat16, device="meta")

    q, k, kg = meta(2, 4, 37, 64), meta(2, 4, 50, 64), meta(2, 2, 50, 64)
    out, lse = A.flash_forward(q, k, k, False, 0.125)
    assert out.shape == (2, 4, 37, 64) and lse.shape == (2, 4, 37) and lse.dtype == torch.float32
    assert [tuple(g.shape) for g in T.flash_backward(out, q, kg, kg, out, lse, True, 0.125)] == [
        (2, 4, 37, 64), (2, 2, 50, 64), (2, 2, 50, 64)]  # fmt: skip
    out, stats = A.cudnn_forward(q, k, k, False, 0.125)
    assert A.cudnn_forward(q, k, k, True, None, lse=False)[0].shape == (2, 4, 37, 64)
    assert stats.numel() == 2 * 4 * 37 and stats.dim() == T._cudnn_stats_rank()
    assert [tuple(g.shape) for g in T.cudnn_backward(out, q, k, k, out, lse, False, 0.125)][1] == (2, 4, 50, 64)
    assert not hasattr(T, "efficient_backward")


def test_layout_matching_keeps_dense_tensors_and_copies_others() -> None:
    from xpuruntime.backends.torch import attention_training as T

    q = torch.randn(2, 5, 3, 8).transpose(1, 2)  # [B, S, H, D] viewed as [B, H, S, D]
    same = torch.empty(2, 5, 3, 8).transpose(1, 2)
    assert T._in_layout_of(same, q) is same
    contiguous = torch.randn(2, 3, 5, 8)
    moved = T._in_layout_of(contiguous, q)
    assert moved.stride() == same.stride() and torch.equal(moved, contiguous)


@pytest.mark.parametrize("dims", [4, 3])
def test_backward_returns_the_aten_tensors_without_out_and_packs_into_out(dims) -> None:
    """The torch backwards' glue, with a stand-in for the aten call: no out= -> its three tensors themselves
    (viewed in q/k/v's shapes when those have fewer dims); out= -> packed into it."""
    from xpuruntime.abi import ArgPack, LaunchConfig
    from xpuruntime.backends.torch import attention_training as T

    shape = (2, 3, 4, 8)[4 - dims :]
    q, k, v, do, o = (torch.randn(shape) for _ in range(5))
    lse = torch.randn(shape[:-1])
    made: list = []

    def backward(do4, q4, k4, v4, o4, lse3, causal, scale):
        assert q4.dim() == 4 and lse3.shape == q4.shape[:3] and causal and scale == 0.5
        made[:] = [q4 * 2, k4 * 3, v4 * 4]
        return tuple(made)

    attrs = {"is_causal": True, "scale": 0.5, "sizes": (q.numel(), k.numel(), v.numel())}
    grads = T._run_backward(ArgPack((do, q, k, v, o, lse, None), None, attrs, LaunchConfig()), backward)
    assert all(g.shape == shape and g.data_ptr() == m.data_ptr() for g, m in zip(grads, made))
    packed = torch.full((3 * q.numel(),), float("nan"))
    assert T._run_backward(ArgPack((do, q, k, v, o, lse, None), packed, attrs, LaunchConfig()), backward) is None
    assert torch.equal(packed, torch.cat([q.reshape(-1) * 2, k.reshape(-1) * 3, v.reshape(-1) * 4]))


# ---------------------------------------------------------------------------------------------- on a GPU


def _tensor(shape, dtype: str, bshd: bool = False, gen=None):
    if bshd:
        b, h, s, d = shape
        return torch.randn(b, s, h, d, dtype=torch.float32, device="cuda", generator=gen).to(
            getattr(torch, dtype)).transpose(1, 2)  # fmt: skip
    return torch.randn(*shape, dtype=torch.float32, device="cuda", generator=gen).to(getattr(torch, dtype))


def _mask(kind: str | None, L: int, S: int, dtype: str):
    if kind is None:
        return None
    if kind == "bool":
        m = torch.rand(L, S, device="cuda") > 0.3
        m[:, 0] = True
        return m
    return torch.randn(1, 1, L, S, device="cuda").to(getattr(torch, dtype))


def _mask64(mask):
    if mask is None:
        return None
    return mask.cpu().numpy() if mask.dtype == torch.bool else f64(mask)


# B, H, Hk, L, S, D, causal, mask kind, [B, S, H, D] views
CASES = [
    (2, 4, 4, 300, 300, 64, False, None, True),
    (2, 4, 4, 257, 257, 128, True, None, False),
    (2, 4, 4, 200, 333, 64, True, None, False),
    (2, 4, 4, 333, 200, 128, True, None, True),
    (2, 8, 2, 256, 256, 128, False, None, True),
    (2, 8, 2, 129, 129, 64, True, None, False),
    (1, 2, 2, 100, 177, 64, False, "bool", False),
    (1, 2, 2, 100, 177, 64, False, "add", True),
    (1, 2, 2, 64, 96, 256, False, None, False),
    (2, 4, 4, 1, 1, 64, False, None, False),
]


def _declines(name: str, case) -> bool:
    """Whether `name` is expected to decline the case (the conditions tested above, on an H100)."""
    _, _, _, L, S, D, causal, mask, _ = case
    common = mask is not None or (causal and L != S) or L == S == 1
    if name == "torch_flash":
        return common
    return common or D > 128  # torch_cudnn


def _inputs(case, dtype):
    B, H, Hk, L, S, D, causal, mk, bshd = case
    q = _tensor((B, H, L, D), dtype, bshd)
    k = _tensor((B, Hk, S, D), dtype, bshd)
    v = _tensor((B, Hk, S, D), dtype)
    return q, k, v, _mask(mk, L, S, dtype), causal, Hk != H


def _check_pair(fwd: str, bwd: str, q, k, v, mask, causal: bool, gqa: bool, dtype: str) -> None:
    q64, k64, v64, m64 = f64(q), f64(k), f64(v), _mask64(mask)
    out = torch.full(q.shape[:-1] + v.shape[-1:], float("nan"), dtype=q.dtype, device="cuda")  # poisoned
    with xrt.kernel_policy(strict=True, attention_forward=fwd, attention_backward=bwd):
        result, lse = xrt.ops.attention_forward(q, k, v, mask, causal, None, gqa, out=out)
        assert result is out
        assert_close(out, forward_reference(q64, k64, v64, m64, None, causal, None, gqa), TOL[dtype])
        assert_close(lse, lse_reference(q64, k64, m64, causal, None, gqa), 1e-3)
        do = _tensor(tuple(out.shape), dtype)
        total = q.numel() + k.numel() + v.numel()
        packed = torch.full((total,), float("nan"), dtype=q.dtype, device="cuda")  # poisoned
        grads = xrt.ops.attention_backward(do, q, k, v, out, lse, mask, causal, None, gqa, grads_out=packed)
        assert grads[0].data_ptr() == packed.data_ptr()  # written into the caller's buffer
        want = gradients_reference(f64(do), q64, k64, v64, m64, causal, None, gqa)
        for name, got, ref in zip("qkv", grads, want):
            assert not torch.isnan(got).any(), f"d{name} has NaN"
            assert_close(got, ref, TOL[dtype])
        # without grads_out the torch kernels (returns_output) give aten's own three tensors, nothing packed
        raw = dispatch_run("attention_backward", (do, q, k, v, out, lse, mask), (causal, None, gqa))
        assert isinstance(raw, tuple) is (bwd in TORCH_KERNELS), type(raw)
        if bwd in TORCH_KERNELS:
            assert len({g.untyped_storage().data_ptr() for g in raw}) == 3
        fresh = xrt.ops.attention_backward(do, q, k, v, out, lse, mask, causal, None, gqa)
        for name, got, ref in zip("qkv", fresh, want):
            assert not torch.isnan(got).any(), f"d{name} has NaN"
            assert_close(got, ref, TOL[dtype])
        # without out=, the same (the torch kernels return aten's own output)
        out2, lse2 = xrt.ops.attention_forward(q, k, v, mask, causal, None, gqa)
        assert_close(out2, forward_reference(q64, k64, v64, m64, None, causal, None, gqa), TOL[dtype])
        assert_close(lse2, lse_reference(q64, k64, m64, causal, None, gqa), 1e-3)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}H{}Hk{}L{}S{}D{}{}{}{}".format(
    *c[:6], "c" if c[6] else "", c[7] or "", "bshd" if c[8] else ""))  # fmt: skip
@pytest.mark.parametrize("name", TORCH_KERNELS)
def test_forward_and_backward_match_reference(name, case, dtype) -> None:
    torch.manual_seed(0)
    q, k, v, mask, causal, gqa = _inputs(case, dtype)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device="cuda")
    explanation = xrt.explain("attention_forward", q, k, v, mask, lse, show=False, is_causal=causal, enable_gqa=gqa)
    verdict = next(c for c in explanation.candidates if c.kernel.name == name)
    if _declines(name, case):
        assert not verdict.supported
        pytest.skip(f"{name} declines: {'; '.join(verdict.reasons)}")
    assert verdict.supported, verdict.reasons
    _check_pair(name, name, q, k, v, mask, causal, gqa, dtype)


PAIRS = [
    ("flash_v2", "torch_cudnn"), ("torch_cudnn", "flash_v2"), ("flash_v2", "torch_flash"), ("torch_flash", "flash_v2"),
    ("torch_cudnn", "torch_flash"), ("torch_flash", "torch_cudnn"),
]  # fmt: skip


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pair", PAIRS, ids="->".join)
def test_mixed_forward_backward_pairs(pair, causal, dtype) -> None:
    torch.manual_seed(1)
    q, k, v, mask, _, gqa = _inputs((2, 4, 4, 321, 321, 128, causal, None, True), dtype)
    _check_pair(*pair, q, k, v, mask, causal, gqa, dtype)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("pair", [("torch_flash", "flash_v2"), ("flash_v2", "torch_flash"), ("torch_flash", "torch_flash"),
                                  ("torch_cudnn", "torch_cudnn"), ("torch_cudnn", "flash_v2"), ("flash_v2", "torch_cudnn"),
                                  ("torch_cudnn", "torch_flash")], ids="->".join)  # fmt: skip
def test_gqa_pairs(pair) -> None:
    torch.manual_seed(2)
    q, k, v, mask, causal, gqa = _inputs((2, 8, 2, 300, 300, 64, True, None, True), "bfloat16")
    _check_pair(*pair, q, k, v, mask, causal, gqa, "bfloat16")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_single_query_and_key_is_declined(dtype) -> None:
    """L = S = 1: both torch kernels decline (cuDNN: "s_q = s_kv = 1 is not supported"); the forward of
    whatever auto picks instead still matches the reference."""
    torch.manual_seed(3)
    q, k, v, *_ = _inputs((2, 4, 4, 1, 1, 64, False, None, False), dtype)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device="cuda")
    for op, args in (("attention_forward", (q, k, v, None, lse)), ("attention_backward", (q, q, k, v, q, lse, None))):
        explanation = xrt.explain(op, *args, show=False)
        verdicts = {c.kernel.name: c for c in explanation.candidates}
        for name in TORCH_KERNELS:
            assert not verdicts[name].supported and any("L = S = 1" in r for r in verdicts[name].reasons)
        assert explanation.selected not in TORCH_KERNELS
    out, _ = xrt.ops.attention_forward(q, k, v)
    assert_close(out, forward_reference(f64(q), f64(k), f64(v)), TOL[dtype])


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_single_query_and_key_gradients_under_auto(dtype) -> None:
    """One key: the softmax is constantly 1, so dq = dk = 0 exactly in float64 and only the rounding of
    out (= v) in fp16/bf16 is left in dp - delta. dq and dk are checked in absolute terms against the size
    of the terms they sum (|do| |v| |k| D scale), dv relative to its reference."""
    torch.manual_seed(3)
    q, k, v, *_ = _inputs((2, 4, 4, 1, 1, 64, False, None, False), dtype)
    q64, k64, v64 = f64(q), f64(k), f64(v)
    out, lse = xrt.ops.attention_forward(q, k, v)
    do = _tensor(tuple(out.shape), dtype)
    (dq, dk, dv), (_, _, ref_dv) = (
        xrt.ops.attention_backward(do, q, k, v, out, lse),
        gradients_reference(f64(do), q64, k64, v64),
    )
    assert_close(dv, ref_dv, TOL[dtype])
    terms = np.abs(f64(do)).max() * np.abs(v64).max() * max(np.abs(q64).max(), np.abs(k64).max()) * 64 / 8
    for grad in (dq, dk):
        assert np.isfinite(f64(grad)).all() and np.abs(f64(grad)).max() <= TOL[dtype] * terms


@pytest.mark.gpu
@needs_gpu
def test_auto_picks_cudnn_where_it_can_run() -> None:
    q = _tensor((2, 8, 256, 128), "bfloat16", bshd=True)
    lse = torch.empty(2, 8, 256, device="cuda")
    cc = torch.cuda.get_device_capability()
    if cc < (8, 0):
        pytest.skip("the fused kernels need sm80+")
    assert xrt.explain("attention_forward", q, q, q, None, lse, show=False).selected == "torch_cudnn"
    assert xrt.explain("attention_backward", q, q, q, q, q, lse, show=False).selected == "torch_cudnn"
    kv = _tensor((2, 2, 256, 128), "bfloat16")
    # GQA: cuDNN takes fewer key/value heads too (PyTorch's default backend there)
    assert xrt.explain("attention_forward", q, kv, kv, None, lse, show=False, enable_gqa=True).selected == "torch_cudnn"
    assert (
        xrt.explain("attention_backward", q, q, kv, kv, q, lse, show=False, enable_gqa=True).selected == "torch_cudnn"
    )
    mask = torch.ones(256, 256, dtype=torch.bool, device="cuda")
    assert xrt.explain("attention_forward", q, q, q, mask, lse, show=False).selected == "flash_v2"
    deterministic = xrt.KernelPolicy(deterministic=True)
    assert (
        xrt.explain("attention_backward", q, q, q, q, q, lse, show=False, policy=deterministic).selected == "flash_v2"
    )


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("causal", [False, True])
def test_autotune_picks_a_working_pair(causal) -> None:
    torch.manual_seed(5)
    q, k, v, _, _, _ = _inputs((2, 4, 4, 512, 512, 128, causal, None, True), "bfloat16")
    q64, k64, v64 = f64(q), f64(k), f64(v)
    with xrt.kernel_policy(attention_forward="autotune", attention_backward="autotune"):
        for _ in range(2):  # tuned on the first call, cached after
            out, lse = xrt.ops.attention_forward(q, k, v, None, causal)
            do = _tensor(tuple(out.shape), "bfloat16")
            grads = xrt.ops.attention_backward(do, q, k, v, out, lse, None, causal)
            assert_close(out, forward_reference(q64, k64, v64, None, None, causal), TOL["bfloat16"])
            for got, ref in zip(grads, gradients_reference(f64(do), q64, k64, v64, None, causal)):
                assert_close(got, ref, TOL["bfloat16"])
