"""Plan cache: one decision per signature, hits skip selection, policy and registry changes, LRU bound, and keys
that must not merge (attributes of another type, a zero constant's sign, a recycled policy fingerprint)."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from conftest import make_toy_registry

import xpuruntime as xrt
from xpuruntime.dispatch import Dispatcher
from xpuruntime.errors import (
    ArgumentError,
)  # fmt: skip
from xpuruntime.plan import PlanCache
from xpuruntime.policy import KernelPolicy
from xpuruntime.registry import kernel
from xpuruntime.runtime.workspace import WorkspaceManager

rng = np.random.default_rng(11)
X = rng.standard_normal((3, 4)).astype(np.float32)


def counting_dispatcher(monkeypatch, *kernels):
    dispatcher = Dispatcher(make_toy_registry(*kernels))
    calls = []
    original = dispatcher.selector.select
    monkeypatch.setattr(dispatcher.selector, "select", lambda ctx, policy: calls.append(ctx) or original(ctx, policy))
    return dispatcher, calls


def test_one_decision_per_signature(monkeypatch):
    dispatcher, selections = counting_dispatcher(monkeypatch, {"name": "a"})
    x = np.ones((4, 6), np.float32)
    for _ in range(5):
        dispatcher.run("toy", (x,))
    assert len(selections) == 1
    stats = dispatcher.plans.stats()
    assert (stats.hits, stats.misses, stats.size) == (4, 1, 1) and stats.hit_rate == 0.8
    dispatcher.run("toy", (np.ones((4, 6), np.float32),))  # a new array with the same signature: hit
    dispatcher.run("toy", (np.ones((4, 7), np.float32),))  # new shape
    dispatcher.run("toy", (np.ones((4, 6), np.float64),))  # new dtype
    dispatcher.run("toy", (x.T,))  # new layout (strides)
    dispatcher.run("toy", (x[:, ::2],))
    assert len(selections) == 5 and len(dispatcher.plans) == 5


def test_policy_changes_select_again_without_invalidation(monkeypatch):
    dispatcher, selections = counting_dispatcher(monkeypatch, {"name": "a", "priority": 1}, {"name": "b"})
    x = np.ones(3)
    dispatcher.run("toy", (x,))
    with xrt.kernel_policy(KernelPolicy(toy="b", validate=False)):
        assert np.array_equal(dispatcher.run("toy", (x,)), x + 1)
    assert np.array_equal(dispatcher.run("toy", (x,)), x)  # the old plan is still valid and reused
    with xrt.kernel_policy(KernelPolicy(toy="b", validate=False)):  # equal content: same fingerprint
        dispatcher.run("toy", (x,))
    assert len(selections) == 2


def test_registering_or_removing_a_kernel_drops_only_that_ops_plans():
    dispatcher = xrt.Dispatcher()
    a, x = np.ones((3, 3), np.float32), np.ones(5, np.float32)
    dispatcher.run("matmul", (a, a))
    dispatcher.run("softmax", (x,), (-1,))
    assert len(dispatcher.plans) == 2

    def launch(args):
        np.multiply(np.matmul(*args.inputs), 2, out=args.out)

    spec = dispatcher.registry.register_kernel(kernel("matmul", "test_doubling", backend="cpu", priority=1000)(launch))
    try:
        assert len(dispatcher.plans) == 1  # softmax's plan survives
        np.testing.assert_array_equal(dispatcher.run("matmul", (a, a)), 2 * (a @ a))  # new kernel wins now
    finally:
        dispatcher.registry.unregister_kernel(spec.op, spec.name)
    np.testing.assert_array_equal(dispatcher.run("matmul", (a, a)), a @ a)
    assert dispatcher.plans.stats().invalidations == 2


def test_lru_bound_keeps_recently_used_plans():
    dispatcher = Dispatcher(make_toy_registry({"name": "a"}), plan_cache_size=8)
    hot = np.ones(1)
    for n in range(2, 40):
        dispatcher.run("toy", (hot,))  # keep one signature hot
        dispatcher.run("toy", (np.ones(n),))
    stats = dispatcher.plans.stats()
    assert stats.size <= 8 and stats.evictions >= 30
    misses = stats.misses
    dispatcher.run("toy", (hot,))
    assert dispatcher.plans.stats().misses == misses  # the hot plan was never evicted
    dispatcher.run("toy", (np.ones(2),))
    assert dispatcher.plans.stats().misses == misses + 1  # an old one was


def test_plan_cache_rejects_bad_size_and_clears():
    with pytest.raises(ValueError, match="maxsize"):
        PlanCache(0)
    dispatcher = Dispatcher(make_toy_registry({"name": "a"}))
    dispatcher.run("toy", (np.ones(2),))
    dispatcher.plans.clear()
    assert dispatcher.plans.stats() == dispatcher.plans.stats().__class__(0, 0, 0, 0, 0, 4096)


def test_plan_records_launch_config_and_workspace():
    q = np.ones((2, 300, 16), np.float32)
    with xrt.kernel_policy(attention="chunked", strict=True):
        plan = xrt.default_dispatcher().plan("attention", q, q, q)
    assert plan.config.params == {"BLOCK_Q": 128, "BLOCK_K": 256}
    assert plan.config.grid == (2, 3)
    assert plan.workspace_bytes == 2 * 128 * 256 * 4
    assert "chunked" in repr(plan) and "BLOCK_K=256" in repr(plan)


def test_fallback_plans_are_noted_per_op_and_policy(monkeypatch):
    """`Dispatcher.fallbacks` lets the PyTorch front end skip building a plan key in every backward."""
    dispatcher, _ = counting_dispatcher(monkeypatch, {"name": "a"}, {"name": "f64", "dtypes": {"float64"}})
    prefers_f64 = KernelPolicy(toy="f64", validate=False)
    with xrt.kernel_policy(prefers_f64):
        dispatcher.run("toy", (np.ones(3, np.float64),))  # the preferred kernel runs: no fallback
        assert dispatcher.fallbacks == set()
        with pytest.warns(xrt.KernelFallbackWarning):
            dispatcher.run("toy", (np.ones(3, np.float32),))
    assert dispatcher.fallbacks == {("toy", prefers_f64.fingerprint)}


def test_workspace_views_are_reused_until_the_buffer_grows():
    manager = WorkspaceManager()
    empty = lambda shape, dtype, device, stream: np.zeros(shape, dtype)  # noqa: E731
    first = manager.lend(64, "cpu", empty)
    assert manager.lend(64, "cpu", empty) is first  # the cached view: no slicing per call
    smaller = manager.lend(32, "cpu", empty)
    assert smaller.nbytes == 32 and np.shares_memory(first, smaller)
    grown = manager.lend(128, "cpu", empty)
    again = manager.lend(64, "cpu", empty)
    assert again is not first and again.nbytes == 64 and np.shares_memory(again, grown)
    assert not np.shares_memory(again, first) and manager.peak_bytes == 128
    stream_a, stream_b = object(), object()  # one buffer per stream: never shared scratch
    on_a, on_b = manager.lend(64, "cpu", empty, stream_a), manager.lend(64, "cpu", empty, stream_b)
    assert not np.shares_memory(on_a, on_b) and not np.shares_memory(on_a, again)
    assert manager.lend(64, "cpu", empty, stream_a) is on_a


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


def test_element_types_of_tuple_attributes_are_part_of_the_key():
    xrt.ops.layer_norm(X, (4,))
    with pytest.raises(ArgumentError, match=r"expected an int or a tuple of ints, got \(4\.0,\)"):
        xrt.ops.layer_norm(X, (4.0,))
    xrt.ops.sum(X, axis=(1,))
    with pytest.raises(ArgumentError, match="expected an int, got True"):
        xrt.ops.sum(X, axis=(True,))


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


def test_plan_cache_put_rechecks_validity_under_its_lock():
    cache = Dispatcher(make_toy_registry({"name": "a"})).plans
    plan = object.__new__(__import__("xpuruntime.plan", fromlist=["Plan"]).Plan)
    cache.put("k", plan, still_valid=lambda: False)
    assert len(cache) == 0
    cache.put("k", plan, still_valid=lambda: True)
    assert len(cache) == 1


def test_fused_programs_differing_in_a_zero_constants_sign_do_not_share_a_plan():
    x = np.random.default_rng().uniform(0.5, 2.0, 6).astype(np.float32)
    for zero in (0.0, -0.0):
        program = (("div", ("in", 0), ("c", zero)),)
        got = xrt.ops.fused_elementwise(program, x)
        with np.errstate(divide="ignore"):
            want = x.astype(np.float64) / zero
        np.testing.assert_array_equal(got, want.astype(np.float32))


def test_a_fingerprint_held_by_a_plan_key_is_never_given_to_other_content():
    registry = make_toy_registry({"name": "a"}, {"name": "b"})
    dispatcher = xrt.Dispatcher(registry)
    x = rng.standard_normal(4).astype(np.float32)
    with xrt.kernel_policy(KernelPolicy(toy="b", validate=False)):
        np.testing.assert_array_equal(dispatcher.run("toy", (x,)), x + 1)
    gc.collect()
    with xrt.kernel_policy(KernelPolicy(toy="a", validate=False)):  # new content: must not hit b's plan
        np.testing.assert_array_equal(dispatcher.run("toy", (x,)), x + 0)
    with xrt.kernel_policy(KernelPolicy(toy="b", validate=False)):  # old content: b's plan again
        np.testing.assert_array_equal(dispatcher.run("toy", (x,)), x + 1)
    assert dispatcher.plans.stats().hits == 1
