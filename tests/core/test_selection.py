"""Selection rules: filtering with reasons, scoring, ties, policy win, fallback (and the line its warning names),
strict, unknown names, conditions that raise."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
from conftest import make_toy_registry, toy_context

import xpuruntime as xrt
from xpuruntime.abi import TensorSpec
from xpuruntime.dispatch import Dispatcher
from xpuruntime.errors import (
    KernelFallbackWarning,
    NoKernelError,
    RegistrationError,
    UnknownKernelError,
    UnknownOpError,
    UnsupportedByPolicyError,
)  # fmt: skip
from xpuruntime.policy import KernelPolicy
from xpuruntime.registry import Backend, kernel
from xpuruntime.selector import Selector, default_scorer


def only_float64(ctx):
    return None if ctx.dtype == "float64" else f"needs float64, got {ctx.dtype}"


def which_kernel(dispatcher: Dispatcher, x: np.ndarray) -> int:
    """Index of the toy kernel that ran (each adds its index to x)."""
    y = dispatcher.run("toy", (x,))
    offsets = np.unique(y - x)
    assert len(offsets) == 1, offsets
    return int(offsets[0])


def test_default_scorer_adds_fused_and_tensor_core_bonuses():
    registry = make_toy_registry({"name": "k"})
    plain = kernel("toy", "plain", backend="cpu", priority=7)(lambda a: None)
    fused = kernel("toy", "fused", backend="cpu", priority=7, fused=True)(lambda a: None)
    tc = kernel("toy", "tc", backend="cpu", priority=7, tensor_cores=True)(lambda a: None)
    both = kernel("toy", "both", backend="cpu", priority=7, fused=True, tensor_cores=True)(lambda a: None)
    sm90, sm75, cpu = (toy_context(registry, compute_capability=cc) for cc in ((9, 0), (7, 5), None))
    assert default_scorer(plain, sm90) == 7
    assert default_scorer(fused, cpu) == 57
    assert default_scorer(tc, sm90) == 37
    assert default_scorer(tc, (sm80 := toy_context(registry, compute_capability=(8, 0)))) == 37
    assert default_scorer(tc, sm75) == 7  # tensor-core bonus only on sm80+
    assert default_scorer(tc, cpu) == 7
    assert default_scorer(both, sm80) == 87


def test_selector_picks_highest_score_and_records_every_candidate():
    registry = make_toy_registry(
        {"name": "low", "priority": 1},
        {"name": "high", "priority": 5},
        {"name": "fused", "priority": 0, "fused": True},
        {"name": "f64only", "priority": 100, "conditions": (only_float64,)},
    )
    decision = Selector(registry).select(toy_context(registry), KernelPolicy(validate=False))
    assert decision.kernel.name == "fused" and decision.reason == "auto"
    verdicts = {c.kernel.name: (c.score, c.reasons) for c in decision.candidates}
    assert verdicts == {
        "fused": (50.0, ()), "high": (5.0, ()), "low": (1.0, ()),
        "f64only": (None, ("needs float64, got float32",)),
    }  # fmt: skip
    assert [c.kernel.name for c in decision.candidates] == ["fused", "high", "low", "f64only"]


def test_condition_answers_may_be_string_list_or_empty():
    registry = make_toy_registry(
        {"name": "many", "conditions": (lambda ctx: ["reason one", "reason two"],)},
        {"name": "none", "conditions": (lambda ctx: None, lambda ctx: [], lambda ctx: "")},
    )
    candidates = {c.kernel.name: c for c in Selector(registry).evaluate(toy_context(registry))}
    assert candidates["many"].reasons == ("reason one", "reason two")
    assert candidates["none"].supported


@pytest.mark.parametrize("order", [("zeta", "alpha", "mid"), ("mid", "zeta", "alpha"), ("alpha", "mid", "zeta")])
def test_ties_are_broken_by_name_whatever_the_registration_order(order):
    registry = make_toy_registry(*({"name": n, "priority": 3} for n in order))
    assert Selector(registry).select(toy_context(registry), KernelPolicy(validate=False)).kernel.name == "alpha"


def test_replaceable_scorer():
    registry = make_toy_registry({"name": "a", "priority": 10}, {"name": "b", "priority": 0})
    cost_model = Selector(registry, scorer=lambda k, ctx: -k.priority)
    assert cost_model.select(toy_context(registry), KernelPolicy(validate=False)).kernel.name == "b"


def test_declared_limits_give_reasons():
    registry = make_toy_registry(
        {"name": "halfonly", "dtypes": {"float16"}},
        {"name": "hopper", "min_compute_capability": (9, 0)},
        {"name": "racy", "deterministic": False},
        {"name": "ok"},
    )
    ctx = toy_context(registry, compute_capability=(8, 6), deterministic=True)
    reasons = {c.kernel.name: c.reasons for c in Selector(registry).evaluate(ctx)}
    assert reasons["halfonly"] == ("dtype float32 not in {float16}",)
    assert reasons["hopper"] == ("needs sm90+, device has sm86",)
    assert reasons["racy"] == ("not deterministic (policy asks for deterministic=True)",)
    assert reasons["ok"] == ()


def test_unavailable_backend_and_wrong_device_are_reasons():
    registry = make_toy_registry({"name": "host"})
    registry.register_backend(Backend("gpu", "cuda", empty=None, probe=lambda: "libfoo.so not found"))
    registry.register_kernel(kernel("toy", "gpu_kernel", backend="gpu", priority=99)(lambda a: None))
    reasons = {c.kernel.name: c.reasons for c in Selector(registry).evaluate(toy_context(registry))}
    assert reasons["gpu_kernel"] == ("backend 'gpu' unavailable: libfoo.so not found",)
    registry2 = make_toy_registry({"name": "host"})
    cuda_ctx = toy_context(registry2, inputs=(TensorSpec((4, 4), device="cuda:0"),), device="cuda:0")
    assert Selector(registry2).evaluate(cuda_ctx)[0].reasons == ("runs on cpu, arguments are on cuda:0",)


def test_crashing_probe_means_unavailable_not_a_crash():
    def probe():
        raise OSError("driver exploded")

    backend = Backend("flaky", "cuda", empty=None, probe=probe)
    assert "driver exploded" in backend.unavailable_reason


def test_policy_preference_wins_over_score():
    registry = make_toy_registry({"name": "best", "priority": 100}, {"name": "worst", "priority": 0})
    dispatcher = Dispatcher(registry)
    x = np.arange(6.0).reshape(2, 3)
    assert which_kernel(dispatcher, x) == 0
    with xrt.kernel_policy(KernelPolicy(toy="worst", validate=False)):
        assert which_kernel(dispatcher, x) == 1
        assert dispatcher.plan("toy", x).reason == "policy"
    assert dispatcher.plan("toy", x).reason == "auto"


def test_unsupported_preference_warns_once_per_signature_and_falls_back():
    registry = make_toy_registry({"name": "any", "priority": 1}, {"name": "f64", "conditions": (only_float64,)})
    dispatcher = Dispatcher(registry)
    x32 = np.ones((2, 2), np.float32)
    with xrt.kernel_policy(KernelPolicy(toy="f64", validate=False)), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            assert which_kernel(dispatcher, x32) == 0
        assert which_kernel(dispatcher, np.ones((3, 3), np.float32)) == 0  # new signature: warns again
        assert which_kernel(dispatcher, np.ones((3, 3))) == 1  # float64: the preference applies
        assert dispatcher.plan("toy", x32).reason == "fallback"
    fallbacks = [w for w in caught if issubclass(w.category, KernelFallbackWarning)]
    assert len(fallbacks) == 2
    assert "prefers 'f64'" in str(fallbacks[0].message) and "needs float64, got float32" in str(fallbacks[0].message)
    assert "Falling back to 'any'" in str(fallbacks[0].message)


def test_strict_policy_error_lists_every_candidate_and_reason():
    registry = make_toy_registry(
        {"name": "any"}, {"name": "f64", "conditions": (only_float64,)}, {"name": "half", "dtypes": {"float16"}}
    )
    dispatcher = Dispatcher(registry)
    with xrt.kernel_policy(KernelPolicy(toy="f64", strict=True, validate=False)):
        with pytest.raises(UnsupportedByPolicyError) as info:
            dispatcher.run("toy", (np.ones(3, np.float32),))
        assert which_kernel(dispatcher, np.ones(3)) == 1  # supported: strict changes nothing
    message = str(info.value)
    assert "strict policy prefers 'f64'" in message
    for line in ("f64 [cpu]: needs float64, got float32", "half [cpu]: dtype float32 not in {float16}",
                 "any [cpu]: supported (score 0)"):  # fmt: skip
        assert line in message


def test_no_supported_kernel_is_an_error_with_reasons():
    registry = make_toy_registry({"name": "f64", "conditions": (only_float64,)}, {"name": "h", "dtypes": {"float16"}})
    with pytest.raises(NoKernelError) as info:
        Dispatcher(registry).run("toy", (np.ones(2, np.float32),))
    assert "no registered kernel supports this call" in str(info.value)
    assert "f64 [cpu]: needs float64, got float32" in str(info.value)
    assert "h [cpu]: dtype float32 not in {float16}" in str(info.value)


def test_unknown_names_suggest_the_closest_and_list_known():
    with pytest.raises(UnknownOpError) as info:
        xrt.KernelPolicy(matmull="blocked")
    assert "Did you mean 'matmul'?" in str(info.value) and "attention" in str(info.value)
    with pytest.raises(UnknownKernelError) as info:
        xrt.KernelPolicy(matmul="blockd")
    assert "Did you mean 'blocked'?" in str(info.value)
    known = ", ".join(sorted(k.name for k in xrt.default_registry().kernels_for("matmul")))
    assert f"Known: {known}" in str(info.value)  # every registered matmul kernel, GPU ones included
    with pytest.raises(UnknownKernelError, match="Did you mean 'numpy_blas'"):
        xrt.KernelPolicy(matmul="NUMPY_BLAS")
    with pytest.raises(UnknownOpError, match="Did you mean 'softmax'"):
        xrt.default_dispatcher().run("softmaxx", (np.ones(3),))


def test_duplicate_kernel_name_for_an_op_is_an_error():
    registry = make_toy_registry({"name": "k"})
    with pytest.raises(RegistrationError, match="a kernel named 'k' is already registered"):
        registry.register_kernel(kernel("toy", "k", backend="cpu")(lambda a: None))
    with pytest.raises(UnknownOpError):
        registry.register_kernel(kernel("nosuch", "k", backend="cpu")(lambda a: None))


def test_builtin_matmul_selection_on_cpu():
    a, b = np.ones((8, 8), np.float32), np.ones((8, 8), np.float32)
    assert xrt.default_dispatcher().plan("matmul", a, b).kernel.name == "numpy_blas"
    assert xrt.default_dispatcher().plan("matmul", a, b[:, 0]).kernel.name == "gemv"
    ints = np.ones((8, 8), np.int32)
    assert xrt.default_dispatcher().plan("matmul", ints, ints).kernel.name == "numpy_blas"
    explanation = xrt.explain("matmul", ints, ints, show=False)
    rows = {r["kernel"]: r for r in explanation.rows()}
    assert rows["blocked"]["verdict"] == "rejected" and "dtype int32" in rows["blocked"]["reasons"][0]


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


def test_a_fallback_warning_points_at_a_sibling_package_calling_us(tmp_path):
    """Frames of a package whose path merely starts like ours (xpuruntime_plugins/) are the caller's."""
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


def test_fallback_warning_points_at_the_callers_line():
    a = np.ones((3, 3), np.float32)
    with warnings.catch_warnings(record=True) as caught, xrt.kernel_policy(matmul="gemv"):
        warnings.simplefilter("always")
        xrt.ops.matmul(a, a)
    [warning] = [w for w in caught if issubclass(w.category, KernelFallbackWarning)]
    assert warning.filename == __file__


def test_a_faulty_condition_rejects_its_kernel_instead_of_breaking_the_op():
    def crashes(ctx):
        return ctx.attrs["nope"]

    reg = make_toy_registry({"name": "ok"}, {"name": "crashy", "priority": 9, "conditions": (crashes,)},
                            {"name": "truthy", "priority": 9, "conditions": (lambda ctx: True,)})  # fmt: skip
    dispatcher = Dispatcher(reg)
    np.testing.assert_array_equal(dispatcher.run("toy", (np.zeros(2),)), np.zeros(2))  # "ok" (index 0) ran
    rows = {r["kernel"]: r["reasons"] for r in dispatcher.explain("toy", np.zeros(2)).rows()}
    assert rows["crashy"] == ["condition crashes raised KeyError('nope')"]
    assert "answered True; expected None, a reason string or a list of them" in rows["truthy"][0]
