"""The fused transformer-training kernels (backends/triton: norm.py's HF and add forms, glu.py, rotary.py,
cross_entropy.py), forward and backward, against the float64 references through the dispatcher with a strict
policy naming them: random inputs, odd sizes, strided views, outputs poisoned with NaN, ignore_index rows.

On a GPU the shapes are a Llama-8L training step's (8 x 1024 tokens, hidden 1024, intermediate 2816, 16 / 4
heads of 64, vocab 32000); without one this module reruns itself under TRITON_INTERPRET=1 at tiny shapes.
"""

from __future__ import annotations

import numpy as np
import pytest
from triton_harness import (
    DTYPES,
    INTERPRET,
    ON_GPU,
    assert_close,
    f64,
    kernel_test,
    make,
    poisoned,
    rerun_under_interpreter,
    size,
    strict,
    torch,
)

import xpuruntime as xrt
from xpuruntime.ops.add_norm import add_layer_norm_reference, add_rms_norm_reference
from xpuruntime.ops.add_norm_backward import add_layer_norm_backward_reference, add_rms_norm_backward_reference
from xpuruntime.ops.glu import geglu_reference, swiglu_reference
from xpuruntime.ops.glu_backward import geglu_backward_reference, swiglu_backward_reference
from xpuruntime.ops.linear_cross_entropy import gradients_reference
from xpuruntime.ops.linear_cross_entropy import reference as lce_reference
from xpuruntime.ops.norm import rms_norm_reference
from xpuruntime.ops.norm_backward import rms_norm_backward_reference
from xpuruntime.ops.rotary import reference as rotary_reference
from xpuruntime.ops.rotary_backward import reference as rotary_backward_reference

if not (INTERPRET or ON_GPU):  # CPU-only machines (CI): run this module again under the interpreter

    def test_fused_kernels_under_interpreter() -> None:
        rerun_under_interpreter(__file__)


ROWS, HIDDEN, INTERMEDIATE, VOCAB = size(8192, 13), size(1024, 40), size(2816, 37), size(32000, 53)
HEADS, KV_HEADS, SEQ, HEAD_DIM = size(16, 4), size(4, 2), size(1024, 5), size(64, 8)


def ints(rng: np.random.Generator, low: int, high: int, shape: tuple[int, ...]) -> object:
    values = rng.integers(low, high, shape)
    return torch.tensor(values, device="cuda") if ON_GPU else values


def finite_close(got: object, ref: np.ndarray, dtype: str, tol: float | None = None) -> None:
    """assert_close where the reference is finite; NaN exactly where it has NaN."""
    got64 = f64(got)
    assert np.array_equal(np.isnan(got64), np.isnan(ref)), "NaN where the reference has none, or not"
    keep = ~np.isnan(ref)
    assert_close(got64[keep], ref[keep], dtype, tol)


# -- norms: Hugging Face forms and the residual adds ----------------------------------------------------

NORM_SHAPES = [((ROWS, HIDDEN), None), ((3, 5, 37), lambda t: t[:, ::2]), ((2, size(20001, 20001)), None)]


@kernel_test
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(NORM_SHAPES)))
@pytest.mark.parametrize(("casting", "offset"), [("llama", 0.0), ("torch", 1.0)])
def test_rms_norm_hf_forms(rng, dtype, case, casting, offset) -> None:
    shape, view = NORM_SHAPES[case]
    x = make(rng, shape, dtype, view, scale=2.0)
    n = x.shape[-1]
    w, dy = make(rng, (n,), dtype), make(rng, tuple(x.shape), dtype)
    out = poisoned(tuple(x.shape), dtype)
    with strict(rms_norm="triton", rms_norm_backward="triton"):
        xrt.ops.rms_norm(x, n, w, 1e-6, offset=offset, casting=casting, out=out)
        dx, dw = xrt.ops.rms_norm_backward(dy, x, n, w, 1e-6, offset=offset, casting=casting)
    assert_close(out, rms_norm_reference(f64(x), n, f64(w), 1e-6, offset, casting), dtype)
    ref = rms_norm_backward_reference(f64(dy), f64(x), n, f64(w), 1e-6, offset, casting)
    assert_close(dx, ref[:-1].reshape(tuple(x.shape)), dtype)
    assert_close(dw, ref[-1], dtype, tol=2e-2 if dtype == "bfloat16" else None)


ADD_CASES = [  # shape, view of x, residual dtype (None: x's)
    ((ROWS, HIDDEN), None, "float32"),  # HF under autocast: a half branch output onto the fp32 residual stream
    ((ROWS, HIDDEN), None, None),
    ((4, 3, 45), lambda t: t[:, 1:], None),
    ((2, size(20001, 20001)), None, None),
]


@kernel_test
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(ADD_CASES)))
def test_add_norms(rng, dtype, case) -> None:
    shape, view, r_dtype = ADD_CASES[case]
    x = make(rng, shape, dtype, view)
    residual = make(rng, tuple(x.shape), r_dtype or dtype, scale=3.0)
    h_dtype = r_dtype or dtype
    n = x.shape[-1]
    w, b = make(rng, (n,), h_dtype), make(rng, (n,), h_dtype)
    h_ref = f64(x) + f64(residual)
    with strict(add_rms_norm="triton", add_layer_norm="triton"):
        for call, ref in (
            (lambda o, h: xrt.ops.add_rms_norm(x, residual, w, 1e-6, casting="llama", out=o, residual_out=h),
             add_rms_norm_reference(f64(x), f64(residual), f64(w), None, 1e-6, 0.0, "llama")),
            (lambda o, h: xrt.ops.add_layer_norm(x, residual, w, b, out=o, residual_out=h),
             add_layer_norm_reference(f64(x), f64(residual), f64(w), f64(b))),
        ):  # fmt: skip
            out, h = poisoned(tuple(x.shape), h_dtype), poisoned(tuple(x.shape), h_dtype)
            call(out, h)
            assert_close(h, h_ref, h_dtype)
            assert_close(out, ref, h_dtype)


@kernel_test
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(NORM_SHAPES)))
@pytest.mark.parametrize("with_dh", [True, False])
def test_add_norms_backward(rng, dtype, case, with_dh) -> None:
    shape, view = NORM_SHAPES[case]
    h = make(rng, shape, dtype, view, scale=2.0)
    n = h.shape[-1]
    w, dy = make(rng, (n,), dtype), make(rng, tuple(h.shape), dtype)
    dh = make(rng, tuple(h.shape), dtype) if with_dh else None
    dh64 = None if dh is None else f64(dh)
    rows = int(np.prod(tuple(h.shape))) // n
    with strict(add_rms_norm_backward="triton", add_layer_norm_backward="triton"):
        packed = poisoned((rows + 1, n), dtype)
        xrt.ops.add_rms_norm_backward(dy, dh, h, w, 1e-6, out=packed)
        ref = add_rms_norm_backward_reference(f64(dy), dh64, f64(h), f64(w), 1e-6)
        assert_close(packed[:rows], ref[:rows], dtype)
        assert_close(packed[rows:], ref[rows:], dtype, tol=2e-2 if dtype == "bfloat16" else None)
        packed = poisoned((rows + 2, n), dtype)
        xrt.ops.add_layer_norm_backward(dy, dh, h, w, out=packed)
        ref = add_layer_norm_backward_reference(f64(dy), dh64, f64(h), f64(w))
        assert_close(packed[:rows], ref[:rows], dtype)
        assert_close(packed[rows:], ref[rows:], dtype, tol=2e-2 if dtype == "bfloat16" else None)


# -- swiglu / geglu ---------------------------------------------------------------------------------------

GLU_KINDS = ["silu", "none", "tanh"]


def _glu(kind: str, gate: object, up: object = None, **kw: object) -> object:
    return xrt.ops.swiglu(gate, up, **kw) if kind == "silu" else xrt.ops.geglu(gate, up, kind, **kw)


def _glu_backward(kind: str, dy: object, gate: object, up: object = None, **kw: object) -> object:
    if kind == "silu":
        return xrt.ops.swiglu_backward(dy, gate, up, **kw)
    return xrt.ops.geglu_backward(dy, gate, up, kind, **kw)


def _glu_references(kind: str, dy: object, gate: object, up: object) -> tuple[np.ndarray, np.ndarray]:
    g, u, d = f64(gate), None if up is None else f64(up), f64(dy)
    if kind == "silu":
        return swiglu_reference(g, u), swiglu_backward_reference(d, g, u)
    return geglu_reference(g, u, kind), geglu_backward_reference(d, g, u, kind)


@kernel_test
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", GLU_KINDS)
@pytest.mark.parametrize("packed", [False, True])
def test_glu(rng, dtype, kind, packed) -> None:
    gate_up = make(rng, (ROWS, 2 * INTERMEDIATE), dtype, scale=2.0)
    gate, up = (gate_up, None) if packed else (gate_up[:, :INTERMEDIATE], gate_up[:, INTERMEDIATE:])  # strided
    dy = make(rng, (ROWS, INTERMEDIATE), dtype)
    ref, ref_grads = _glu_references(kind, dy, gate, up)
    out = poisoned((ROWS, INTERMEDIATE), dtype)
    grads_out = poisoned(tuple(gate_up.shape) if packed else (2, ROWS, INTERMEDIATE), dtype)
    with strict(swiglu="triton", geglu="triton", swiglu_backward="triton", geglu_backward="triton"):
        _glu(kind, gate, up, out=out)
        _glu_backward(kind, dy, gate, up, out=grads_out)
    assert_close(out, ref, dtype)
    assert_close(grads_out, ref_grads, dtype)


@kernel_test
def test_glu_backward_in_place(rng) -> None:
    gate_up, dy = make(rng, (7, 18), "float32"), make(rng, (7, 9), "float32")
    ref = swiglu_backward_reference(f64(dy), f64(gate_up))
    with strict(swiglu_backward="triton"):
        assert xrt.ops.swiglu_backward(dy, gate_up, out=gate_up) is gate_up
    assert_close(gate_up, ref, "float32")


# -- rotary embeddings -----------------------------------------------------------------------------------

ROTARY_CASES = [  # bshd layout, rotary dim (None: head_dim), interleaved, position table rows (None: no ids)
    (False, None, False, None),  # Llama: q (B, H, S, D) from a transposed view, cos (B, S, D)
    (True, None, False, None),
    (False, HEAD_DIM // 2, False, None),  # partial rotary
    (True, None, True, size(2048, 11)),  # interleaved, position_ids into a table (with some out of range)
]


@kernel_test
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(ROTARY_CASES)))
def test_rotary(rng, dtype, case) -> None:
    bshd, rotary, interleaved, table = ROTARY_CASES[case]
    batch = size(8, 2)
    rotary = rotary or HEAD_DIM
    # HF's q and k: a projection viewed as (B, S, H, D), transposed to (B, H, S, D) unless bshd
    q = make(rng, (batch, SEQ, HEADS, HEAD_DIM), dtype)
    k = make(rng, (batch, SEQ, KV_HEADS, HEAD_DIM), dtype)
    if not bshd:
        q, k = (t.transpose(1, 2) if ON_GPU else np.swapaxes(t, 1, 2) for t in (q, k))
    position_ids = None
    if table is None:
        cos, sin = make(rng, (1, SEQ, rotary), dtype), make(rng, (1, SEQ, rotary), dtype)
    else:
        cos, sin = make(rng, (table, rotary), "float32"), make(rng, (table, rotary), "float32")
        position_ids = ints(rng, -1, table + 1, (batch, SEQ))
    args = (cos, sin, position_ids, 2 if bshd else 1, interleaved)
    out = poisoned((int(np.prod(tuple(q.shape))) + int(np.prod(tuple(k.shape))),), dtype)
    with strict(rotary_embedding="triton", rotary_embedding_backward="triton"):
        xrt.ops.rotary_embedding(q, k, *args, out=out)
        grads = xrt.ops.rotary_embedding_backward(q, k, *args)  # q and k stand for upstream gradients here
    refs = [f(f64(q), f64(k), f64(cos), f64(sin), None if position_ids is None else f64(position_ids).astype(np.int64),
              2 if bshd else 1, interleaved) for f in (rotary_reference, rotary_backward_reference)]  # fmt: skip
    finite_close(out, refs[0], dtype)
    finite_close(torch.cat([g.reshape(-1) for g in grads]) if ON_GPU else np.concatenate([g.ravel() for g in grads]),
                 refs[1], dtype)  # fmt: skip


# -- linear cross-entropy --------------------------------------------------------------------------------

LCE_CASES = [  # rows, vocab, label_smoothing, reduction, z_loss_scale, bias, logits chunk bytes (None: default)
    (ROWS, VOCAB, 0.0, "mean", 0.0, False, None),
    (ROWS, VOCAB, 0.1, "sum", 1e-4, True, size(None, 4 * 53 * 4)),  # several chunks
    (size(1000, 7), VOCAB, 0.0, "none", 0.0, False, None),
    (size(64, 3), size(50257, 40_001), 0.05, "mean", 1e-4, False, None),  # longer than one pass: looped rows
    (size(4096, 13), size(50257, 97), 0.1, "sum", 1e-4, True, size(50257 * 2 * 1024, 4 * 53 * 4)),  # odd, chunked
]


@kernel_test
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(LCE_CASES)))
def test_linear_cross_entropy(rng, monkeypatch, dtype, case) -> None:
    from xpuruntime.backends.triton import cross_entropy

    rows, vocab, smoothing, reduction, z_loss, with_bias, chunk_bytes = LCE_CASES[case]
    monkeypatch.setattr(cross_entropy, "PAD_DEVICES", ("cuda", "cpu"))  # an odd vocabulary's padding, also here
    if chunk_bytes:
        monkeypatch.setattr(cross_entropy, "LOGITS_CHUNK_BYTES", chunk_bytes)
        monkeypatch.setattr(cross_entropy, "MIN_CHUNK_ROWS", 1)
    hidden = make(rng, (rows, HIDDEN), dtype)
    weight = make(rng, (vocab, HIDDEN), dtype, scale=HIDDEN**-0.5)
    bias = make(rng, (vocab,), dtype) if with_bias else None
    target = rng.integers(0, vocab, rows)
    target[rng.random(rows) < 0.25] = -100
    target_d = torch.tensor(target, device="cuda") if ON_GPU else target
    options = (-100, smoothing, reduction, z_loss)
    args64 = (f64(hidden), f64(weight), target, None if bias is None else f64(bias))
    ref = lce_reference(*args64, None, None, None, *options)
    g = make(rng, ref.shape, "float32")
    ref_grads = gradients_reference(f64(g), *args64, *options)
    tol = {"float32": 2e-5, "float16": 5e-3, "bfloat16": 2e-2}[dtype]
    with strict(linear_cross_entropy="triton", linear_cross_entropy_backward="triton"):
        assert_close(xrt.ops.linear_cross_entropy(hidden, weight, target_d, bias, *options), ref, dtype, tol)
        grads = xrt.ops.linear_cross_entropy_backward(g, hidden, weight, target_d, bias, *options)
        for got, want in zip(grads, ref_grads):
            if got is not None:
                assert_close(got, want, dtype, tol)
        if reduction != "none":
            loss, *in_pass = xrt.ops.linear_cross_entropy_forward(hidden, weight, target_d, bias, *options)
            assert_close(loss, ref, dtype, tol)
            for got, want in zip(in_pass, gradients_reference(1.0, *args64, *options)):
                if got is not None:
                    assert_close(got, want, dtype, tol)


@kernel_test
@pytest.mark.parametrize("chunks", [1, 3])
def test_linear_cross_entropy_fp32_gradients_of_half_inputs(rng, monkeypatch, chunks) -> None:
    """fp32 weight and bias gradient buffers beside half inputs (an fp32 master weight's gradient, as the PyTorch
    front end asks under autocast): summed over the chunks straight into the poisoned buffers, an odd vocabulary
    padded on the device and its extra rows never written out."""
    from xpuruntime.backends.triton import cross_entropy
    from xpuruntime.dispatch import run

    rows, vocab = size(2048, 13), size(32003, 131)  # padded to 192; the weight gradient in 128 + 3 rows
    monkeypatch.setattr(cross_entropy, "PAD_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(cross_entropy, "LOGITS_CHUNK_BYTES", -(-rows // chunks) * (vocab + 64) * 2)
    monkeypatch.setattr(cross_entropy, "MIN_CHUNK_ROWS", 1)
    hidden = make(rng, (rows, HIDDEN), "float16")
    weight = make(rng, (vocab, HIDDEN), "float16", scale=HIDDEN**-0.5)
    bias = make(rng, (vocab,), "float16")
    target = rng.integers(0, vocab, rows)
    target[rng.random(rows) < 0.25] = -100
    target_d = torch.tensor(target, device="cuda") if ON_GPU else target
    grads = (poisoned((rows, HIDDEN), "float16"), poisoned((vocab, HIDDEN), "float32"), poisoned((vocab,), "float32"))
    options = (-100, 0.05, "mean", 0.0)
    with strict(linear_cross_entropy="triton"):
        loss = run("linear_cross_entropy", (hidden, weight, target_d, bias, *grads), options)
    args64 = (f64(hidden), f64(weight), target, f64(bias))
    assert_close(loss, lce_reference(*args64, None, None, None, *options), "float16", 5e-3)
    for got, want, dtype in zip(grads, gradients_reference(1.0, *args64, *options), ("float16", "float32", "float32")):
        assert str(got.dtype).removeprefix("torch.") == dtype
        assert_close(got, want, "float16", 5e-3)  # half inputs: half's rounding of float64's


@kernel_test
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_linear_cross_entropy_half_gradients_do_not_underflow(rng, reduction) -> None:
    """A small loss gradient shared by every row (1e-3 per row here; "mean" over thousands of rows gives such): the
    fp16 logit gradients of a large vocabulary would fall below fp16's smallest subnormal if they carried it, so it
    is applied after the GEMMs, in fp32. The hidden states' gradient keeps fp16's rounding of float64's."""
    rows, vocab = size(256, 3), size(32000, 40_001)
    hidden = make(rng, (rows, HIDDEN), "float16")
    weight = make(rng, (vocab, HIDDEN), "float16", scale=HIDDEN**-0.5)
    target = rng.integers(0, vocab, rows)
    target_d = torch.tensor(target, device="cuda") if ON_GPU else target
    options = (-100, 0.0, reduction, 0.0)
    g = np.asarray(1e-3 * (rows if reduction == "mean" else 1), np.float32)
    args64 = (f64(hidden), f64(weight), target, None)
    want = gradients_reference(f64(g), *args64, *options)[0]
    with strict(linear_cross_entropy_backward="triton"):
        grad_loss = torch.tensor(g, device="cuda") if ON_GPU else g
        got = xrt.ops.linear_cross_entropy_backward(grad_loss, hidden, weight, target_d, None, *options)[0]
    got = got.float().cpu().numpy() if ON_GPU else np.asarray(got, np.float64)
    scale = float(np.abs(want).max())
    assert float(np.abs(got - want).max()) <= 2e-3 * scale
