"""Autotune and the tuning cache: a winner timed under one math mode, or with one optional argument given, is
never reused for a call that differs there, and XPURUNTIME_PRINT_AUTOTUNING reports each result and where it
came from (timing is faked; nothing here needs a GPU)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_toy_registry

import xpuruntime as xrt
from xpuruntime import autotune
from xpuruntime.dispatch import Dispatcher
from xpuruntime.registry import Backend, Registry, kernel
from xpuruntime.runtime import tuning_cache
from xpuruntime.schema import OpSchema


@pytest.fixture
def tuning_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(tuning_cache.ENV_CACHE_DIR, str(tmp_path))
    monkeypatch.setattr(tuning_cache, "_default", None)
    autotune.STORE.memory.clear()
    yield tmp_path
    autotune.STORE.memory.clear()


def fake_timing(monkeypatch, times_for):
    """Tuning reports `times_for(ctx)` (µs per kernel name) instead of timing anything."""
    calls = []

    def time_candidates(dispatcher, decision, candidates, inputs, policy):
        calls.append(decision.ctx)
        times = times_for(decision.ctx)
        return {c.kernel.name: times[c.kernel.name] for c in candidates}

    monkeypatch.setattr(autotune, "time_candidates", time_candidates)
    return calls


def test_autotune_never_reuses_a_winner_timed_under_another_math_mode(tuning_dir, monkeypatch):
    registry = make_toy_registry({"name": "k0"}, {"name": "k1"})  # kernel i writes x + i
    fast = {"tf32": "k0", "fp32": "k1"}
    calls = fake_timing(
        monkeypatch, lambda ctx: {n: 1.0 if n == fast[ctx.math_mode.value] else 9.0 for n in fast.values()}
    )
    x = np.random.default_rng().standard_normal(7).astype(np.float32)
    for mode in ("tf32", "fp32"):
        with xrt.kernel_policy(xrt.KernelPolicy(toy="autotune", math_mode=mode, validate=registry)):
            y = Dispatcher(registry).run("toy", (x,))
        ran = round(float((y - x).mean()))
        assert ran == int(fast[mode][1]), f"under {mode} the winner timed under another math mode ran"
    assert [c.math_mode.value for c in calls] == ["tf32", "fp32"]


def pair_registry() -> Registry:
    """An op y = x * w + b whose two optional tensors have the same shape and dtype."""
    registry = Registry()
    registry.register_op(
        OpSchema(
            name="pair", inputs=("x", "w", "b"), optional=frozenset({"w", "b"}),
            infer_dtype=lambda ctx: ctx.tensor("x").dtype, infer_shape=lambda ctx: ctx.tensor("x").shape,
            reference=lambda x, w, b: np.asarray(x, np.float64),
        )
    )  # fmt: skip
    registry.register_backend(Backend("cpu", "cpu", empty=lambda shape, dtype, device, stream: np.empty(shape, dtype)))
    for index in range(2):

        def launch(args, index=index):
            np.add(args.inputs[0], index, out=args.out)

        registry.register_kernel(kernel("pair", f"k{index}", backend="cpu")(launch))
    return registry


def test_autotune_keys_which_optional_argument_was_given(tuning_dir, monkeypatch):
    registry = pair_registry()
    fast = {"w": "k0", "b": "k1"}  # say k0 is fast with a weight, k1 with a bias

    def times_for(ctx):
        given = "w" if ctx["w"] is not None else "b"
        return {n: 1.0 if n == fast[given] else 9.0 for n in fast.values()}

    calls = fake_timing(monkeypatch, times_for)
    rng = np.random.default_rng()
    x, t = rng.standard_normal((2, 5)).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    with xrt.kernel_policy(xrt.KernelPolicy(pair="autotune", validate=registry)):
        for given, inputs in (("w", (x, t, None)), ("b", (x, None, t))):
            y = Dispatcher(registry).run("pair", inputs)
            assert round(float((y - x).mean())) == int(fast[given][1]), f"{given}: another call's winner"
    assert len(calls) == 2


def test_print_autotuning_reports_each_result_and_where_it_came_from(tuning_dir, monkeypatch, capsys):
    """XPURUNTIME_PRINT_AUTOTUNING=1 prints, like TRITON_PRINT_AUTOTUNING, one line per tuned signature: timed
    now, or from the tuning cache in a later process (here: the in-memory layers dropped)."""
    registry = make_toy_registry({"name": "k0"}, {"name": "k1"})
    fake_timing(monkeypatch, lambda ctx: {"k0": 9.0, "k1": 1.5})
    x = np.random.default_rng().standard_normal((3, 7)).astype(np.float32)
    policy = xrt.KernelPolicy(toy="autotune", validate=registry)
    with xrt.kernel_policy(policy):
        Dispatcher(registry).run("toy", (x,))
        assert capsys.readouterr().err == ""  # off by default
        monkeypatch.setenv(autotune.ENV_PRINT, "1")
        Dispatcher(registry).run("toy", (x,))
        err = capsys.readouterr().err
        assert (
            err == "xpuruntime autotune: toy float32[3x7] on cpu -> k1 (from the tuning cache): k1 1.5 µs, k0 9.0 µs\n"
        )
        autotune.STORE.memory.clear()
        monkeypatch.setattr(tuning_cache, "_default", None)
        tuning_cache.entries()[0].path.unlink()  # the next process finds nothing: it times again
        Dispatcher(registry).run("toy", (x,))
        assert capsys.readouterr().err.endswith("-> k1 (timed): k1 1.5 µs, k0 9.0 µs\n")


def test_print_autotuning_says_when_the_front_end_chose_another_kernel(tuning_dir, monkeypatch, capsys):
    registry = make_toy_registry({"name": "k0"}, {"name": "k1"})
    fake_timing(monkeypatch, lambda ctx: {"k0": 9.0, "k1": 1.5})
    monkeypatch.setattr(autotune, "ARBITERS", [lambda op, key, times, backends, policy: "k0"])
    monkeypatch.setenv(autotune.ENV_PRINT, "1")
    x = np.random.default_rng().standard_normal(5).astype(np.float32)
    with xrt.kernel_policy(xrt.KernelPolicy(toy="autotune", validate=registry)):
        y = Dispatcher(registry).run("toy", (x,))
    np.testing.assert_array_equal(y, x)  # k0 wrote x + 0
    assert "-> k0 (timed; k1 was fastest, the front end's routing cost chose k0)" in capsys.readouterr().err
