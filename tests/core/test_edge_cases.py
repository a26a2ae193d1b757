"""Calls at the edges: cache keys that must not merge, odd argument types, registry changes mid-call."""

from __future__ import annotations

import gc
import threading
import warnings

import numpy as np
import pytest
from conftest import make_toy_registry

import xpuruntime as xrt
from xpuruntime import policy, registry
from xpuruntime.abi import TensorSpec
from xpuruntime.dispatch import Dispatcher
from xpuruntime.errors import (
    ArgumentError,
    KernelFallbackWarning,
    LayoutError,
    PolicyError,
    UnknownKernelError,
    UnknownOpError,
)  # fmt: skip
from xpuruntime.policy import KernelPolicy
from xpuruntime.registry import kernel

rng = np.random.default_rng(11)
X = rng.standard_normal((3, 4)).astype(np.float32)


@pytest.mark.parametrize(
    ("valid", "invalid"),
    [
        (lambda: xrt.ops.sum(X, keepdims=True), lambda: xrt.ops.sum(X, keepdims=1)),
        (lambda: xrt.ops.sum(X, axis=1), lambda: xrt.ops.sum(X, axis=1.0)),
        (lambda: xrt.ops.softmax(X, axis=1), lambda: xrt.ops.softmax(X, axis=True)),
        (lambda: xrt.ops.attention(X, X, X, scale=1), lambda: xrt.ops.attention(X, X, X, scale=True)),
    ],
)
def test_equal_but_differently_typed_attributes_do_not_share_a_plan(valid, invalid):
    valid()  # warm the plan cache with the valid spelling; True == 1 == 1.0 as dict keys
    with pytest.raises(ArgumentError):
        invalid()


def test_a_kernel_registered_during_selection_is_not_hidden_by_a_stale_plan():
    reg = make_toy_registry({"name": "slow", "priority": 1})
    dispatcher = Dispatcher(reg)

    def register_meanwhile(ctx):  # stands in for another thread registering while we select
        if "fast" not in reg.kernels["toy"]:
            reg.register_kernel(kernel("toy", "fast", backend="cpu", priority=100)(lambda args: args.out.fill(7)))

    reg.register_kernel(kernel("toy", "probe", backend="cpu", conditions=(register_meanwhile,))(lambda a: None))
    x = np.zeros(3)
    dispatcher.run("toy", (x,))
    np.testing.assert_array_equal(dispatcher.run("toy", (x,)), 7)


def test_loading_a_backend_that_looks_at_the_registry_does_not_deadlock(tmp_path, monkeypatch):
    (tmp_path / "selfish_backend").mkdir()
    (tmp_path / "selfish_backend" / "__init__.py").write_text(
        "import numpy as np\n"
        "from xpuruntime.registry import Backend, default_registry\n"
        "assert 'matmul' in default_registry().ops  # re-entrant: sees the registry loaded so far\n"
        "BACKEND = Backend('selfish', 'cpu', empty=lambda s, d, dev, stream: np.empty(s, d))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    load_builtins = registry.Registry.load_builtins

    def load_builtins_and_selfish(self):
        load_builtins(self)
        self.load_backend("selfish_backend")

    monkeypatch.setattr(registry.Registry, "load_builtins", load_builtins_and_selfish)
    monkeypatch.setattr(registry, "_default", None)
    monkeypatch.setattr(registry, "_default_ready", False)
    loaded = []
    worker = threading.Thread(target=lambda: loaded.append(registry.default_registry()), daemon=True)
    worker.start()
    worker.join(timeout=30)
    assert loaded, "default_registry() deadlocked while a backend module used it"
    assert "selfish" in loaded[0].backends


def _readonly(like: np.ndarray) -> np.ndarray:
    out = np.empty_like(like)
    out.setflags(write=False)
    return out


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: xrt.ops.softmax(X, out=1.0), "softmax: argument 'out' expected an array, got float"),
        (lambda: xrt.ops.softmax(TensorSpec((3, 4))), "softmax: argument 'x' expected an array, got a TensorSpec"),
        (lambda: xrt.ops.softmax([[1.0], [1.0, 2.0]]), "softmax: argument 'x' expected an array, got list"),
        (lambda: xrt.default_dispatcher().run("sum", (X,), (0, False, 1)), "sum: expected inputs"),
        (lambda: xrt.default_dispatcher().run("layer_norm", (X, None, None), ()), "layer_norm: expected inputs"),
        (lambda: xrt.default_dispatcher().plan("layer_norm", X), r"attribute\(s\) \['normalized_shape'\] have no default"),
        (lambda: xrt.ops.softmax(X, out=_readonly(X)), "softmax: argument 'out' expected a writable array"),
    ],
)  # fmt: skip
def test_odd_arguments_get_argument_errors(call, message):
    with pytest.raises(ArgumentError, match=message):
        call()


def test_trailing_attributes_with_defaults_may_be_left_out():
    """An op can gain an attribute without breaking callers of the positional form that pass the shorter tuple
    (rms_norm gained offset and casting after eps)."""
    run = xrt.default_dispatcher().run
    np.testing.assert_array_equal(run("sum", (X,), (0,)), run("sum", (X,), (0, False)))
    short = run("rms_norm", (X, None), ((4,), 1e-6))
    np.testing.assert_array_equal(short, run("rms_norm", (X, None), ((4,), 1e-6, 0.0, "torch")))


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_numpy_values_work_where_python_values_do():
    np.testing.assert_allclose(xrt.ops.attention(X, X, X, scale=np.array(0.5)), xrt.ops.attention(X, X, X, scale=0.5))
    np.testing.assert_array_equal(xrt.ops.sum(X, axis=np.array([0])), xrt.ops.sum(X, axis=0))
    np.testing.assert_array_equal(xrt.ops.sum(X, axis=[0, 1]), xrt.ops.sum(X, axis=(0, 1)))
    np.testing.assert_allclose(xrt.ops.layer_norm(X, [4]), xrt.ops.layer_norm(X, (4,)))
    np.testing.assert_array_equal(
        xrt.ops.sin_affine(X, np.float64(2.0), np.float32(1.0)), xrt.ops.sin_affine(X, 2.0, 1.0)
    )
    matrix = np.asmatrix(X)
    np.testing.assert_array_equal(xrt.ops.sum(matrix, axis=0), X.sum(axis=0, dtype=np.float64).astype(np.float32))


def test_rms_norm_default_eps_for_bfloat16_needs_no_numpy_support():
    explanation = xrt.explain("rms_norm", TensorSpec((4, 8), "bfloat16"), normalized_shape=8, show=False)
    assert explanation.ctx.attrs["eps"] == 2.0**-7


def test_gemv_writes_a_non_native_byte_order_output():
    a, b = rng.standard_normal((1, 4)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)
    out = np.empty((1, 3), dtype=">f4")  # float32 by name, big-endian in memory
    with xrt.kernel_policy(matmul="gemv", strict=True):
        assert xrt.ops.matmul(a, b, out=out) is out
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-6)


def test_structured_field_views_are_rejected_with_a_clear_error():
    records = np.zeros(5, dtype=[("a", "f4"), ("b", "i2")])
    records["a"] = np.arange(5)
    with pytest.raises(LayoutError, match="not a multiple of its itemsize 4"):
        xrt.ops.sin_affine(records["a"], 1.0)


def test_fallback_warning_points_at_the_callers_line():
    a = np.ones((3, 3), np.float32)
    with warnings.catch_warnings(record=True) as caught, xrt.kernel_policy(matmul="gemv"):
        warnings.simplefilter("always")
        xrt.ops.matmul(a, a)
    [warning] = [w for w in caught if issubclass(w.category, KernelFallbackWarning)]
    assert warning.filename == __file__


def test_nested_scopes_check_only_their_own_names():
    toy_dispatcher = Dispatcher(make_toy_registry({"name": "a"}, {"name": "b"}))
    with xrt.kernel_policy(KernelPolicy(toy="b", validate=toy_dispatcher.registry)):
        with xrt.kernel_policy(softmax="numpy"):  # 'toy' is unknown to the default registry: not re-checked
            assert np.array_equal(toy_dispatcher.run("toy", (np.zeros(2),)), np.ones(2))
        with pytest.raises(UnknownKernelError), xrt.kernel_policy(softmax="nump"):
            pass
    with pytest.raises(UnknownOpError):
        KernelPolicy(toy="b")


def test_environment_policy_names_are_checked_when_their_op_runs(monkeypatch):
    monkeypatch.setenv(policy.ENV_POLICY, "matmul=blockd")
    a = np.ones((2, 2), np.float32)
    xrt.ops.sum(a)  # other ops are unaffected by a matmul preference
    with pytest.raises(
        UnknownKernelError, match=r"\$XPURUNTIME_POLICY: unknown kernel 'blockd' for op 'matmul'. Did you"
    ):
        xrt.ops.matmul(a, a)
    spec = xrt.register_kernel("matmul", "blockd", backend="cpu")(lambda args: np.matmul(*args.inputs, out=args.out))
    try:  # a kernel registered after the environment was read is found
        assert xrt.default_dispatcher().plan("matmul", a, a).kernel.name == "blockd"
    finally:
        xrt.default_registry().unregister_kernel(spec.op, spec.name)


def test_malformed_environment_policy_raises_at_every_use(monkeypatch):
    monkeypatch.setenv(policy.ENV_POLICY, "matmul")
    for _ in range(2):
        with pytest.raises(PolicyError, match=r"\$XPURUNTIME_POLICY: expected 'op=kernel'"):
            xrt.ops.sum(np.ones(3))


def test_dropped_dispatchers_do_not_stay_registered():
    reg = make_toy_registry({"name": "a"})
    for _ in range(50):
        Dispatcher(reg)
    gc.collect()
    reg.register_kernel(kernel("toy", "b", backend="cpu")(lambda a: None))
    assert len(reg._listeners) == 0


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


def test_plan_cache_put_rechecks_validity_under_its_lock():
    cache = Dispatcher(make_toy_registry({"name": "a"})).plans
    plan = object.__new__(__import__("xpuruntime.plan", fromlist=["Plan"]).Plan)
    cache.put("k", plan, still_valid=lambda: False)
    assert len(cache) == 0
    cache.put("k", plan, still_valid=lambda: True)
    assert len(cache) == 1


def test_element_types_of_tuple_attributes_are_part_of_the_key():
    xrt.ops.layer_norm(X, (4,))
    with pytest.raises(ArgumentError, match=r"expected an int or a tuple of ints, got \(4\.0,\)"):
        xrt.ops.layer_norm(X, (4.0,))
    xrt.ops.sum(X, axis=(1,))
    with pytest.raises(ArgumentError, match="expected an int, got True"):
        xrt.ops.sum(X, axis=(True,))


@pytest.mark.parametrize("value", [{0}, {0: 1}, slice(1)])  # slices are hashable from Python 3.12 on
def test_unhashable_or_odd_attributes_are_argument_errors(value):
    with pytest.raises(ArgumentError, match=r"sum: argument 'axis' expected (a number, bool, None or tuple|an int)"):
        xrt.ops.sum(X, axis=value)


def test_explain_and_plan_take_the_ops_input_defaults_and_reject_extra_inputs():
    assert xrt.explain("sin_affine", X, show=False).selected == "numpy"
    assert xrt.default_dispatcher().plan("sin_affine", X).kernel.name == "numpy"
    with pytest.raises(ArgumentError, match=r"matmul: expected at most 2 inputs \('a', 'b'\), got 3"):
        xrt.explain("matmul", X, X.T, X, show=False)
    with pytest.raises(ArgumentError, match="matmul: argument 'b' is required"):
        xrt.explain("matmul", X, show=False)


def test_unknown_kernel_hints_are_caught_at_the_decorator():
    with pytest.raises(
        xrt.RegistrationError, match=r"unknown hint 'prio' for kernel 'matmul/x'. Did you mean 'priority'"
    ):
        xrt.register_kernel("matmul", "x", backend="cpu", prio=3)


def test_uint64_sums_do_not_wrap():
    assert xrt.ops.sum(np.array([2**64 - 1], np.uint64)) == 2**64 - 1
    assert xrt.ops.sum(np.array([2**63, 2**62], np.uint64)).dtype == np.uint64


def test_masked_arrays_and_dropout_are_refused_clearly():
    with pytest.raises(ArgumentError, match="softmax: argument 'x' is a masked array"):
        xrt.ops.softmax(np.ma.masked_array(X, mask=X > 0))
    with pytest.raises(ArgumentError, match=r"attention: argument 'dropout_p' expected 0.0"):
        xrt.ops.attention(X, X, X, dropout_p=0.1)


def test_log_and_profiler_share_one_record_per_dispatch_with_os_thread_ids():
    xrt.enable_dispatch_logging()
    with xrt.profiler() as prof:
        xrt.ops.matmul(X, X.T)
    [record] = xrt.get_dispatch_logs()
    assert prof.ops[0].record is record
    assert prof.ops[0].thread_id == threading.get_native_id()
    trace = prof.chrome_trace()["traceEvents"]
    assert all(e["tid"] < 2**32 for e in trace if e["ph"] == "X")  # Perfetto's JSON importer needs 32-bit tids
