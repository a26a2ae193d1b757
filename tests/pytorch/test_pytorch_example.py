"""examples/train_gpt.py at a tiny size on the CPU: it trains, and with a policy routed through the
CPU kernels the losses match PyTorch's."""

from __future__ import annotations

import importlib.util
import math
import os

import pytest

_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "train_gpt.py")


def _example():
    spec = importlib.util.spec_from_file_location("train_gpt", _PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_tiny_gpt_trains_with_and_without_a_policy():
    example = _example()
    common = ["--tiny", "--device", "cpu", "--steps", "3", "--dtype", "fp32"]
    plain = example.main(common)
    routed = example.main([*common, "--route-cpu", "--policy", "matmul=numpy_blas,layer_norm=numpy,attention=math"])
    assert all(math.isfinite(v) for v in plain["losses"])
    for a, b in zip(plain["losses"], routed["losses"]):
        assert abs(a - b) <= 1e-4 * abs(a)
    used = {(row["op"], row["kernel"], row["reason"]) for row in routed["dispatch"]}
    assert {("matmul", "numpy_blas", "policy"), ("layer_norm", "numpy", "policy")} <= used
    assert ("layer_norm_backward", "numpy", "policy") in used  # backward follows the policy too
    training = {("attention_forward", "math", "policy"), ("attention_backward", "math", "policy")}
    assert training <= used or ("attention", "math", "policy") in used
    assert plain["dispatch"] == [] and routed["overrides"]


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_only_the_first_log_steps_are_logged():
    """Logging routes every call through Python, so the example logs its first steps and times the rest as
    users run them."""
    example = _example()
    common = [
        "--tiny",
        "--device",
        "cpu",
        "--steps",
        "3",
        "--dtype",
        "fp32",
        "--route-cpu",
        "--policy",
        "matmul=numpy_blas",
    ]
    every = example.main([*common, "--log-steps", "3"])
    first = example.main([*common, "--log-steps", "1"])
    unlogged = example.main([*common, "--log-steps", "0"])
    calls = [sum(row["calls"] for row in run["dispatch"]) for run in (every, first)]
    assert calls[0] == 3 * calls[1] > 0 and unlogged["dispatch"] == []
    assert [run["logged_steps"] for run in (every, first, unlogged)] == [3, 1, 0]
    assert every["losses"] == first["losses"] == unlogged["losses"]
