"""CPU kernels for add_rms_norm / add_layer_norm and their backward ops: h = x + residual in h's dtype,
then the norms' own NumPy kernels (norm.py, norm_backward.py) on h."""

from __future__ import annotations

import numpy as np

from ...abi import ArgPack
from ...registry import kernel
from .common import CPU_FLOAT_DTYPES
from .norm import layer_norm_into, rms_norm_into
from .norm_backward import layer_norm_grads, rms_norm_grads, rows64, store_packed


def _sum_into(h: np.ndarray, x: np.ndarray, residual: np.ndarray) -> np.ndarray:
    """h = x + residual, rounded once to h's dtype (their promoted dtype: NumPy adds float16 pairs exactly,
    then rounds)."""
    np.add(x, residual, out=h, casting="unsafe")
    return h


@kernel("add_rms_norm", "numpy", backend="cpu", dtypes=CPU_FLOAT_DTYPES, priority=10)
def add_rms_norm_numpy(args: ArgPack) -> None:
    """h into residual_out, then rms_norm of h into out. In-place safe (out or residual_out may be x or
    residual)."""
    x, residual, weight, h = args.inputs
    rms_norm_into(args.out, _sum_into(h, x, residual), weight, args.attrs, (h.ndim - 1,))


@kernel("add_layer_norm", "numpy", backend="cpu", dtypes=CPU_FLOAT_DTYPES, priority=10)
def add_layer_norm_numpy(args: ArgPack) -> None:
    """h into residual_out, then layer_norm of h into out. In-place safe."""
    x, residual, weight, bias, h = args.inputs
    layer_norm_into(args.out, _sum_into(h, x, residual), weight, bias, args.attrs["eps"], (h.ndim - 1,))


def _backward_rows(args: ArgPack) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, np.ndarray | float, int]:
    dy, dh, h, weight = args.inputs
    n = h.shape[-1]
    w = 1.0 if weight is None else weight.astype(np.float64) + args.attrs.get("offset", 0.0)
    return rows64(dy, n), None if dh is None else rows64(dh, n), rows64(h, n), w, n


@kernel("add_rms_norm_backward", "numpy", backend="cpu", dtypes=CPU_FLOAT_DTYPES, priority=10)
def add_rms_norm_backward_numpy(args: ArgPack) -> None:
    """dh_total = dh + rms_norm's dx, and dweight, in float64."""
    dy, dh, h, w, _ = _backward_rows(args)
    store_packed(args.out, *rms_norm_grads(dy, h, w, args.attrs, args.inputs[2].dtype), extra=dh)


@kernel("add_layer_norm_backward", "numpy", backend="cpu", dtypes=CPU_FLOAT_DTYPES, priority=10)
def add_layer_norm_backward_numpy(args: ArgPack) -> None:
    """dh_total = dh + layer_norm's dx, dweight and dbias, in float64."""
    dy, dh, h, w, _ = _backward_rows(args)
    store_packed(args.out, *layer_norm_grads(dy, h, w, args.attrs["eps"]), extra=dh)
