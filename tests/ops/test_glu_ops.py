"""swiglu / geglu and their backward ops through the CPU kernels: float64 references, finite differences,
PyTorch's eager `act(gate) * up` (the unfused module) and its autograd, packed and separate inputs, strided
views, in-place use and errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numeric_grad import assert_gradient, numerical_vjp
from strategies import uniform, views

import xpuruntime as xrt
from xpuruntime.errors import ArgumentError, DTypeError, ShapeError
from xpuruntime.ops.glu import geglu_reference, swiglu_reference
from xpuruntime.ops.glu_backward import geglu_backward_reference, swiglu_backward_reference

torch = pytest.importorskip("torch")
F = torch.nn.functional

KINDS = ["silu", "none", "tanh"]  # swiglu, geglu (erf), geglu (tanh)
TOL = {"float16": 2e-3, "float32": 2e-6, "float64": 1e-12}


def forward(kind: str, gate, up=None, **kw):
    return xrt.ops.swiglu(gate, up, **kw) if kind == "silu" else xrt.ops.geglu(gate, up, kind, **kw)


def backward(kind: str, dy, gate, up=None, **kw):
    if kind == "silu":
        return xrt.ops.swiglu_backward(dy, gate, up, **kw)
    return xrt.ops.geglu_backward(dy, gate, up, kind, **kw)


def reference(kind: str, gate, up=None):
    return swiglu_reference(gate, up) if kind == "silu" else geglu_reference(gate, up, kind)


def backward_reference(kind: str, dy, gate, up=None):
    return swiglu_backward_reference(dy, gate, up) if kind == "silu" else geglu_backward_reference(dy, gate, up, kind)


def eager(kind: str, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The unfused module: LlamaMLP's act_fn(gate_proj(x)) * up_proj(x)."""
    return (F.silu(gate) if kind == "silu" else F.gelu(gate, approximate=kind)) * up


def close(got, ref, dtype: str, what: str = "") -> None:
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert got.shape == ref.shape and not np.isnan(got).any(), (what, got.shape, ref.shape)
    scale = max(float(np.abs(ref).max(initial=0.0)), 1e-30)
    err = float(np.abs(got - ref).max(initial=0.0)) / scale
    assert err <= TOL[dtype], f"{what}: relative error {err:.2e} > {TOL[dtype]}"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_matches_pytorch_eager(kind, dtype):
    """The module's values: act(gate) rounded to the dtype before the product, as PyTorch stores it. Bits differ
    only where NumPy's exp / tanh / erf and PyTorch's move fp32 act(gate) by an ulp across a float16 rounding
    boundary (a single rounding of the product would differ in about a third of the elements)."""
    g = torch.Generator().manual_seed(11)
    gate = (torch.randn(8, 7, 99, dtype=torch.float64, generator=g) * 3).to(dtype)
    up = torch.randn(8, 7, 99, dtype=torch.float64, generator=g).to(dtype)
    got, want = forward(kind, gate, up), eager(kind, gate, up)
    assert got.dtype == dtype
    if dtype == torch.float16:
        assert float((got != want).float().mean()) < (0.002 if kind == "silu" else 0.05)
        if kind == "silu":  # an act(gate) one step off moves the product by at most two steps
            assert int((got.view(torch.int16).int() - want.view(torch.int16).int()).abs().max()) <= 2
        else:  # the CPU kernel's fp32 erf / tanh are approximations: a few float16 steps on small values
            torch.testing.assert_close(got, want, rtol=4e-3, atol=1e-6)
        single = (F.silu(gate.float()) if kind == "silu" else F.gelu(gate.float(), approximate=kind)) * up.float()
        assert float((single.to(dtype) != want).float().mean()) > 0.05  # the rounding of act(gate) matters
    else:
        torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_backward_matches_pytorch_autograd(kind):
    gate = (torch.randn(6, 50, dtype=torch.float64) * 2).to(torch.float16)
    up, dy = (torch.randn(6, 50, dtype=torch.float64).to(torch.float16) for _ in range(2))
    g, u = gate.clone().requires_grad_(), up.clone().requires_grad_()
    want = torch.autograd.grad(eager(kind, g, u), (g, u), dy)
    got = backward(kind, dy, gate, up)
    for a, b, name in zip(got, want, ("dgate", "dup")):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-3, atol=2e-3, msg=name)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("packed", [False, True])
def test_backward_reference_is_the_forward_gradient(rng, kind, packed):
    gate = rng.standard_normal((3, 8 if packed else 4)) * 2
    up = None if packed else rng.standard_normal((3, 4))
    dy = rng.standard_normal((3, 4))
    grads = backward_reference(kind, dy, gate, up)
    f = lambda g, u: reference(kind, g, u)  # noqa: E731
    if packed:
        assert_gradient(grads, numerical_vjp(f, (gate, None), 0, dy), "d(gate_up)")
    else:
        assert_gradient(grads[0], numerical_vjp(f, (gate, up), 0, dy), "dgate")
        assert_gradient(grads[1], numerical_vjp(f, (gate, up), 1, dy), "dup")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_packed_equals_separate_and_reference(rng, kind, dtype):
    gate_up = (rng.standard_normal((2, 5, 2 * 37)) * 2).astype(dtype)
    gate, up = gate_up[..., :37], gate_up[..., 37:]  # strided views of the packed projection
    out = np.full((2, 5, 37), np.nan, dtype)
    packed = forward(kind, gate_up, out=out)
    assert packed is out
    np.testing.assert_array_equal(packed, forward(kind, gate, up))
    close(packed, reference(kind, gate_up), dtype)
    dy = rng.standard_normal((2, 5, 37)).astype(dtype)
    d_packed = backward(kind, dy, gate_up)
    dgate, dup = backward(kind, dy, gate, up)
    assert d_packed.shape == gate_up.shape and dgate.flags.c_contiguous and dup.flags.c_contiguous
    np.testing.assert_array_equal(d_packed, np.concatenate([dgate, dup], axis=-1))
    close(d_packed, backward_reference(kind, dy, gate_up), dtype)


def test_in_place():
    rng = np.random.default_rng(1)
    gate, up, dy = (rng.standard_normal((4, 9)).astype(np.float32) for _ in range(3))
    want = xrt.ops.swiglu(gate, up)
    assert xrt.ops.swiglu(gate, up, out=gate) is gate
    np.testing.assert_array_equal(gate, want)
    gate_up = rng.standard_normal((4, 18)).astype(np.float32)
    want = xrt.ops.geglu_backward(dy, gate_up)
    assert xrt.ops.geglu_backward(dy, gate_up, out=gate_up) is gate_up  # Liger's in-place backward
    np.testing.assert_array_equal(gate_up, want)


def test_errors():
    x = np.ones((3, 5), np.float32)
    with pytest.raises(ShapeError, match="swiglu: argument 'gate' expected an even last dimension"):
        xrt.ops.swiglu(x)
    with pytest.raises(ShapeError, match="geglu: argument 'up' expected shape"):
        xrt.ops.geglu(x, x[:, :4])
    with pytest.raises(DTypeError, match="swiglu: argument 'up' expected dtype float32"):
        xrt.ops.swiglu(x, x.astype(np.float16))
    with pytest.raises(ArgumentError, match="geglu: argument 'approximate' expected one of"):
        xrt.ops.geglu(x, x, "erf")
    with pytest.raises(ShapeError, match="swiglu_backward: argument 'dy' expected shape"):
        xrt.ops.swiglu_backward(x[:, :4], np.ones((3, 10), np.float32))


@settings(max_examples=50, deadline=None)
@given(data=st.data(), kind=st.sampled_from(KINDS), dtype=st.sampled_from(["float32", "float64", "float16"]))
def test_forward_and_backward_property(data, kind, dtype):
    """Random shapes and layouts (offset, strided, reversed, transposed, broadcast), packed or not."""
    shape = (*data.draw(st.lists(st.integers(0, 4), max_size=2), label="rows"), data.draw(st.integers(1, 20)))
    packed = data.draw(st.booleans(), label="packed")
    gate = data.draw(views((*shape[:-1], 2 * shape[-1]) if packed else shape, dtype, uniform(-4, 4)), label="gate")
    up = None if packed else data.draw(views(shape, dtype, uniform(-2, 2)), label="up")
    dy = data.draw(views(shape, dtype, uniform(-1, 1)), label="dy")
    tol = 4 * TOL[dtype]
    np.testing.assert_allclose(forward(kind, gate, up), reference(kind, gate, up), rtol=tol, atol=tol)
    grads = backward(kind, dy, gate, up)
    want = backward_reference(kind, dy, gate, up)
    np.testing.assert_allclose(np.asarray(grads if packed else np.stack(grads)), want, rtol=tol, atol=tol * 4)
