"""Edge cases of the GPU backends: 32-bit offset overflow in Triton kernels, a strided out=
the norm backward's finishing pass wrote wrongly, and two torch-backend kernels that computed wrong results
for calls their conditions accepted.

Offsets past 2**31 are reached without 4 GiB of data: a tiny view with one huge stride over an
uninitialized buffer (the OS backs only the pages touched). Triton kernels run on the GPU when there is
one, else this module reruns itself under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from triton_harness import (
    INTERPRET,
    ON_GPU,
    TORCH_DTYPES,
    assert_close,
    f64,
    kernel_test,
    make,
    poisoned,
    rerun_under_interpreter,
    strict,
    torch,
)  # fmt: skip

import xpuruntime as xrt
from xpuruntime.abi import ArgPack, LaunchConfig, MathMode, TensorSpec
from xpuruntime.context import DispatchContext, build_context
from xpuruntime.ops.matmul import reference as matmul_reference
from xpuruntime.ops.norm import layer_norm_reference
from xpuruntime.ops.norm_backward import layer_norm_backward_reference, rms_norm_backward_reference
from xpuruntime.ops.reduction import reference as sum_reference
from xpuruntime.ops.softmax import reference as softmax_reference
from xpuruntime.policy import KernelPolicy
from xpuruntime.registry import default_registry

HUGE = 2**30 + 16  # a stride that fits in 32 bits; twice it does not


if not (INTERPRET or ON_GPU):  # CPU-only machines (CI): run this module again under the interpreter

    def test_kernels_under_interpreter() -> None:
        rerun_under_interpreter(__file__)


def huge_view(shape: tuple[int, ...], strides: tuple[int, ...], dtype: str, values: np.ndarray | None) -> object:
    """A (tiny) view with huge strides (in elements) over a buffer reaching past 2**31 elements, set to
    `values` (NaN when None)."""
    reach = sum((n - 1) * s for n, s in zip(shape, strides)) + 1
    fill = np.full(shape, np.nan) if values is None else values
    try:
        if ON_GPU:
            view = torch.empty(reach, dtype=TORCH_DTYPES[dtype], device="cuda").as_strided(shape, strides)
            view.copy_(torch.as_tensor(fill, dtype=TORCH_DTYPES[dtype]))
            return view
        buffer = np.empty(reach, np.dtype(dtype))
    except (MemoryError, RuntimeError):
        pytest.skip(f"cannot reserve {reach} elements of address space")
    itemsize = np.dtype(dtype).itemsize
    view = np.lib.stride_tricks.as_strided(buffer, shape, tuple(s * itemsize for s in strides))
    view[...] = fill
    return view


def random(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.standard_normal(shape) + 0.5


# -- offsets past 2**31 ------------------------------------------------------------------------------


@kernel_test
@pytest.mark.parametrize("where", ["x", "out"])
def test_softmax_one_pass_offsets_past_2_31(rng, where: str) -> None:
    """Softmax along an axis with a huge stride: one-pass rows indexed r * stride in 32 bits wrapped."""
    data = random(rng, (3, 5))
    ref = softmax_reference(data, 0)
    x = huge_view((3, 5), (HUGE, 1), "float16", data) if where == "x" else make(rng, (3, 5), "float16")
    if where == "out":
        x[...] = torch.as_tensor(data) if ON_GPU else data
    out = huge_view((3, 5), (HUGE, 1), "float16", None) if where == "out" else poisoned((3, 5), "float16")
    with strict(softmax="triton"):
        xrt.ops.softmax(x, 0, out=out)
    assert_close(out, ref, "float16")


@kernel_test
@pytest.mark.parametrize("where", ["a", "b", "out"])
def test_matmul_offsets_past_2_31(rng, where: str) -> None:
    """a with a huge row stride, b with a huge column stride, out with a huge column stride."""
    a_data, b_data = random(rng, (3, 16)), random(rng, (16, 3))
    a = huge_view((3, 16), (HUGE, 1), "float16", a_data) if where == "a" else make(rng, (3, 16), "float16")
    b = huge_view((16, 3), (1, HUGE), "float16", b_data) if where == "b" else make(rng, (16, 3), "float16")
    if where != "a":
        a[...] = torch.as_tensor(a_data) if ON_GPU else a_data
    if where != "b":
        b[...] = torch.as_tensor(b_data) if ON_GPU else b_data
    out = huge_view((3, 3), (1, HUGE), "float16", None) if where == "out" else poisoned((3, 3), "float16")
    with strict(matmul="triton"):
        xrt.ops.matmul(a, b, out=out)
    assert_close(out, matmul_reference(f64(a), f64(b)), "float16")


@kernel_test
@pytest.mark.parametrize(
    ("kernel_name", "where"), [("triton_gemv", "v"), ("triton_gemv_t", "v"), ("triton_gemv", "out")]
)
def test_gemv_offsets_past_2_31(rng, kernel_name: str, where: str) -> None:
    """The vector (a column of a wide matrix) or the output with a huge stride."""
    w = make(rng, (3, 5), "float16", shift=0.5)
    v = huge_view((5,), (HUGE,), "float16", random(rng, (5,))) if where == "v" else make(rng, (5,), "float16")
    args = (w, v) if kernel_name == "triton_gemv" else (v, w.T)
    ref = matmul_reference(*(f64(t) for t in args))
    out = huge_view((3,), (HUGE,), "float16", None) if where == "out" else poisoned((3,), "float16")
    with strict(matmul=kernel_name):
        xrt.ops.matmul(*args, out=out)
    assert_close(out, ref, "float16")


@kernel_test
def test_sum_output_offsets_past_2_31(rng) -> None:
    x = make(rng, (3, 4), "float32", shift=0.5)
    out = huge_view((4,), (HUGE,), "float32", None)
    with strict(sum="triton"):
        xrt.ops.sum(x, 0, False, out=out)
    assert_close(out, sum_reference(f64(x), 0, False), "float32")


@kernel_test
def test_norm_offsets_past_2_31(rng) -> None:
    """Rows whose normalized dim has a huge stride (a transposed view): cols * stride wrapped."""
    data, dy = random(rng, (2, 3)), make(rng, (2, 3), "float32")
    x = huge_view((2, 3), (1, HUGE), "float32", data)
    w, b = make(rng, (3,), "float32"), make(rng, (3,), "float32")
    out = poisoned((2, 3), "float32")
    packed = poisoned((3, 3), "float32")
    with strict(layer_norm="triton", rms_norm_backward="triton"):
        xrt.ops.layer_norm(x, (3,), w, b, out=out)
        xrt.ops.rms_norm_backward(dy, x, (3,), w, 1e-6, out=packed)
    assert_close(out, layer_norm_reference(data, (3,), f64(w), f64(b)), "float32")
    assert_close(packed, rms_norm_backward_reference(f64(dy), data, (3,), f64(w), 1e-6), "float32")


# -- norm backward into a strided out= ----------------------------------------------------------------


@kernel_test
@pytest.mark.parametrize("op", ["layer_norm_backward", "rms_norm_backward"])
def test_norm_backward_into_a_column_of_a_wider_buffer(rng, op: str) -> None:
    """normalized_shape (1,): the packed (M + k, 1) output as a column of a wider array. dweight/dbias went
    to the column stride instead of the row stride (outside the view; dbias left unwritten)."""
    m = 5
    x, dy, w = make(rng, (m, 1), "float32", shift=0.5), make(rng, (m, 1), "float32"), make(rng, (1,), "float32")
    reference = layer_norm_backward_reference if op == "layer_norm_backward" else rms_norm_backward_reference
    ref = reference(f64(dy), f64(x), (1,), f64(w), 1e-5)
    wide = poisoned((ref.shape[0], 7), "float32")
    with strict(**{op: "triton"}):
        getattr(xrt.ops, op)(dy, x, (1,), w, 1e-5, out=wide[:, 3:4])
    assert_close(wide[:, 3:4], ref, "float32", tol=1e-4)  # dx is 0 up to x - mean's rounding times rstd ~ 316
    others = f64(wide)[:, [0, 1, 2, 4, 5, 6]]
    assert np.isnan(others).all(), "wrote outside the out= view"


# -- fused programs whose constants differ only in a zero's sign ---------------------------------------


@kernel_test
def test_triton_fused_programs_differing_in_a_zero_constants_sign(rng) -> None:
    """-0.0 == 0.0 as dict keys: x / -0.0 after x / 0.0 reused the first program's kernel (+inf, not -inf)."""
    x = make(rng, (6,), "float32", shift=3.0)
    for zero in (0.0, -0.0):
        with strict(fused_elementwise="triton"):
            got = xrt.ops.fused_elementwise((("div", ("in", 0), ("c", zero)),), x)
        with np.errstate(divide="ignore"):
            np.testing.assert_array_equal(f64(got), (f64(x) / zero).astype(np.float32))


# -- torch backend (its launch functions run on CPU tensors) ------------------------------------------


def test_torch_linear_grad_input_with_a_vector_dy_writes_a_strided_out() -> None:
    """torch.matmul(vector, matrix, out=) resizes `out` (its strides too) instead of writing it."""
    registry = default_registry()
    dy, weight = torch.randn(3, dtype=torch.float64), torch.randn(3, 7, dtype=torch.float64)
    ctx = build_context(registry.op("linear_grad_input"), (dy, weight, None), (None,), None, KernelPolicy())
    ctx = dataclasses.replace(ctx, device="cuda:0")
    wide = torch.full((14,), float("nan"), dtype=torch.float64)
    out = wide[::2]
    registry.kernel("linear_grad_input", "torch").launch(
        ArgPack((dy, weight, None), out, dict(ctx.attrs), LaunchConfig())
    )
    np.testing.assert_allclose(wide[::2].numpy(), dy.numpy() @ weight.numpy(), rtol=1e-12)
    assert torch.isnan(wide[1::2]).all() and out.stride() == (2,)


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
