"""The few array functions whose names or signatures differ between NumPy and PyTorch, so that one algorithm
serves the CPU path (NumPy arrays) and the GPU path (tensors): an op written once as `fn(xp, node, opset,
*inputs)` gets `NUMPY` or `TORCH` as `xp` from the two builders `builders(fn)` makes. Operators (+, *, @,
indexing, .shape, .reshape) are the same in both."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .record import Builder, F, as_tensor, torch, torch_dtype


class NumpyArrays:
    """NumPy arrays."""

    @staticmethod
    def compute_dtype(x: Any) -> Any:
        """The dtype an op accumulates in: float64 for float64 inputs, float32 for the rest."""
        return np.float64 if x.dtype == np.float64 else np.float32

    @staticmethod
    def cast(x: Any, dtype: Any) -> Any:
        return x.astype(dtype, copy=False)

    @staticmethod
    def zeros(shape: Sequence[int], dtype: Any, like: Any) -> Any:
        return np.zeros(tuple(shape), dtype)

    @staticmethod
    def from_host(array: np.ndarray, like: Any) -> Any:
        """A host array as an array of this kind, where `like` lives."""
        return array

    @staticmethod
    def stack(xs: Sequence[Any], axis: int) -> Any:
        return np.stack(xs, axis=axis)

    @staticmethod
    def concat(xs: Sequence[Any], axis: int) -> Any:
        return np.concatenate(xs, axis=axis)

    @staticmethod
    def repeat(x: Any, n: int, axis: int) -> Any:
        """Each entry along `axis` n times in a row (np.repeat; torch.repeat_interleave)."""
        return np.repeat(x, n, axis=axis)

    @staticmethod
    def permute(x: Any, axes: Sequence[int]) -> Any:
        return np.transpose(x, tuple(axes))

    @staticmethod
    def flip(x: Any, axis: int) -> Any:
        return np.flip(x, axis)

    @staticmethod
    def take(x: Any, indices: Any) -> Any:
        """Rows of x (along axis 0) at integer indices of any shape."""
        return np.take(x, indices, axis=0)

    @staticmethod
    def select(x: Any, index: int, axis: int) -> Any:
        """The slice at `index` along `axis` (that axis dropped)."""
        return np.take(x, index, axis=axis)

    @staticmethod
    def moveaxis(x: Any, source: int, destination: int) -> Any:
        return np.moveaxis(x, source, destination)

    @staticmethod
    def sigmoid(x: Any) -> Any:
        return 1 / (1 + np.exp(-x))

    @staticmethod
    def relu(x: Any) -> Any:
        return np.maximum(x, 0)

    @staticmethod
    def softsign(x: Any) -> Any:
        return x / (1 + np.abs(x))

    @staticmethod
    def softplus(x: Any) -> Any:
        return np.logaddexp(0, x)

    @staticmethod
    def dtype(name: str) -> Any:
        """The dtype of this kind named by NumPy's name ('float32', 'uint8')."""
        return np.dtype(name)

    @staticmethod
    def mean(x: Any, axes: Sequence[int]) -> Any:
        """The mean over `axes`, keeping them as dims of 1."""
        return x.mean(axis=tuple(axes), keepdims=True)

    @staticmethod
    def sum(x: Any, axes: Sequence[int]) -> Any:
        """The sum over `axes`, keeping them as dims of 1."""
        return x.sum(axis=tuple(axes), keepdims=True)

    @staticmethod
    def amax(x: Any, axes: Sequence[int]) -> Any:
        """The largest value over `axes`, keeping them as dims of 1."""
        return np.max(x, axis=tuple(axes), keepdims=True)

    @staticmethod
    def pad_last(x: Any, n: int, fill: Any) -> Any:
        """x with n entries of `fill` appended along its last axis."""
        return np.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, n)], constant_values=fill)

    einsum = staticmethod(np.einsum)
    rint = staticmethod(np.rint)  # half to even
    isneginf = staticmethod(np.isneginf)
    exp = staticmethod(np.exp)
    tanh = staticmethod(np.tanh)
    abs = staticmethod(np.abs)
    where = staticmethod(np.where)
    clip = staticmethod(np.clip)


class TorchArrays:
    """PyTorch tensors (looked up when first called: the core imports without PyTorch)."""

    @staticmethod
    def compute_dtype(x: Any) -> Any:
        return torch.float64 if x.dtype == torch.float64 else torch.float32

    @staticmethod
    def cast(x: Any, dtype: Any) -> Any:
        return x.to(dtype)

    @staticmethod
    def zeros(shape: Sequence[int], dtype: Any, like: Any) -> Any:
        return torch.zeros(tuple(shape), dtype=dtype, device=like.device)

    @staticmethod
    def from_host(array: np.ndarray, like: Any) -> Any:
        return as_tensor(np.asarray(array), getattr(like, "device", "cpu"))

    @staticmethod
    def stack(xs: Sequence[Any], axis: int) -> Any:
        return torch.stack(list(xs), dim=axis)

    @staticmethod
    def concat(xs: Sequence[Any], axis: int) -> Any:
        return torch.cat(list(xs), dim=axis)

    @staticmethod
    def repeat(x: Any, n: int, axis: int) -> Any:
        return torch.repeat_interleave(x, n, dim=axis)

    @staticmethod
    def permute(x: Any, axes: Sequence[int]) -> Any:
        return x.permute(*axes)

    @staticmethod
    def flip(x: Any, axis: int) -> Any:
        return torch.flip(x, (axis,))

    @staticmethod
    def take(x: Any, indices: Any) -> Any:
        return x[indices.long()]

    @staticmethod
    def select(x: Any, index: int, axis: int) -> Any:
        return x.select(axis, index)

    @staticmethod
    def moveaxis(x: Any, source: int, destination: int) -> Any:
        return torch.movedim(x, source, destination)

    @staticmethod
    def sigmoid(x: Any) -> Any:
        return torch.sigmoid(x)

    @staticmethod
    def relu(x: Any) -> Any:
        return torch.relu(x)

    @staticmethod
    def softsign(x: Any) -> Any:
        return F.softsign(x)

    @staticmethod
    def softplus(x: Any) -> Any:
        return F.softplus(x)

    @staticmethod
    def dtype(name: str) -> Any:
        return torch_dtype(name)

    @staticmethod
    def mean(x: Any, axes: Sequence[int]) -> Any:
        return x.mean(dim=tuple(axes), keepdim=True)

    @staticmethod
    def sum(x: Any, axes: Sequence[int]) -> Any:
        return x.sum(dim=tuple(axes), keepdim=True)

    @staticmethod
    def amax(x: Any, axes: Sequence[int]) -> Any:
        return torch.amax(x, dim=tuple(axes), keepdim=True)

    @staticmethod
    def pad_last(x: Any, n: int, fill: Any) -> Any:
        return F.pad(x, (0, n), value=fill)

    @staticmethod
    def isneginf(x: Any) -> Any:
        return torch.isneginf(x)

    @staticmethod
    def einsum(spec: str, *xs: Any) -> Any:
        return torch.einsum(spec, *xs)

    @staticmethod
    def rint(x: Any) -> Any:
        return torch.round(x)  # half to even

    @staticmethod
    def exp(x: Any) -> Any:
        return torch.exp(x)

    @staticmethod
    def tanh(x: Any) -> Any:
        return torch.tanh(x)

    @staticmethod
    def abs(x: Any) -> Any:
        return torch.abs(x)

    @staticmethod
    def where(cond: Any, a: Any, b: Any) -> Any:
        return torch.where(cond, a, b)

    @staticmethod
    def clip(x: Any, lo: Any, hi: Any) -> Any:
        return torch.clamp(x, lo, hi)


NUMPY, TORCH = NumpyArrays(), TorchArrays()


def builders(fn: Callable[..., Any]) -> tuple[Builder, Builder]:
    """The NumPy and the PyTorch builder of an op written once as fn(xp, node, opset, *inputs)."""
    return (
        lambda node, opset: functools.partial(fn, NUMPY, node, opset),
        lambda node, opset: functools.partial(fn, TORCH, node, opset),
    )
