"""Central finite differences in float64, for checking backward ops' references against their forward ops'.

`numerical_vjp(f, args, index, upstream)` is the gradient of sum(upstream * f(*args)) with respect to
args[index], by central differences (step 1e-6 relative to each element's size): what an analytic
backward must return for that upstream gradient. f takes and returns float64 NumPy arrays.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def numerical_vjp(
    f: Callable[..., Any], args: Sequence[Any], index: int, upstream: np.ndarray, step: float = 1e-6
) -> np.ndarray:
    """d sum(upstream * f(*args)) / d args[index], elementwise by central differences."""
    args = list(args)
    x = np.array(args[index], np.float64)
    grad = np.zeros_like(x)
    upstream = np.asarray(upstream, np.float64)
    for i in np.ndindex(x.shape):
        h = step * max(1.0, abs(x[i]))
        values = []
        for sign in (1.0, -1.0):
            moved = x.copy()
            moved[i] += sign * h
            args[index] = moved
            values.append(float(np.sum(upstream * np.asarray(f(*args), np.float64))))
        grad[i] = (values[0] - values[1]) / (2 * h)
    return grad


def assert_gradient(analytic: Any, numeric: np.ndarray, what: str, rtol: float = 1e-6) -> None:
    """analytic within rtol of the finite differences, relative to the gradient's largest element."""
    analytic = np.asarray(analytic, np.float64)
    assert analytic.shape == numeric.shape, (what, analytic.shape, numeric.shape)
    scale = max(float(np.abs(numeric).max(initial=0.0)), 1e-12)
    err = float(np.abs(analytic - numeric).max(initial=0.0)) / scale
    assert err <= rtol, f"{what}: relative error {err:.2e} against finite differences (limit {rtol:.0e})"
