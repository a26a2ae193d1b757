"""Core edge cases: explain records, in-place aliasing of parameters, error messages, array-likes."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_toy_registry
from hypothesis import given, settings
from hypothesis import strategies as st

import xpuruntime as xrt
from xpuruntime import policy
from xpuruntime.dispatch import Dispatcher
from xpuruntime.errors import (
    ArgumentError,
    DTypeError,
    LayoutError,
    RegistrationError,
    UnknownOpError,
    UnsupportedByPolicyError,
)
from xpuruntime.ops.attention_backward import gradients_reference
from xpuruntime.ops.norm import layer_norm_reference
from xpuruntime.ops.norm_backward import layer_norm_backward_reference, rms_norm_backward_reference
from xpuruntime.policy import KernelPolicy
from xpuruntime.registry import Backend, kernel

TOLERANCE = {"float16": 2e-3, "float32": 2e-5, "float64": 1e-12}


def _only_float64(ctx):
    return None if ctx.dtype == "float64" else f"needs float64, got {ctx.dtype}"


def test_explain_of_a_failed_strict_call_shows_the_preferred_kernels_own_reasons():
    """A strict policy naming an explicit-only kernel that cannot run the call: explain's table must show why
    (its condition), not claim that the policy does not name it, and agree with the error it reports."""
    registry = make_toy_registry({"name": "any"})
    registry.register_backend(
        Backend("named", "cpu", empty=lambda s, d, dev, st_: np.empty(s, d), explicit_only=True, doc="by name")
    )
    registry.register_kernel(
        kernel("toy", "special", backend="named", conditions=(_only_float64,))(lambda args: None)
    )  # fmt: skip
    policy = KernelPolicy(toy="special", strict=True, validate=False)
    x = np.random.default_rng().standard_normal(5).astype(np.float32)
    explanation = Dispatcher(registry).explain("toy", x, policy=policy)
    assert isinstance(explanation.error, UnsupportedByPolicyError)
    [row] = [r for r in explanation.rows() if r["kernel"] == "special"]
    assert row["reasons"] == ["needs float64, got float32"], row
    assert "needs float64, got float32" in str(explanation.error)


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(1, 33),
    dtype=st.sampled_from(["float32", "float64", "float16"]),
    target=st.sampled_from(["weight", "bias", "x_is_weight"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_layer_norm_out_may_be_the_very_view_of_weight_or_bias(n, dtype, target, seed):
    """The in-place rule lets `out` be exactly any input's view; with a 1-d x that includes weight and bias,
    which the kernel must not overwrite before it reads them."""
    rng = np.random.default_rng(seed)
    x, w, b = (rng.standard_normal(n).astype(dtype) for _ in range(3))
    if target == "x_is_weight":
        w = x
    want = layer_norm_reference(x, (n,), w, b)
    out = {"weight": w, "bias": b, "x_is_weight": x}[target]
    got = xrt.ops.layer_norm(x, (n,), w, b, out=out)
    assert got is out
    np.testing.assert_allclose(got, want, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype] * 4)


@pytest.mark.parametrize("dtype", ["int32", "bool", "uint8"])
def test_norm_backward_of_a_non_float_input_names_the_dtype_not_eps(dtype):
    x = np.random.default_rng().integers(0, 2, (3, 5)).astype(dtype)
    for backward in (xrt.ops.rms_norm_backward, xrt.ops.layer_norm_backward):
        with pytest.raises(DTypeError, match=rf"{backward.__name__}: argument 'x' expected a floating dtype"):
            backward(x, x, (5,))


def test_backward_front_ends_take_array_likes_like_every_other_front_end():
    rng = np.random.default_rng()
    x, dy, w = rng.standard_normal((3, 5)), rng.standard_normal((3, 5)), rng.standard_normal(5)
    dx, dw, db = xrt.ops.layer_norm_backward(dy.tolist(), x.tolist(), 5, w.tolist())
    want = layer_norm_backward_reference(dy, x, 5, w)
    np.testing.assert_allclose(np.concatenate([dx, dw[None], db[None]]), want, rtol=1e-12, atol=1e-12)
    dx, dw = xrt.ops.rms_norm_backward(dy.tolist(), x.tolist(), [5], w.tolist())
    want = rms_norm_backward_reference(dy, x, 5, w)
    np.testing.assert_allclose(np.concatenate([dx, dw[None]]), want, rtol=1e-12, atol=1e-12)

    q, k, v = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 5, 3))
    out, lse = xrt.ops.attention_forward(q, k, v)
    do = rng.standard_normal(out.shape)
    grads = xrt.ops.attention_backward(do.tolist(), q.tolist(), k.tolist(), v.tolist(), out, lse)
    for got, want in zip(grads, gradients_reference(do, q, k, v)):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)  # lse is float32 by design


def test_a_structured_field_view_error_names_the_op_and_the_argument():
    records = np.zeros(7, dtype=[("a", "f4"), ("b", "i2")])
    records["a"] = np.random.default_rng().standard_normal(7)
    plain = np.ones(7, np.float32)
    with pytest.raises(LayoutError, match=r"^sin_affine: argument 'x': .*not a multiple of its itemsize 4"):
        xrt.ops.sin_affine(records["a"], 2.0)
    with pytest.raises(LayoutError, match=r"^softmax: argument 'out': .*not a multiple of its itemsize 4"):
        xrt.ops.softmax(plain, out=records["a"])


def test_a_fused_constant_beyond_the_float_range_is_an_argument_error():
    x = np.random.default_rng().standard_normal(5).astype(np.float32)
    program = (("mul", ("in", 0), ("c", 10**400)),)
    with pytest.raises(ArgumentError, match=r"fused_elementwise: argument 'program' instruction 0: bad ref") as info:
        xrt.ops.fused_elementwise(program, x)
    assert len(str(info.value)) < 400  # the 401-digit constant is not echoed in full


def test_fused_programs_differing_in_a_zero_constants_sign_do_not_share_a_plan():
    x = np.random.default_rng().uniform(0.5, 2.0, 6).astype(np.float32)
    for zero in (0.0, -0.0):
        program = (("div", ("in", 0), ("c", zero)),)
        got = xrt.ops.fused_elementwise(program, x)
        with np.errstate(divide="ignore"):
            want = x.astype(np.float64) / zero
        np.testing.assert_array_equal(got, want.astype(np.float32))


@pytest.mark.parametrize("spec", ["atention=autotune", "matmul=blocked,atention=autotune"])
def test_environment_policy_checks_the_op_names_of_autotune_entries_too(monkeypatch, spec):
    """'atention=autotune' in the environment must fail like 'atention=chunked' does, not tune nothing."""
    monkeypatch.setenv(policy.ENV_POLICY, spec)
    x = np.random.default_rng().standard_normal((3, 4))
    with pytest.raises(UnknownOpError, match=r"\$XPURUNTIME_POLICY: unknown op .*Did you mean 'attention'"):
        xrt.ops.sum(x)


def test_a_fallback_warning_points_at_a_sibling_package_calling_us(tmp_path):
    """Frames of a package whose path merely starts like ours (xpuruntime_plugins/) are the caller's."""
    import os
    import warnings

    from xpuruntime import dispatch
    from xpuruntime.errors import KernelFallbackWarning

    registry = make_toy_registry(
        {"name": "any", "priority": 1},
        {"name": "f64", "conditions": (lambda ctx: None if ctx.dtype == "float64" else "needs float64",)},
    )
    sibling = dispatch._PACKAGE_DIR + "_plugins" + os.sep + "caller.py"
    namespace: dict = {}
    exec(compile("def call(run, x):\n    return run('toy', (x,))\n", sibling, "exec"), namespace)
    with xrt.kernel_policy(KernelPolicy(toy="f64", validate=False)), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        namespace["call"](Dispatcher(registry).run, np.random.default_rng().standard_normal(3).astype(np.float32))
    (warning,) = [w for w in caught if issubclass(w.category, KernelFallbackWarning)]
    assert warning.filename == sibling


def test_an_option_passed_as_a_preference_says_it_is_an_option():
    """{'strict': 'true'} as preferences used to answer "unknown ... 'strict'. Did you mean 'strict'?"."""
    from xpuruntime.errors import PolicyError

    with pytest.raises(PolicyError, match="'strict' is a policy option, not an op"):
        KernelPolicy({"strict": "true"})


def test_kernel_dtypes_that_cannot_be_iterated_give_a_registration_error():
    class Hostile:
        def __iter__(self):
            raise ValueError("hostile object")

    with pytest.raises(
        xrt.RegistrationError,
        match=r"kernel 'attention'/'k': field 'dtypes' expected a collection of dtype names, got Hostile",
    ):
        xrt.kernel("attention", "k", backend="cpu", dtypes=Hostile())
    with pytest.raises(xrt.RegistrationError, match="'dtypes'"):
        xrt.kernel("attention", "k", backend="cpu", dtypes=[["float32"]])  # unhashable items


def test_declaring_a_kernel_whose_op_name_cannot_be_printed_still_names_the_problem():
    """Found by the API fuzz on the H100: an op whose str() raises, with an unknown hint."""

    class Unprintable:
        def __str__(self) -> str:
            raise TypeError("no str")

    with pytest.raises(RegistrationError, match="unknown hint 'dtypess'"):
        xrt.kernel(Unprintable(), "k", backend="cpu", dtypess={"float32"})
