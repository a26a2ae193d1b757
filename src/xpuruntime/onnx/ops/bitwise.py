"""Bitwise ONNX ops: BitShift (the sign-extending, out-of-range-safe rule of BitShift-28), BitwiseAnd / Or /
Xor / Not, and BitCast (the same bytes read as another dtype of the same width)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import ArgumentError
from ...graph.ir import Node
from ..errors import UnsupportedModelError
from .record import Fn, LoadContext, broadcast_size, check_elem_dtype, elem_dtype, op, torch, torch_dtype


# -- BitShift -----------------------------------------------------------------------------------------------
def _direction(node: Node) -> str:
    direction = node.attrs.get("direction", "")
    if direction not in ("LEFT", "RIGHT"):
        raise UnsupportedModelError(f"{node.describe()}: direction must be 'LEFT' or 'RIGHT', got {direction!r}")
    return direction


def check_bitshift(node: Node, ctx: LoadContext) -> None:
    _direction(node)


def bitshift(node: Node, opset: int) -> Fn:
    """A shift by a negative amount or by the width or more gives what sign extension alone gives: -1 for a
    right shift of a negative value, 0 otherwise. A left shift drops the bits pushed past the top (the
    shift is done on the unsigned view, so signed values wrap as two's complement)."""
    left = _direction(node) == "LEFT"

    def run(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        if x.dtype.kind not in "iu" or y.dtype != x.dtype:
            raise ArgumentError(f"BitShift: expected two inputs of one integer dtype, got {x.dtype} and {y.dtype}")
        bits = x.dtype.itemsize * 8
        outside = (y < 0) | (y >= bits)
        if left:
            unsigned = np.dtype(f"u{x.dtype.itemsize}")
            shift = np.where(outside, 0, y).astype(unsigned)
            shifted = np.left_shift(x.view(unsigned), shift).view(x.dtype)
            return np.where(outside, x.dtype.type(0), shifted)
        if x.dtype.kind == "i":  # shifting by bits - 1 leaves the sign fill: -1 or 0
            return np.right_shift(x, np.where(outside, bits - 1, y).astype(x.dtype))
        return np.where(outside, x.dtype.type(0), np.right_shift(x, np.where(outside, 0, y).astype(x.dtype)))

    return run


def bitshift_torch(node: Node, opset: int) -> Fn:
    left = _direction(node) == "LEFT"

    def run(x: Any, y: Any) -> Any:
        bits = x.element_size() * 8
        outside = (y < 0) | (y >= bits)
        zero = torch.zeros((), dtype=x.dtype, device=x.device)
        if left:
            return torch.where(outside, zero, torch.bitwise_left_shift(x, torch.where(outside, zero, y)))
        if x.is_signed():
            return torch.bitwise_right_shift(x, torch.where(outside, torch.full_like(y, bits - 1), y))
        return torch.where(outside, zero, torch.bitwise_right_shift(x, torch.where(outside, zero, y)))

    return run


op("BitShift", bitshift, bitshift_torch, check=check_bitshift, size=broadcast_size)


# -- BitwiseAnd / Or / Xor / Not -----------------------------------------------------------------------------
for _name, _numpy, _torch in (
    ("BitwiseAnd", np.bitwise_and, "bitwise_and"),
    ("BitwiseOr", np.bitwise_or, "bitwise_or"),
    ("BitwiseXor", np.bitwise_xor, "bitwise_xor"),
    ("BitwiseNot", np.invert, "bitwise_not"),
):
    size = None if _name == "BitwiseNot" else broadcast_size
    op(_name, lambda node, opset, fn=_numpy: fn, lambda node, opset, name=_torch: getattr(torch, name), size=size)


# -- BitCast -------------------------------------------------------------------------------------------------
def bitcast(node: Node, opset: int) -> Fn:
    target = elem_dtype(node, "to")

    def run(x: np.ndarray) -> np.ndarray:
        if x.dtype.itemsize != target.itemsize:
            raise ArgumentError(f"BitCast: {x.dtype} ({x.dtype.itemsize * 8} bits) cannot be read as {target} "
                                f"({target.itemsize * 8} bits): the widths must match")  # fmt: skip
        little = x.astype(x.dtype.newbyteorder("<"), order="C", copy=not x.flags.c_contiguous)
        return little.view(target)

    return run


def bitcast_torch(node: Node, opset: int) -> Fn:
    target = elem_dtype(node, "to")

    def run(x: Any) -> Any:
        if x.element_size() != target.itemsize:
            raise ArgumentError(f"BitCast: {x.dtype} cannot be read as {target}: the widths must match")
        return x.contiguous().view(torch_dtype(target.name)).clone()

    return run


op("BitCast", bitcast, bitcast_torch, check=check_elem_dtype("to"))
