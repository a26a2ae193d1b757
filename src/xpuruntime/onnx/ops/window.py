"""The sliding-window geometry Conv, ConvTranspose and the pools share: kernel, strides, dilations, the pads
(explicit, or worked out for auto_pad SAME_UPPER / SAME_LOWER / VALID) and the output size, with ceil_mode's
extra window past the end; and the windows of a padded array as a strided view (NumPy and PyTorch)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import ShapeError
from ...graph.ir import Node
from ..errors import UnsupportedModelError
from .record import LoadContext

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


@dataclass(frozen=True)
class Window:
    """How a kernel slides over the spatial dims of one input: out[i] reads the padded input at
    out[i] * stride + k * dilation. `end` holds the explicit end pads, `extra` the cells ceil_mode adds past
    them (padding that an average never counts)."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    begin: tuple[int, ...]
    end: tuple[int, ...]
    extra: tuple[int, ...]
    out: tuple[int, ...]

    def widths(self) -> list[tuple[int, int]]:
        """(before, after) padding of every spatial dim, ceil_mode's extra cells included."""
        return [(b, e + x) for b, e, x in zip(self.begin, self.end, self.extra)]


def check_auto_pad(node: Node, ctx: LoadContext) -> None:
    value = node.attrs.get("auto_pad", "NOTSET")
    if value not in AUTO_PADS:
        raise UnsupportedModelError(
            f"{node.describe()}: attribute auto_pad={value!r} is not supported; supported: {', '.join(AUTO_PADS)}"
        )


def window(node: Node, spatial: tuple[int, ...], kernel: tuple[int, ...], ceil_mode: bool = False) -> Window:
    """The window of `node` (its kernel, strides, dilations, pads, auto_pad) over `spatial` input dims."""
    n = len(spatial)
    strides = tuple(node.attrs.get("strides") or (1,) * n)
    dilations = tuple(node.attrs.get("dilations") or (1,) * n)
    pads = list(node.attrs.get("pads") or (0,) * (2 * n))
    if len(kernel) != n or len(strides) != n or len(dilations) != n or len(pads) != 2 * n:
        raise ShapeError(
            f"{node.op}: kernel {list(kernel)}, strides {list(strides)}, dilations {list(dilations)} and pads "
            f"{pads} do not all fit an input with {n} spatial dims {list(spatial)}"
        )
    if min(strides, default=1) < 1 or min(dilations, default=1) < 1 or min(kernel, default=1) < 1:
        raise ShapeError(f"{node.op}: kernel, strides and dilations must be positive")
    span = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    auto = node.attrs.get("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        out = [math.ceil(i / s) for i, s in zip(spatial, strides)]
        total = [max((o - 1) * s + w - i, 0) for o, s, w, i in zip(out, strides, span, spatial)]
        small = [t // 2 for t in total]
        begin = small if auto == "SAME_UPPER" else [t - h for t, h in zip(total, small)]
        end = [t - b for t, b in zip(total, begin)]
    else:
        begin, end = (pads[:n], pads[n:]) if auto == "NOTSET" else ([0] * n, [0] * n)
        out = []
        for i, b, e, w, s in zip(spatial, begin, end, span, strides):
            size = (i + b + e - w) / s + 1
            o = math.ceil(size) if ceil_mode else math.floor(size)
            if ceil_mode and (o - 1) * s >= i + b:  # the last window must start inside the input or its pads
                o -= 1
            out.append(o)
    if any(o < 1 for o in out):
        raise ShapeError(
            f"{node.op}: a kernel of span {span} does not fit the input's spatial dims {list(spatial)} padded "
            f"by {begin} / {end}"
        )
    extra = [max((o - 1) * s + w - (i + b + e), 0) for o, s, w, i, b, e in zip(out, strides, span, spatial, begin, end)]
    return Window(tuple(kernel), strides, dilations, tuple(begin), tuple(end), tuple(extra), tuple(out))


def _view(shape: tuple[int, ...], strides: tuple[int, ...], win: Window) -> tuple[tuple, tuple]:
    """Shape and strides of the (N, C, *out, *kernel) windows of an array of `shape` and `strides`."""
    spatial = strides[2:]
    steps = [st * s for st, s in zip(spatial, win.strides)] + [st * d for st, d in zip(spatial, win.dilations)]
    return (*shape[:2], *win.out, *win.kernel), (*strides[:2], *steps)


def numpy_windows(x: np.ndarray, win: Window) -> np.ndarray:
    """A padded (N, C, *spatial) array's windows as a read-only view (N, C, *out, *kernel)."""
    shape, steps = _view(x.shape, x.strides, win)
    return np.lib.stride_tricks.as_strided(x, shape, steps, writeable=False)


def torch_windows(x: Any, win: Window) -> Any:
    """The same view of a padded tensor."""
    x = x.contiguous()
    return x.as_strided(*_view(tuple(x.shape), x.stride(), win))


def torch_pad_widths(widths: list[tuple[int, int]]) -> list[int]:
    """F.pad's argument (last dim first) for (before, after) widths of the spatial dims."""
    return [w for pair in reversed(widths) for w in pair]
