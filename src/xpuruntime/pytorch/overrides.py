"""The process-wide set of aten overrides: exactly those the active policies need, and nothing else.

After any policy change the set of ops named by the process policy or by an active scoped policy (any
thread) is recomputed; when it changes, the registrations it no longer needs are removed and the new
ones added, each in a `torch.library.Library("aten", "IMPL")` of its own, or natively for the matrix
products (`native_routes`). An empty set means no registration: PyTorch untouched.
Each override checks the policy of its own thread at call time, so a scoped policy in one thread never
steers another thread's calls. Before installing, the current registrations are inspected: a kernel
that another library registered for the same op and key raises `OverrideConflictError`.

A scoped policy lives in this thread's context, which autograd's per-device worker threads do not see:
so while a scope that routes something is active, this thread runs its own backward passes (autograd's
multithreading is off for it), and the matrix products of a backward called inside the scope follow it.
"""

from __future__ import annotations

import collections
import threading
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from ..dispatch import track_launches
from ..errors import XpuRuntimeError
from ..policy import KernelPolicy, process_policy
from ..runtime import extension
from . import aten_attention, aten_matmul, aten_norm, native_routes
from .routing import routed_ops

ROUTES: dict[str, tuple[tuple[str, str, Callable], ...]] = {}
for _module in (aten_matmul, aten_attention, aten_norm):
    for _op, _routes in _module.ROUTES.items():
        ROUTES[_op] = ROUTES.get(_op, ()) + _routes

_BUILTIN_MARKERS = ("aten/src/ATen", "torch/csrc", "build/aten")
_OWN_SOURCES = {str(Path(__file__).resolve()), __file__, *map(str, extension.SOURCES)}  # where our overrides register
_DEVICE_KEYS = {  # the dispatch key of each override level, per device type
    "cuda": {"backend": "CUDA", "autograd": "AutogradCUDA", "autocast": "AutocastCUDA"},
    "cpu": {"backend": "CPU", "autograd": "AutogradCPU", "autocast": "AutocastCPU"},
}


class OverrideConflictError(XpuRuntimeError):
    """Another library already overrides an aten kernel that the policy needs."""


class _Installed:
    def __init__(self) -> None:
        self.removers: dict[tuple[str, str], Callable[[], None]] = {}  # (aten op, dispatch key) -> remove it
        self.ops: frozenset[str] = frozenset()
        self.devices: tuple[str, ...] = ("cuda",)


_state = _Installed()
_scoped: collections.Counter[KernelPolicy] = collections.Counter()  # active scoped policies (any thread)
_lock = threading.RLock()


def installed_overrides() -> dict[str, list[str]]:
    """The overridden aten ops per xpuruntime op, e.g. {'matmul': ['mm@CUDA', 'bmm@CUDA', ...]}."""
    with _lock:
        return {op: [f"{name}@{key}" for name, key in _registrations(op)] for op in sorted(_state.ops)}


def _registrations(op: str) -> list[tuple[str, str]]:
    return list(_functions(op))


def _functions(op: str) -> dict[tuple[str, str], Callable]:
    """(aten op, dispatch key) -> override function, for every routed device type."""
    functions = {}
    for device in _state.devices:
        for aten_name, level, fn in ROUTES.get(op, ()):
            functions[(aten_name, _DEVICE_KEYS[device][level])] = fn
    return functions


def _wanted_ops() -> frozenset[str]:
    named = set(routed_ops(process_policy())).union(*(routed_ops(policy) for policy in _scoped))
    return frozenset(op for op in named if op in ROUTES)


def refresh_overrides() -> None:
    """Install or remove overrides to match the policies in force (called after every policy change)."""
    with _lock:
        wanted = _wanted_ops()
        if wanted != _state.ops:
            _rebuild(wanted)


def scope_entered(policy: KernelPolicy) -> None:
    with _lock:
        _scoped[policy] += 1
        try:
            refresh_overrides()
        except BaseException:  # the block never runs, so its exit is never heard: forget the scope now
            _forget_scope(policy)
            raise
    native_routes.scope_entered(policy)
    _backward_threads.saved.append(torch._C._is_multithreading_enabled())
    if routed_ops(policy):
        torch._C._set_multithreading_enabled(False)  # a backward here runs here, under this scope


def scope_exited(policy: KernelPolicy) -> None:
    torch._C._set_multithreading_enabled(_backward_threads.saved.pop())
    native_routes.scope_exited()
    _forget_scope(policy)


def _forget_scope(policy: KernelPolicy) -> None:
    with _lock:
        _scoped[policy] -= 1
        if _scoped[policy] <= 0:
            del _scoped[policy]
        refresh_overrides()


class _BackwardThreads(threading.local):
    saved: list[bool]

    def __init__(self) -> None:
        self.saved = []  # autograd's multithreading flag as each active scope of this thread found it


_backward_threads = _BackwardThreads()


def route_devices(devices: Iterable[str]) -> None:
    """Which device types get overrides: ('cuda',) normally; tests add 'cpu' to exercise routing on CPU."""
    with _lock:
        devices = tuple(devices)
        unknown = set(devices) - set(_DEVICE_KEYS)
        if unknown:
            raise XpuRuntimeError(f"route_devices: unknown device type(s) {sorted(unknown)}; expected cuda or cpu")
        ops, _state.devices = _state.ops, devices
        _rebuild(frozenset(), check=False)
        _rebuild(ops)


def _rebuild(ops: frozenset[str], check: bool = True) -> None:
    """Make the installed overrides those `ops` need: a registration both sets share stays in place, so
    a concurrent call never finds aten's own kernel in between."""
    functions: dict[tuple[str, str], Callable] = {}
    for op in sorted(ops):
        functions.update(_functions(op))
    added = {where: fn for where, fn in functions.items() if where not in _state.removers}
    if check:
        for aten_name, key in added:
            _check_no_foreign_kernel(aten_name, key)
    if functions:
        track_launches(True)  # before any override exists: they must see which calls our kernels make
    for (aten_name, key), fn in added.items():
        _state.removers[(aten_name, key)] = _install(aten_name, key, fn)
    for where in [where for where in _state.removers if where not in functions]:
        _state.removers.pop(where)()
    _state.ops = ops
    if not functions:
        track_launches(False)
    native_routes.reset(routing=bool(functions))


def _install(aten_name: str, key: str, fn: Callable) -> Callable[[], None]:
    """Override aten::name at `key`: natively (C++) where `native_routes` has a route, else with `fn` in a
    Python library of its own. Returns what removes it."""
    remove = native_routes.install(aten_name, key)
    if remove is not None:
        return remove
    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="(?s).*Overriding a previously registered kernel")
        library.impl(aten_name, fn, key)
    return library._destroy


def _check_no_foreign_kernel(aten_name: str, key: str) -> None:
    """Raise if the kernel active for aten::name at `key` was registered outside PyTorch and xpuruntime."""
    for line in torch._C._dispatch_dump(f"aten::{aten_name}").splitlines():
        if not line.startswith(f"{key}: registered at "):
            continue
        where = line.removeprefix(f"{key}: registered at ").split(" :: ")[0]
        ours = where.rsplit(":", 1)[0] in _OWN_SOURCES
        if not ours and not any(marker in where for marker in _BUILTIN_MARKERS):
            raise OverrideConflictError(
                f"cannot route aten::{aten_name} ({key}) through xpuruntime: another library already "
                f"overrides it (registered at {where}). Remove that override, or drop this op from the policy."
            )
