"""The command line of examples/train_gpt.py: bad arguments are usage errors, and its policy string takes
options as the CLI's does."""

from __future__ import annotations

import importlib.util
import os

import pytest

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "train_gpt.py")


def _example():
    spec = importlib.util.spec_from_file_location("train_gpt_edge", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "0"], "--steps"),
        (["--steps", "2", "--profile-steps", "3"], "--profile-steps"),
        (["--policy", "garbage"], "expected 'op=kernel' items"),
        (["--policy", "matmul=nosuch"], "unknown kernel 'nosuch'"),
    ],
)  # fmt: skip
def test_example_bad_arguments_are_usage_errors(capsys, argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as exc:
        _example().parse_args(["--tiny", "--device", "cpu", *argv])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_example_policy_string_takes_options_like_the_cli() -> None:
    example = _example()
    args = example.parse_args(["--tiny", "--device", "cpu", "--policy", "matmul=numpy_blas,strict=true"])
    policy = example.make_policy(args)
    assert policy.strict and policy.preferences == {"matmul": "numpy_blas"}
    args = example.parse_args(["--tiny", "--policy", "matmul=numpy_blas", "--strict", "--autotune"])
    policy = example.make_policy(args)
    assert policy.strict and policy.preferences == {"matmul": "numpy_blas"}
    assert policy.autotune_ops == {"attention", "layer_norm"}
    assert example.make_policy(example.parse_args(["--tiny"])) is None
