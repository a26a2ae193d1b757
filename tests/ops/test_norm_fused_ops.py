"""rms_norm's Hugging Face forms (casting="llama", offset) and the residual-add norms (add_rms_norm,
add_layer_norm and their backward ops) through the CPU kernels: float64 references, the backward references
against finite differences, the modules' own PyTorch formulas, in-place use, poisoned outputs and errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numeric_grad import assert_gradient, numerical_vjp
from strategies import uniform, views

import xpuruntime as xrt
from xpuruntime.errors import ArgumentError, DTypeError, LayoutError, ShapeError, XpuRuntimeError
from xpuruntime.ops.add_norm import add_layer_norm_reference, add_rms_norm_reference
from xpuruntime.ops.add_norm_backward import add_layer_norm_backward_reference, add_rms_norm_backward_reference
from xpuruntime.ops.norm import rms_norm_reference
from xpuruntime.ops.norm_backward import rms_norm_backward_reference

torch = pytest.importorskip("torch")

TOL = {"float16": 2e-3, "float32": 2e-6, "float64": 1e-12}


def close(got, ref, dtype: str, what: str = "") -> None:
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    assert not np.isnan(got).any(), f"{what}: NaN (an unwritten element?)"
    scale = max(float(np.abs(ref).max(initial=0.0)), 1e-30)
    err = float(np.abs(got - ref).max(initial=0.0)) / scale
    assert err <= TOL[dtype], f"{what}: relative error {err:.2e} > {TOL[dtype]} ({dtype})"


# -- rms_norm, Hugging Face forms -----------------------------------------------------------------------


def llama_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm.forward (Mistral's and Qwen2's are the same), as transformers writes it."""
    input_dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(input_dtype)


def gemma_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """GemmaRMSNorm.forward: the weight (as 1 + weight) applied in fp32, before the cast back."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * (1.0 + weight.float())).type_as(x)


def ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance in units of the last place between two float16 tensors of the same sign pattern."""
    ia, ib = a.view(torch.int16).to(torch.int32), b.view(torch.int16).to(torch.int32)
    return (ia - ib).abs()


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_llama_casting_reproduces_the_hf_module(dtype):
    torch.manual_seed(5)
    x = torch.randn(64, 96, dtype=torch.float64).mul(3).to(dtype)
    w = torch.randn(96, dtype=torch.float64).to(dtype)
    got = xrt.ops.rms_norm(x, 96, w, 1e-6, casting="llama")
    want = llama_rms_norm(x, w, 1e-6)
    assert got.dtype == want.dtype
    if dtype == torch.float16:  # the fp32 row sums' order may differ: a last-place flip of x_hat, rarely,
        assert int(ulps(got, want).max()) <= 2  # which the product with w may turn into two steps
        assert float((got == want).float().mean()) > 0.98
    else:
        torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-6)
    # the default order is F.rms_norm's, which rounds once: it differs from the module's in the last bit
    plain = xrt.ops.rms_norm(x, 96, w, 1e-6)
    torch.testing.assert_close(plain, torch.nn.functional.rms_norm(x, (96,), w, 1e-6), rtol=2e-3, atol=2e-3)
    if dtype == torch.float16:
        assert bool((plain != got).any())


def test_offset_reproduces_gemma():
    torch.manual_seed(6)
    x = torch.randn(32, 48, dtype=torch.float64).to(torch.float16)
    w = (torch.randn(48, dtype=torch.float64) * 0.1).to(torch.float16)
    got = xrt.ops.rms_norm(x, 48, w, 1e-6, offset=1.0)
    assert int(ulps(got, gemma_rms_norm(x, w, 1e-6)).max()) <= 1


def test_rms_norm_options_are_checked():
    x = np.ones((2, 4), np.float32)
    with pytest.raises(XpuRuntimeError, match="rms_norm: argument 'casting' expected one of"):
        xrt.ops.rms_norm(x, 4, casting="gemma")
    with pytest.raises(XpuRuntimeError, match="rms_norm: argument 'offset' expected a finite number"):
        xrt.ops.rms_norm(x, 4, offset=float("nan"))
    with pytest.raises(XpuRuntimeError, match="rms_norm_backward: argument 'offset'"):
        xrt.ops.rms_norm_backward(x, x, 4, offset=True)


@pytest.mark.parametrize("casting", ["torch", "llama"])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_rms_norm_backward_reference_is_the_forward_gradient(rng, casting, offset):
    x, w, dy = rng.standard_normal((3, 7)), rng.standard_normal(7), rng.standard_normal((3, 7))
    packed = rms_norm_backward_reference(dy, x, 7, w, 1e-5, offset, casting)
    forward = lambda x_, w_: rms_norm_reference(x_, 7, w_, 1e-5, offset, casting)  # noqa: E731
    assert_gradient(packed[:3], numerical_vjp(forward, (x, w), 0, dy), "dx")
    assert_gradient(packed[3], numerical_vjp(forward, (x, w), 1, dy), "dweight")


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("casting", ["torch", "llama"])
def test_rms_norm_backward_kernel(rng, dtype, casting):
    x = (rng.standard_normal((5, 3, 33)) * 2).astype(dtype)[:, ::2]  # non-contiguous, odd width
    w, dy = rng.standard_normal(33).astype(dtype), rng.standard_normal((5, 2, 33)).astype(dtype)
    out = np.full((11, 33), np.nan, dtype)
    dx, dw = xrt.ops.rms_norm_backward(dy, x, 33, w, 1e-6, offset=0.5, casting=casting, out=out)
    ref = rms_norm_backward_reference(dy, x, 33, w, 1e-6, 0.5, casting)
    close(dx, ref[:10].reshape(5, 2, 33), dtype, "dx")
    close(dw, ref[10], dtype, "dweight")


def test_llama_backward_follows_autograd_through_the_module():
    x = torch.randn(16, 40, dtype=torch.float64).to(torch.float16)
    w = torch.randn(40, dtype=torch.float64).to(torch.float16)
    dy = torch.randn(16, 40, dtype=torch.float64).to(torch.float16)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    want = torch.autograd.grad(llama_rms_norm(xr, wr, 1e-6), (xr, wr), dy)
    got = xrt.ops.rms_norm_backward(dy, x, 40, w, 1e-6, casting="llama")
    for g, r, name in zip(got, want, ("dx", "dweight")):
        torch.testing.assert_close(g.float(), r.float(), rtol=4e-3, atol=4e-3, msg=name)


# -- add_rms_norm / add_layer_norm ----------------------------------------------------------------------

DTYPE_PAIRS = [("float32", "float32"), ("float16", "float16"), ("float16", "float32"), ("float32", "float64")]


def _case(rng, x_dtype: str, r_dtype: str, shape=(4, 3, 37)):
    x = rng.standard_normal(shape).astype(x_dtype)
    residual = (rng.standard_normal(shape) * 2).astype(r_dtype)
    h_dtype = np.result_type(x, residual).name
    weight = rng.standard_normal(shape[-1]).astype(h_dtype)
    bias = rng.standard_normal(shape[-1]).astype(h_dtype)
    return x, residual, weight, bias, h_dtype


@pytest.mark.parametrize(("x_dtype", "r_dtype"), DTYPE_PAIRS)
@pytest.mark.parametrize("casting", ["torch", "llama"])
def test_add_rms_norm(rng, x_dtype, r_dtype, casting):
    x, residual, weight, _, h_dtype = _case(rng, x_dtype, r_dtype)
    out, h_out = np.full(x.shape, np.nan, h_dtype), np.full(x.shape, np.nan, h_dtype)
    y, h = xrt.ops.add_rms_norm(x, residual, weight, 1e-6, casting=casting, out=out, residual_out=h_out)
    assert y is out and h is h_out and y.dtype == np.dtype(h_dtype)
    np.testing.assert_array_equal(h, (x.astype(h_dtype) + residual.astype(h_dtype)))  # rounded once, exactly
    close(y, add_rms_norm_reference(x, residual, weight, None, 1e-6, 0.0, casting), h_dtype)


@pytest.mark.parametrize(("x_dtype", "r_dtype"), DTYPE_PAIRS)
def test_add_layer_norm(rng, x_dtype, r_dtype):
    x, residual, weight, bias, h_dtype = _case(rng, x_dtype, r_dtype, shape=(5, 129))
    y, h = xrt.ops.add_layer_norm(x[::2], residual[::2], weight, bias)  # strided rows
    np.testing.assert_array_equal(h, x[::2].astype(h_dtype) + residual[::2].astype(h_dtype))
    close(y, add_layer_norm_reference(x[::2], residual[::2], weight, bias), h_dtype)


def test_add_norms_match_the_unfused_module_in_torch():
    """HF's decoder layer under autocast: a bf16 / fp16 branch output added to the fp32 residual stream."""
    x = torch.randn(6, 64, dtype=torch.float64).to(torch.float16)
    residual = torch.randn(6, 64)
    w = torch.randn(64)
    y, h = xrt.ops.add_rms_norm(x, residual, w, 1e-6, casting="llama")
    assert isinstance(y, torch.Tensor) and h.dtype == torch.float32
    torch.testing.assert_close(h, x + residual, rtol=0, atol=0)
    torch.testing.assert_close(y, llama_rms_norm(x + residual, w, 1e-6), rtol=2e-6, atol=2e-6)
    b = torch.randn(64)
    y, h = xrt.ops.add_layer_norm(x, residual, w, b, 1e-5)
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x + residual, (64,), w, b, 1e-5), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["rms", "layer"])
def test_add_norm_in_place(rng, op):
    x, residual, weight, bias, _ = _case(rng, "float32", "float32")
    want_y, want_h = (xrt.ops.add_rms_norm(x, residual, weight) if op == "rms" else
                      xrt.ops.add_layer_norm(x, residual, weight, bias))  # fmt: skip
    x2, r2 = x.copy(), residual.copy()  # vLLM's form: the sum into the residual, the norm into x
    if op == "rms":
        y, h = xrt.ops.add_rms_norm(x2, r2, weight, out=x2, residual_out=r2)
    else:
        y, h = xrt.ops.add_layer_norm(x2, r2, weight, bias, out=x2, residual_out=r2)
    assert y is x2 and h is r2
    np.testing.assert_array_equal(h, want_h)
    np.testing.assert_array_equal(y, want_y)


def test_add_norm_errors(rng):
    x, residual, weight, _, _ = _case(rng, "float32", "float32")
    with pytest.raises(ShapeError, match="add_rms_norm: argument 'residual' expected shape"):
        xrt.ops.add_rms_norm(x, residual[:, :2], weight)
    with pytest.raises(DTypeError, match="add_rms_norm: argument 'weight' expected dtype float64"):
        xrt.ops.add_rms_norm(x, residual.astype(np.float64), weight)
    with pytest.raises(LayoutError, match="add_layer_norm: argument 'residual_out' overlaps 'out'"):
        xrt.ops.add_layer_norm(x, residual, out=x, residual_out=x)
    with pytest.raises(LayoutError, match="argument 'residual_out' overlaps input 'residual'"):
        buffer = np.concatenate([residual.ravel(), [0.0]]).astype(np.float32)
        xrt.ops.add_rms_norm(x, buffer[:-1].reshape(x.shape), residual_out=buffer[1:].reshape(x.shape))
    with pytest.raises(ShapeError, match="argument 'residual_out' expected a contiguous buffer"):
        strided = np.empty((4, 2, 74), np.float32)[..., ::2]
        xrt.ops.add_rms_norm(x[:, ::2], residual[:, ::2], residual_out=strided)
    read_only = np.ones((1, *x.shape[1:]), np.float32)
    read_only.setflags(write=False)
    with pytest.raises(ArgumentError, match="add_rms_norm: argument 'residual_out' expected a writable array"):
        xrt.default_dispatcher().run("add_rms_norm", (x[:1], residual[:1], weight, read_only), ())
    with pytest.raises(ShapeError, match="add_layer_norm: argument 'x' expected a last dimension of at least one"):
        xrt.ops.add_layer_norm(np.ones((3, 0), np.float32), np.ones((3, 0), np.float32))


@pytest.mark.parametrize("op", ["rms", "layer"])
def test_add_norm_backward_reference_is_the_forward_gradient(rng, op):
    x, r, w, dy, dh = (rng.standard_normal(s) for s in ((3, 6), (3, 6), 6, (3, 6), (3, 6)))
    if op == "rms":
        forward = lambda x_, r_, w_: add_rms_norm_reference(x_, r_, w_, None, 1e-5, 0.25)  # noqa: E731
        packed = add_rms_norm_backward_reference(dy, dh, x + r, w, 1e-5, 0.25)
    else:
        forward = lambda x_, r_, w_: add_layer_norm_reference(x_, r_, w_, None, None, 1e-5)  # noqa: E731
        packed = add_layer_norm_backward_reference(dy, dh, x + r, w, 1e-5)
    # dh flows into h = x + residual from the rest of the residual stream: its gradient adds to both
    dx = numerical_vjp(forward, (x, r, w), 0, dy) + dh
    assert_gradient(packed[:3], dx, "dh_total")
    assert_gradient(packed[:3], numerical_vjp(forward, (x, r, w), 1, dy) + dh, "dresidual")
    assert_gradient(packed[3], numerical_vjp(forward, (x, r, w), 2, dy), "dweight")
    if op == "layer":
        assert_gradient(packed[4], dy.sum(axis=0), "dbias")


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("with_dh", [True, False])
def test_add_norm_backward_kernels(rng, dtype, with_dh):
    h, w, dy, dh = (rng.standard_normal(s).astype(dtype) for s in ((7, 45), 45, (7, 45), (7, 45)))
    dh = dh if with_dh else None
    d_total, dw = xrt.ops.add_rms_norm_backward(dy, dh, h, w, 1e-6, casting="llama")
    ref = add_rms_norm_backward_reference(dy, dh, h, w, 1e-6, 0.0, "llama")
    close(d_total, ref[:7], dtype, "rms dh_total")
    close(dw, ref[7], dtype, "rms dweight")
    out = np.full((9, 45), np.nan, dtype)
    d_total, dw, db = xrt.ops.add_layer_norm_backward(dy, dh, h, w, out=out)
    ref = add_layer_norm_backward_reference(dy, dh, h, w)
    for got, want, name in zip((d_total, dw, db), (ref[:7], ref[7], ref[8]), ("dh_total", "dweight", "dbias")):
        close(got, want, dtype, "layer " + name)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(["float32", "float64", "float16"]), llama=st.booleans())
def test_add_rms_norm_property(data, dtype, llama):
    """Random shapes and memory layouts of x and residual (offset, strided, reversed, transposed, broadcast)."""
    rows = data.draw(st.lists(st.integers(1, 4), max_size=2), label="rows")
    n = data.draw(st.integers(1, 40), label="n")
    shape = (*rows, n)
    x = data.draw(views(shape, dtype, uniform(-3, 3)), label="x")
    residual = data.draw(views(shape, dtype, uniform(-3, 3)), label="residual")
    weight = data.draw(st.none() | views((n,), dtype, uniform(-2, 2)), label="weight")
    casting = "llama" if llama else "torch"
    y, h = xrt.ops.add_rms_norm(x, residual, weight, 1e-5, casting=casting)
    np.testing.assert_array_equal(h, x + residual)
    ref = add_rms_norm_reference(x, residual, weight, None, 1e-5, 0.0, casting)
    tol = {"float16": 2e-3, "float32": 1e-5, "float64": 1e-12}[dtype]
    np.testing.assert_allclose(y, ref, rtol=tol, atol=tol * max(1.0, float(np.abs(ref).max(initial=0.0))))


def test_autotune_times_on_fresh_buffers_not_on_an_in_place_residual(rng, monkeypatch, tmp_path):
    """residual_out may be the residual itself (the stream updated in place): tuning launches each candidate
    several times, which must not add x to the residual again and again (schema.buffers get fresh arrays)."""
    import dataclasses

    from xpuruntime.backends.cpu import BACKEND
    from xpuruntime.backends.cpu.add_norm import add_rms_norm_numpy
    from xpuruntime.dispatch import Dispatcher
    from xpuruntime.ops.add_norm import ADD_RMS_NORM
    from xpuruntime.registry import Registry

    monkeypatch.setenv("XPURUNTIME_CACHE_DIR", str(tmp_path))
    registry = Registry()
    registry.register_op(ADD_RMS_NORM)
    registry.register_backend(BACKEND)
    registry.register_kernel(add_rms_norm_numpy)
    registry.register_kernel(dataclasses.replace(add_rms_norm_numpy, name="numpy_again"))
    x, residual, weight, _, _ = _case(rng, "float32", "float32")
    want_y, want_h = xrt.ops.add_rms_norm(x, residual, weight)
    xrt.enable_dispatch_logging()
    with xrt.kernel_policy(autotune=True):
        y = Dispatcher(registry).run("add_rms_norm", (x, residual, weight, residual), ())
    assert xrt.get_dispatch_logs()[-1].reason == "autotune"
    np.testing.assert_array_equal(residual, want_h)
    np.testing.assert_array_equal(y, want_y)
