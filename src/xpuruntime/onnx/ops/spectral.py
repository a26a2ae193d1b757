"""Signal-processing ONNX ops: DFT (forward, inverse, one-sided), STFT, the Hann / Hamming / Blackman
windows and MelWeightMatrix.

Complex values travel as a trailing dim of 2 (real, imaginary); a trailing dim of 1 is a real signal.
The transforms are NumPy's and PyTorch's FFTs (torch.fft on the GPU path), in the input's precision (float32
for float16).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...errors import ShapeError
from ...graph.ir import Node
from .record import Fn, check_elem_dtype, elem_dtype, ints, itemsize, op, scalar, to_host, torch


# -- DFT ---------------------------------------------------------------------------------------------------------
def _signal_axis(op_name: str, axis: int, ndim: int) -> int:
    """The signal axis of an (..., 1 or 2) input: any axis but the trailing complex one."""
    if not -ndim <= axis < ndim or axis % ndim == ndim - 1:
        raise ShapeError(f"{op_name}: axis {axis} must name a signal axis of a {ndim}-d input (not the last, "
                         "which holds real and imaginary parts)")  # fmt: skip
    return axis % ndim


def _dft_setup(node: Node, opset: int, shape: tuple[int, ...], length: Any, axis: Any) -> tuple[int, int]:
    """The signal axis and the transform length (dft_length, else the axis length; twice the axis length minus
    2 for an inverse one-sided transform)."""
    if not shape or shape[-1] not in (1, 2):
        raise ShapeError(f"DFT: input {tuple(shape)} must end in 1 (real) or 2 (real, imaginary)")
    raw = node.attrs.get("axis", 1) if opset < 20 else (-2 if axis is None else ints(axis)[0])
    ax = _signal_axis("DFT", raw, len(shape))
    inverse, onesided = node.attrs.get("inverse", 0), node.attrs.get("onesided", 0)
    n = ints(length)[0] if length is not None else 2 * (shape[ax] - 1) if inverse and onesided else shape[ax]
    if n < 1:
        raise ShapeError(f"DFT: dft_length must be >= 1, got {n}")
    return ax, n


def dft_numpy(x: np.ndarray, n: int, axis: int, inverse: bool, onesided: bool) -> np.ndarray:
    signal = x[..., 0] if x.shape[-1] == 1 else x[..., 0] + 1j * x[..., 1]  # complex64 for float32
    if inverse and onesided:
        return np.fft.irfft(signal, n=n, axis=axis)[..., None].astype(x.dtype)
    out = np.fft.ifft(signal, n=n, axis=axis) if inverse else np.fft.fft(signal, n=n, axis=axis)
    if onesided and not inverse:
        out = np.take(out, range(n // 2 + 1), axis=axis)
    return np.stack([out.real, out.imag], axis=-1).astype(x.dtype)


def dft(node: Node, opset: int) -> Fn:
    inverse, onesided = bool(node.attrs.get("inverse", 0)), bool(node.attrs.get("onesided", 0))

    def run(x: np.ndarray, length: Any = None, axis: Any = None) -> np.ndarray:
        ax, n = _dft_setup(node, opset, x.shape, length, axis)
        return dft_numpy(x, n, ax, inverse, onesided)

    return run


def dft_torch(node: Node, opset: int) -> Fn:
    inverse, onesided = bool(node.attrs.get("inverse", 0)), bool(node.attrs.get("onesided", 0))

    def run(x: Any, length: Any = None, axis: Any = None) -> Any:
        ax, n = _dft_setup(node, opset, tuple(x.shape), length, axis)
        wide = x if x.dtype in (torch.float32, torch.float64) else x.float()  # no half FFTs of any length
        signal = wide[..., 0] if x.shape[-1] == 1 else torch.complex(wide[..., 0], wide[..., 1])
        if inverse and onesided:
            return torch.fft.irfft(signal, n=n, dim=ax)[..., None].to(x.dtype)
        out = (torch.fft.ifft if inverse else torch.fft.fft)(signal, n=n, dim=ax)
        if onesided and not inverse:
            out = out.narrow(ax, 0, n // 2 + 1)
        return torch.view_as_real(out.resolve_conj()).to(x.dtype)

    return run


def dft_size(node: Node, args: list, opset: int) -> tuple[tuple[int, ...], int]:
    x, length, axis = (*args, None, None)[:3]
    ax, n = _dft_setup(node, opset, tuple(x.shape), length, axis)
    inverse, onesided = node.attrs.get("inverse", 0), node.attrs.get("onesided", 0)
    shape = list(x.shape)
    shape[ax], shape[-1] = (n, 1) if inverse and onesided else (n // 2 + 1 if onesided else n, 2)
    return tuple(shape), itemsize(x)


op("DFT", dft, dft_torch, shape_inputs=(1,), host_inputs=(2,), size=dft_size)


# -- STFT --------------------------------------------------------------------------------------------------------
def _frames(shape: tuple[int, ...], step: Any, window: Any, length: Any) -> tuple[int, int, int]:
    """STFT's hop, frame length and frame count for a (batch, length, 1 or 2) signal."""
    if len(shape) != 3 or shape[2] not in (1, 2):
        raise ShapeError(f"STFT: signal {tuple(shape)} must be (batch, length, 1 or 2)")
    hop = ints(step)[0]
    size = ints(length)[0] if length is not None else window.shape[0] if window is not None else 0
    if hop < 1 or not 1 <= size <= shape[1] or (window is not None and tuple(window.shape) != (size,)):
        raise ShapeError(f"STFT: frame_step {hop} must be >= 1 and the frame length {size} (window "
                         f"{None if window is None else tuple(window.shape)}) in [1, {shape[1]}]")  # fmt: skip
    return hop, size, (shape[1] - size) // hop + 1


def stft(node: Node, opset: int) -> Fn:
    """Frames of frame_length samples every frame_step, weighted by the window, each one DFT'd (bins
    frame_length // 2 + 1 when onesided, the default)."""
    onesided = bool(node.attrs.get("onesided", 1))

    def run(signal: np.ndarray, step: Any, window: Any = None, length: Any = None) -> np.ndarray:
        hop, size, count = _frames(signal.shape, step, window, length)
        starts = np.arange(count)[:, None] * hop + np.arange(size)[None, :]
        frames = signal[:, starts]  # (batch, frames, size, 1 or 2)
        if window is not None:
            frames = frames * window.astype(np.float64)[:, None]
        return dft_numpy(frames, size, 2, False, onesided).astype(signal.dtype)

    return run


def stft_torch(node: Node, opset: int) -> Fn:
    onesided = bool(node.attrs.get("onesided", 1))

    def run(signal: Any, step: Any, window: Any = None, length: Any = None) -> Any:
        hop, size, count = _frames(tuple(signal.shape), step, window, length)
        frames = signal.to(torch.float64).unfold(1, size, hop)[:, :count]  # (batch, frames, 1 or 2, size)
        if window is not None:
            frames = frames * window.to(torch.float64)
        frames = frames[..., 0, :] if signal.shape[2] == 1 else torch.complex(frames[..., 0, :], frames[..., 1, :])
        out = torch.fft.fft(frames, dim=-1)
        out = out[..., : size // 2 + 1] if onesided else out
        return torch.view_as_real(out.resolve_conj()).to(signal.dtype)

    return run


def stft_size(node: Node, args: list, opset: int) -> tuple[tuple[int, ...], int]:
    signal, step, window, length = (*args, None, None)[:4]
    _, size, count = _frames(tuple(signal.shape), step, window, length)
    bins = size // 2 + 1 if node.attrs.get("onesided", 1) else size
    return (signal.shape[0], count, bins, 2), itemsize(signal)


op("STFT", stft, stft_torch, shape_inputs=(1, 3), size=stft_size)


# -- windows -----------------------------------------------------------------------------------------------------
WINDOWS = {  # coefficients a_k of sum_k (-1)^k a_k cos(2 pi k n / N)
    "HannWindow": (0.5, 0.5),
    "HammingWindow": (25 / 46, 21 / 46),
    "BlackmanWindow": (0.42, 0.5, 0.08),
}


def window_values(node: Node, size: Any) -> np.ndarray:
    """The window of `size` samples; N is the size (periodic, the default) or the size minus 1 (symmetric)."""
    n = int(scalar(size))
    if n < 0:
        raise ShapeError(f"{node.op}: size must be >= 0, got {n}")
    period = n if node.attrs.get("periodic", 1) else n - 1
    k = np.arange(n, dtype=np.float64)
    phase = 2 * math.pi * k / period if period > 0 else np.zeros(n)
    values = sum((-1) ** i * a * np.cos(i * phase) for i, a in enumerate(WINDOWS[node.op]))
    return np.asarray(values).astype(elem_dtype(node, "output_datatype", np.dtype(np.float32)))


for _name in WINDOWS:
    op(_name, lambda node, opset: lambda size: window_values(node, size),
       lambda node, opset: lambda size: torch.from_numpy(window_values(node, size)),
       shape_inputs=(0,), check=check_elem_dtype("output_datatype"),
       size=lambda node, args, opset: ((int(scalar(args[0])),), 8))  # fmt: skip


# -- MelWeightMatrix ---------------------------------------------------------------------------------------------
def mel_weights(node: Node, *args: Any) -> np.ndarray:
    """A (dft_length // 2 + 1, num_mel_bins) matrix of triangular filters, spaced evenly on the mel scale
    between the edge frequencies; each filter's corner bins are floor((dft_length + 1) * hertz / rate)."""
    bins, length, rate = (int(scalar(a)) for a in args[:3])
    low, high = (float(scalar(a)) for a in args[3:])
    if bins < 1 or length < 1 or rate < 1 or not 0 <= low < high:
        raise ShapeError(f"MelWeightMatrix: num_mel_bins {bins}, dft_length {length} and sample_rate {rate} must "
                         f"be >= 1 and 0 <= lower_edge_hertz {low} < upper_edge_hertz {high}")  # fmt: skip
    to_mel = lambda hz: 2595 * np.log10(1 + hz / 700)  # noqa: E731
    mels = np.arange(bins + 2) * ((to_mel(high) - to_mel(low)) / (bins + 2)) + to_mel(low)
    corners = (((length + 1) * (700 * (10 ** (mels / 2595) - 1))) // rate).astype(np.int64)
    left, center, right = corners[:-2], corners[1:-1], corners[2:]
    j = np.arange(length // 2 + 1)[:, None]
    rising = np.where(center > left, (j - left) / np.maximum(center - left, 1), 1.0)
    falling = (right - j) / np.maximum(right - center, 1)
    out = np.where((j >= left) & (j <= center), rising, 0.0)
    out = np.where((j >= center) & (j < right) & (right > center), falling, out)
    return out.astype(elem_dtype(node, "output_datatype", np.dtype(np.float32)))


op("MelWeightMatrix", lambda node, opset: lambda *args: mel_weights(node, *args),
   lambda node, opset: lambda *args: torch.from_numpy(mel_weights(node, *(to_host(a) for a in args))),
   shape_inputs=(0, 1), host_inputs=(2, 3, 4), check=check_elem_dtype("output_datatype"),
   size=lambda node, args, opset: ((int(scalar(args[1])) // 2 + 1, int(scalar(args[0]))), 8))  # fmt: skip
