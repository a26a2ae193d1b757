"""Shared hypothesis strategies for the op property tests: seeds, shapes and random array *views*.

The central piece is `views(shape, dtype)`: it draws a layout (contiguous, offset, window, strided,
reversed, transposed/permuted, broadcast or a random mix of all of them) and returns an ndarray *view*
of exactly `shape` and `dtype` into a bigger buffer filled with random values. The values come from
`np.random.default_rng(seed)` with a seed drawn by hypothesis, so every failure replays exactly.

`out_buffers(shape, dtype, poison)` does the same for outputs: a writable view into a bigger buffer
that is entirely filled with a poison value, plus a mask of the elements the view covers, so a test
can check that every element of the view was written and nothing outside it was touched.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

# How values are made: fill(rng, shape) -> float64 / int / bool array of that shape (cast afterwards).
Fill = Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]

FLOAT_DTYPES = ("float32", "float64", "float16")
LAYOUTS = ("contiguous", "offset", "window", "strided", "reversed", "transposed", "broadcast", "mixed")
WRITABLE_LAYOUTS = ("contiguous", "offset", "window", "strided", "reversed", "transposed", "mixed_writable")

seeds = st.integers(min_value=0, max_value=2**32 - 1)


# -- shapes -------------------------------------------------------------------------------------------


def rarely(draw: st.DrawFn) -> bool:
    """True about one draw in eight: for 0-size dims, interesting but cheap to cover."""
    return draw(st.integers(0, 7)) == 7


@st.composite
def shapes(draw: st.DrawFn, *, min_dims: int = 0, max_dims: int = 4, max_side: int = 7) -> tuple[int, ...]:
    """Array shapes with sides 1..max_side; about one in eight has a 0-size dim."""
    shape = list(draw(hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=1, max_side=max_side)))
    if shape and rarely(draw):
        shape[draw(st.integers(0, len(shape) - 1))] = 0
    return tuple(shape)


@st.composite
def broadcastable_shapes(
    draw: st.DrawFn, num_shapes: int, *, min_dims: int = 0, max_dims: int = 4, max_side: int = 5
) -> hnp.BroadcastableShapes:
    """Mutually broadcastable shapes (size-1 and missing dims); about one in eight has a 0-size result dim,
    which the inputs reach by a 0 of their own or by broadcasting a 1."""
    drawn = draw(
        hnp.mutually_broadcastable_shapes(
            num_shapes=num_shapes, min_dims=min_dims, max_dims=max_dims, min_side=1, max_side=max_side
        )
    )
    result = list(drawn.result_shape)
    if not result or not rarely(draw):
        return drawn
    dim = draw(st.integers(1, len(result)))  # counted from the right, as broadcasting aligns
    inputs = [list(s) for s in drawn.input_shapes]
    having = [s for s in inputs if len(s) >= dim]
    for s in having:
        if s[-dim] != 1:
            s[-dim] = 0
    if all(s[-dim] == 1 for s in having):
        having[draw(st.integers(0, len(having) - 1))][-dim] = 0
    result[-dim] = 0
    return hnp.BroadcastableShapes(tuple(tuple(s) for s in inputs), tuple(result))


# -- values -------------------------------------------------------------------------------------------


def uniform(low: float = -1.0, high: float = 1.0) -> Fill:
    """Uniform floats in [low, high) (for float dtypes; use `integers` for integer ones)."""

    def fill(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        return rng.uniform(low, high, size=shape)

    return fill


def integers(low: int, high: int) -> Fill:
    def fill(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        return rng.integers(low, high, size=shape, endpoint=True)

    return fill


def booleans(p_true: float = 0.5) -> Fill:
    def fill(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        return rng.random(shape) < p_true

    return fill


def default_fill(dtype: np.dtype) -> Fill:
    if dtype == np.bool_:
        return booleans()
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return integers(max(info.min, -100), min(info.max, 100))
    return uniform()


def random_array(
    rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype | str, fill: Fill | None = None,
    *, nonzero: bool = True,
) -> np.ndarray:  # fmt: skip
    """A C-contiguous array of random values; with `nonzero`, never all zeros (unless empty)."""
    dtype = np.dtype(dtype)
    values = np.asarray((fill or default_fill(dtype))(rng, shape)).astype(dtype)
    if nonzero and values.size and not values.any():
        values.flat[int(rng.integers(values.size))] = 1
    return values


# -- layouts ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """How a view of `shape` sits in its buffer.

    Storage dim i of the buffer holds view axis perm[i]; along it the view starts at `starts[i]`, steps
    by `steps[i]` (negative: reversed) and the buffer has `tails[i]` spare elements at the end. Axes in
    `broadcast` are stored with size 1 and broadcast (stride 0). `flat_offset` > 0 instead takes a
    C-contiguous view starting `flat_offset` elements into a 1-D buffer.
    """

    kind: str
    perm: tuple[int, ...]
    steps: tuple[int, ...]
    starts: tuple[int, ...]
    tails: tuple[int, ...]
    broadcast: frozenset[int] = frozenset()
    flat_offset: int = 0

    def stored_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        physical = tuple(1 if d in self.broadcast else n for d, n in enumerate(shape))
        return tuple(physical[p] for p in self.perm)

    def buffer_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        if self.flat_offset:
            return (self.flat_offset + int(np.prod(shape)),)
        return tuple(
            start + max(n - 1, 0) * abs(step) + 1 + tail
            for n, step, start, tail in zip(self.stored_shape(shape), self.steps, self.starts, self.tails)
        )

    def carve(self, buffer: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """The view of `shape` into `buffer` (which has `buffer_shape(shape)`)."""
        if self.flat_offset:
            return buffer[self.flat_offset : self.flat_offset + int(np.prod(shape))].reshape(shape)
        index = []
        for n, step, start in zip(self.stored_shape(shape), self.steps, self.starts):
            s = abs(step)
            index.append(slice(start, start + n * s, s))
        view = buffer[(*index, Ellipsis)]  # Ellipsis: a 0-d view, never a scalar
        flips = tuple(slice(None, None, -1 if step < 0 else 1) for step in self.steps)
        view = view[(*flips, Ellipsis)].transpose(np.argsort(self.perm))
        if self.broadcast:
            view = np.broadcast_to(view, shape)
        return view

    def describe(self) -> str:
        parts = [self.kind]
        if self.flat_offset:
            parts.append(f"flat_offset={self.flat_offset}")
        if self.perm != tuple(range(len(self.perm))):
            parts.append(f"perm={self.perm}")
        if any(s != 1 for s in self.steps):
            parts.append(f"steps={self.steps}")
        if any(self.starts):
            parts.append(f"starts={self.starts}")
        if self.broadcast:
            parts.append(f"broadcast={sorted(self.broadcast)}")
        return " ".join(parts)


@st.composite
def layouts(draw: st.DrawFn, ndim: int, kinds: Sequence[str] = LAYOUTS) -> Layout:
    """A random layout of the given kind family for an `ndim`-d view."""
    kind = draw(st.sampled_from(tuple(kinds)))
    identity = tuple(range(ndim))
    ones, zeros = (1,) * ndim, (0,) * ndim
    small = st.integers(0, 2)
    if kind == "contiguous":
        return Layout(kind, identity, ones, zeros, zeros)
    if kind == "offset":
        return Layout(kind, identity, ones, zeros, zeros, flat_offset=draw(st.integers(1, 5)))
    if kind == "window":  # a sub-block of a bigger array that starts at index >= 1
        starts = tuple(draw(st.lists(st.integers(1, 2), min_size=ndim, max_size=ndim)))
        tails = tuple(draw(st.lists(small, min_size=ndim, max_size=ndim)))
        return Layout(kind, identity, ones, starts, tails)
    if kind == "strided":
        steps = list(draw(st.lists(st.integers(1, 3), min_size=ndim, max_size=ndim)))
        if ndim and all(s == 1 for s in steps):
            steps[draw(st.integers(0, ndim - 1))] = draw(st.integers(2, 3))
        starts = tuple(draw(st.lists(st.integers(0, 1), min_size=ndim, max_size=ndim)))
        return Layout(kind, identity, tuple(steps), starts, zeros)
    if kind == "reversed":
        steps = list(draw(st.lists(st.sampled_from((1, -1, -2)), min_size=ndim, max_size=ndim)))
        if ndim and all(s > 0 for s in steps):
            steps[draw(st.integers(0, ndim - 1))] = -1
        return Layout(kind, identity, tuple(steps), zeros, zeros)
    if kind == "transposed":
        perm = tuple(draw(st.permutations(identity)))
        if ndim >= 2 and perm == identity:  # at least swap the last two axes
            perm = (*identity[:-2], ndim - 1, ndim - 2)
        return Layout(kind, perm, ones, zeros, zeros)
    if kind == "broadcast":
        dims = draw(st.sets(st.integers(0, ndim - 1), min_size=1)) if ndim else set()
        return Layout(kind, identity, ones, zeros, zeros, broadcast=frozenset(dims))
    # "mixed" and "mixed_writable": everything at once
    perm = tuple(draw(st.permutations(identity)))
    steps = tuple(draw(st.lists(st.sampled_from((1, 2, 3, -1, -2)), min_size=ndim, max_size=ndim)))
    starts = tuple(draw(st.lists(small, min_size=ndim, max_size=ndim)))
    tails = tuple(draw(st.lists(small, min_size=ndim, max_size=ndim)))
    dims: frozenset[int] = frozenset()
    if kind == "mixed" and ndim:
        dims = frozenset(draw(st.sets(st.integers(0, ndim - 1))))
    return Layout(kind, perm, steps, starts, tails, broadcast=dims)


def element_indices(shape: tuple[int, ...]) -> np.ndarray:
    """Flat element numbers of a C-contiguous buffer of `shape`: carve it to see what a view covers."""
    return np.arange(int(np.prod(shape))).reshape(shape)


def make_view(
    rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype | str, layout: Layout,
    fill: Fill | None = None, *, nonzero: bool = True,
) -> np.ndarray:  # fmt: skip
    """Random values in a buffer, viewed through `layout`; with `nonzero`, never all zero."""
    dtype = np.dtype(dtype)
    buffer = random_array(rng, layout.buffer_shape(shape), dtype, fill, nonzero=False)
    view = layout.carve(buffer, shape)
    if nonzero and view.size and not view.any():  # make one element the view sees nonzero
        buffer.flat[int(layout.carve(element_indices(buffer.shape), shape).flat[0])] = 1
    assert view.shape == tuple(shape) and view.dtype == dtype
    return view


@st.composite
def views(
    draw: st.DrawFn, shape: Sequence[int], dtype: np.dtype | str, fill: Fill | None = None,
    kinds: Sequence[str] = LAYOUTS, *, nonzero: bool = True,
) -> np.ndarray:  # fmt: skip
    """A random view of exactly `shape` and `dtype` (see the module docstring)."""
    shape = tuple(int(n) for n in shape)
    layout = draw(layouts(len(shape), kinds))
    event(f"input layout: {layout.kind}")
    if 0 in shape:
        event("input with a 0-size dim")
    rng = np.random.default_rng(draw(seeds))
    return make_view(rng, shape, dtype, layout, fill, nonzero=nonzero)


@st.composite
def views_of(draw: st.DrawFn, values: np.ndarray, kinds: Sequence[str] = WRITABLE_LAYOUTS) -> np.ndarray:
    """A view holding exactly `values` (same dtype) in a random layout; for structured inputs (masks).

    The rest of the buffer is NaN for floats (True / 1 otherwise), so a kernel that reads past the view
    shows it."""
    values = np.asarray(values)
    layout = draw(layouts(values.ndim, kinds))
    filler = np.nan if values.dtype.kind == "f" else 1
    buffer = np.full(layout.buffer_shape(values.shape), filler, values.dtype)
    view = layout.carve(buffer, values.shape)
    view[...] = values
    return view


def writable_views(shape: Sequence[int], dtype: np.dtype | str, fill: Fill | None = None) -> st.SearchStrategy:
    """Views that can be written (no broadcast axes): for in-place calls."""
    return views(shape, dtype, fill, kinds=WRITABLE_LAYOUTS)


def describe_view(x: object) -> str:
    """Shape, dtype, strides and flags of an array, for assertion messages."""
    if not isinstance(x, np.ndarray):
        return repr(x)
    flags = "C" if x.flags.c_contiguous else ("F" if x.flags.f_contiguous else "strided")
    return f"{x.dtype}{list(x.shape)} strides={x.strides} {flags}{'' if x.flags.writeable else ' readonly'}"


# -- poisoned outputs ---------------------------------------------------------------------------------


@dataclass
class OutBuffer:
    """A writable `view` into `buffer`; `inside` marks the buffer elements the view covers."""

    buffer: np.ndarray
    view: np.ndarray
    inside: np.ndarray
    layout: Layout
    snapshot: np.ndarray  # the buffer's bytes before the call

    def untouched_outside(self) -> bool:
        bits = f"u{self.buffer.itemsize}"
        now, before = self.buffer.view(bits), self.snapshot.view(bits)
        return bool(np.array_equal(now[~self.inside], before[~self.inside]))


@st.composite
def out_buffers(draw: st.DrawFn, shape: Sequence[int], dtype: np.dtype | str, poison: float | int) -> OutBuffer:
    """A poisoned output view of `shape` (contiguous, offset, window, strided, reversed, transposed)."""
    shape = tuple(int(n) for n in shape)
    layout = draw(layouts(len(shape), WRITABLE_LAYOUTS))
    buffer_shape = layout.buffer_shape(shape)
    buffer = np.full(buffer_shape, poison, dtype=np.dtype(dtype))
    view = layout.carve(buffer, shape)
    inside = np.zeros(buffer.size, bool)
    inside[layout.carve(element_indices(buffer_shape), shape).ravel()] = True
    inside = inside.reshape(buffer_shape)
    assert view.flags.writeable and (view.size == 0 or np.shares_memory(view, buffer))
    return OutBuffer(buffer, view, inside, layout, buffer.copy())


def poison_for(dtype: np.dtype | str, reference: np.ndarray | None = None) -> float | int:
    """A value the op can never legitimately produce: NaN for floats (inf where the reference has NaN),
    the most negative value for integers."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        if reference is not None and np.isnan(reference).any():
            assert not np.isposinf(reference).any()
            return np.inf
        return np.nan
    return int(np.iinfo(dtype).min)
