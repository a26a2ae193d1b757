"""Replaying a fused op's eager body: the Triton launches it made, relaunched with no Python of ours between.

An eager training step calls each fused op's forward and backward body dozens of times with the same few
signatures, and on a GPU the host time of a call (selector lookup, router, the kernel's Python around its
launch) exceeds the kernels' own time: the step is host-bound. So the third call of a signature (a body, a
policy, the tensors' shapes, strides, dtypes, device and pointer alignment, the other arguments) runs the body
once more while capturing what it does (`runtime.launch_capture`, and a dispatch mode that sees every
PyTorch operation), and when the body did nothing but allocate, view and launch compiled Triton kernels of
traceable Triton plans, keeps a `Recipe`: the allocations, each launch's grid and arguments (tensor arguments
as a source tensor and a byte offset into it, the sources being the call's tensors and the allocations), and
the outputs as views of the sources. Later calls of the signature allocate, launch and build the outputs from
the recipe: a few microseconds instead of tens.

Never replayed (the body runs as it always does): while dispatch logging or profiling observes calls (each
call must be seen), under a policy that autotunes (the call's or the one in force), for tensors off CUDA,
under Triton launch hooks, on another current device than the recording's, and for bodies that did anything
else (a PyTorch operation that computes, a plan of another backend or one that is not traceable: work the
capture cannot see), whose signature is kept with the reason it is not replayable. Recipes are forgotten when
the dispatcher or its registry changes, and `XPURUNTIME_EAGER_REPLAY=0` turns replaying off.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ... import log
from ...arrays import byte_range, describe
from ...policy import current_policy
from ...runtime.launch_capture import capturing
from ..router import get_dispatcher
from ..state import STATE
from .common import PLAIN_TENSORS, detached

try:
    from ...backends.triton.common import current_stream, launch_hooks_active
except ImportError:  # no Triton here: no Triton launches to replay
    current_stream = launch_hooks_active = None  # type: ignore[assignment]

ENABLED = launch_hooks_active is not None and os.environ.get("XPURUNTIME_EAGER_REPLAY", "1") != "0"
MAX_RECIPES = 2048  # signatures kept (a model has a few dozen); the store is cleared when full
REFUSED = "not replayable"  # the start of the reason kept for such a signature

_aten = torch.ops.aten
_ALLOCATIONS = frozenset({_aten.empty.memory_format, _aten.empty_strided.default, _aten.empty_like.default,
                          _aten.new_empty.default, _aten.new_empty_strided.default})  # fmt: skip
_METADATA = frozenset(
    {
        _aten._unsafe_view.default,
        _aten.detach.default,
        _aten.alias.default,
        _aten._reshape_alias.default,
        _aten.lift_fresh.default,
        _aten.promote_types.default,
        _aten.result_type.Tensor,
        _aten.result_type.Scalar,
    }
)  # fmt: skip  (no tensor data read)


def call(body: Callable[..., Any], args: tuple, policy: Any) -> Any:
    """body(*args, policy), by its recipe where one is kept (module docstring). `args` may hold tensors that
    require grad: the body gets them detached."""
    key = _key(body, args, policy)
    if key is None:
        return body(*detached(args), policy)
    store = _store()
    try:
        recipe = store.get(key)
    except TypeError:  # an unhashable argument: no signature to keep
        return body(*detached(args), policy)
    if type(recipe) is Recipe:
        if recipe.device == torch.cuda.current_device() and not launch_hooks_active():
            return recipe.replay(args)
        return body(*detached(args), policy)
    if recipe is None:  # first call: plans are made (maybe tuned) now; record on the next one
        store[key] = 1
        return body(*detached(args), policy)
    if type(recipe) is str or torch.cuda.is_current_stream_capturing():
        return body(*detached(args), policy)
    out, store[key] = _record(body, args, policy)
    return out


def forget() -> None:
    """Drop every recipe (tests; the store also empties itself when the dispatcher or registry changes)."""
    STATE.replay.recipes = {}
    STATE.replay.owner = None


# -- which calls may replay ---------------------------------------------------------------------------------


def _key(body: Callable[..., Any], args: tuple, policy: Any) -> tuple | None:
    """The call's signature, or None when it may not replay now (module docstring)."""
    if not ENABLED or log.OBSERVERS or _tunes(policy) or _tunes(current_policy()):
        return None
    parts: list[Any] = [body, policy.fingerprint]
    for a in args:
        if type(a) in PLAIN_TENSORS:
            if not a.is_cuda:
                return None
            parts.append((a.shape, a.stride(), a.dtype, a.get_device(), a.data_ptr() & 15))
        elif isinstance(a, torch.Tensor):
            return None
        elif type(a) is list:
            parts.append(tuple(a))
        else:
            parts.append(a)
    return tuple(parts)


def _tunes(policy: Any) -> bool:
    """Autotune times candidates and counts calls (`tuner`): its calls run their bodies."""
    return policy.autotune or bool(policy.autotune_ops)


def _store() -> dict:
    """This dispatcher's recipes (emptied when another dispatcher or a changed registry makes them stale)."""
    dispatcher = get_dispatcher()
    owner = (id(dispatcher), dispatcher.registry.generation)
    replay = STATE.replay
    if replay.owner != owner or len(replay.recipes) > MAX_RECIPES:
        replay.recipes, replay.owner = {}, owner
    return replay.recipes


# -- recording ----------------------------------------------------------------------------------------------


class _Watch(TorchDispatchMode):
    """Sees every PyTorch operation of the recorded body: allocations are kept (they become the recipe's),
    anything but an allocation or a view makes the body not replayable."""

    def __init__(self) -> None:
        super().__init__()
        self.allocations: list[torch.Tensor] = []
        self.computed: Any = None

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func in _ALLOCATIONS:
            self.allocations.append(out)
        elif not (func.is_view or func in _METADATA) and self.computed is None:
            self.computed = func
        return out


def _record(body: Callable[..., Any], args: tuple, policy: Any) -> tuple[Any, Recipe | str]:
    """body(*args, policy) run once more under capture, and its recipe (or why it is not replayable)."""
    watch = _Watch()
    with get_dispatcher().workspaces.per_call(), capturing() as captured, watch:  # workspaces become allocations
        out = body(*detached(args), policy)
    unfit = [p.kernel.qualified_name for p in captured.plans
             if p.kernel.backend != "triton" or not p.kernel.traceable or p.finish is not None]  # fmt: skip
    if watch.computed is not None:
        return out, f"{REFUSED}: PyTorch computed {watch.computed}"
    if unfit or not captured.plans:
        return out, f"{REFUSED}: plans other than traceable Triton kernels ({unfit or 'none'})"
    if not captured.launches or None in captured.launches:
        return out, f"{REFUSED}: a launch without a compiled kernel to call again"
    sources = [a for a in args if type(a) in PLAIN_TENSORS] + watch.allocations
    try:
        launches = tuple(_launch_of(launch, sources) for launch in captured.launches)
        outputs = _outputs_of(out, sources)
    except _Unmapped as exc:
        return out, f"{REFUSED}: {exc}"
    allocations = tuple((tuple(t.shape), t.stride(), t.dtype) for t in watch.allocations)
    return out, Recipe(torch.cuda.current_device(), allocations, launches, outputs)


class _Unmapped(Exception):
    """A tensor of the capture lies in none of the sources, or in several."""


def _source_of(t: torch.Tensor, sources: list) -> tuple[int, int]:
    """(index of the source whose memory holds t's first element, byte offset of it there)."""
    ptr, found = t.data_ptr(), []
    for i, s in enumerate(sources):
        start, end = byte_range(describe(s))
        if start <= ptr < end:
            found.append((i, ptr - s.data_ptr()))
    if len(found) != 1 or t.numel() == 0:
        raise _Unmapped(f"a tensor at {len(found)} sources ({tuple(t.shape)}, {t.dtype})")
    return found[0]


def _launch_of(launch: tuple, sources: list) -> tuple:
    """(kernel, grid, argument template, [(position, source, byte offset)], tail)."""
    kernel, grid, args, tail = launch
    template, pointers = list(args), []
    for position, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            source, offset = _source_of(a, sources)
            pointers.append((position, source, offset))
            template[position] = None
    grid3 = (*grid, 1, 1)[:3]
    return kernel, grid3, template, tuple(pointers), tail


def _outputs_of(out: Any, sources: list) -> Any:
    """How to rebuild the body's result: per tensor, its source and view (None for None)."""
    if isinstance(out, tuple):
        return tuple(_outputs_of(o, sources) for o in out)
    if out is None:
        return None
    if type(out) is not torch.Tensor:
        raise _Unmapped(f"an output of type {type(out).__name__}")
    source, offset = _source_of(out, sources)
    base = sources[source]
    if out.dtype != base.dtype or offset % out.element_size():
        raise _Unmapped("an output viewing its source as another dtype")
    if out is base:
        return _View(source, None)
    return _View(source, (tuple(out.shape), out.stride(), base.storage_offset() + offset // out.element_size()))


# -- replaying ----------------------------------------------------------------------------------------------


class _View(NamedTuple):
    """One output of a recipe: sources[source] itself (view None) or its (shape, stride, storage offset) view."""

    source: int
    view: tuple | None


@dataclass(frozen=True)
class Recipe:
    """A body's launches for one signature (module docstring): sources are the call's tensors, then the
    allocations; outputs are `_View`s (None for an absent output, tuples for several)."""

    device: int
    allocations: tuple[tuple[tuple[int, ...], tuple[int, ...], torch.dtype], ...]
    launches: tuple[tuple[Any, tuple[int, int, int], list, tuple, tuple], ...]
    outputs: Any

    def replay(self, args: tuple) -> Any:
        sources = [a for a in args if type(a) in PLAIN_TENSORS]
        device = sources[0].device
        for shape, stride, dtype in self.allocations:
            sources.append(torch.empty_strided(shape, stride, dtype=dtype, device=device))
        pointers = [s.data_ptr() for s in sources]
        stream = current_stream(self.device)
        for kernel, (g0, g1, g2), template, slots, tail in self.launches:
            values = list(template)
            for position, source, offset in slots:
                values[position] = pointers[source] + offset
            kernel.run(g0, g1, g2, stream, kernel.function, kernel.packed_metadata, None, None, None, *values, *tail)
        return _rebuild(self.outputs, sources)


def _rebuild(spec: Any, sources: list) -> Any:
    if spec is None:
        return None
    if type(spec) is not _View:
        return tuple(_rebuild(s, sources) for s in spec)
    base = sources[spec.source]
    return base if spec.view is None else base.as_strided(*spec.view)
