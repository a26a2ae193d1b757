"""The process-wide set of aten overrides: those the policies in force need, installed once.

After a change of the process policy the set of ops named by the process policy or by an active scoped
policy (any thread) is recomputed; when it changes, the registrations it no longer needs are removed and
the new ones added, each in a `torch.library.Library("aten", "IMPL")` of its own, or natively for the
matrix products (`native`). An empty set means no registration: PyTorch untouched.

Entering a scoped policy only adds what it needs and is missing; its overrides stay after it ends, until
the process policy next changes (or `refresh_overrides()`), so a scope opened around every call costs a
few µs instead of a rebuild. Each override checks the policy of its own thread at call time, so a scoped
policy in one thread never steers another thread's calls, and an override no policy needs any more hands
every call to PyTorch. Before installing, the current registrations are inspected: a kernel that another
library registered for the same op and key raises `OverrideConflictError`.

A scoped policy lives in this thread's context, which autograd's per-device worker threads do not see:
so while a scope that routes something is active, this thread runs its own backward passes (autograd's
multithreading is off for it), and the matrix products of a backward called inside the scope follow it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from ..dispatch import track_launches
from ..errors import XpuRuntimeError
from ..policy import KernelPolicy, process_policy
from ..runtime import extension
from . import native
from .router import routed_ops
from .routes import ROUTES
from .state import STATE

_BUILTIN_MARKERS = ("aten/src/ATen", "torch/csrc", "build/aten")
_OWN_SOURCES = {str(Path(__file__).resolve()), __file__, *map(str, extension.SOURCES)}  # where our overrides register
_DEVICE_KEYS = {  # the dispatch key of each override level, per device type
    "cuda": {"backend": "CUDA", "autograd": "AutogradCUDA", "autocast": "AutocastCUDA"},
    "cpu": {"backend": "CPU", "autograd": "AutogradCPU", "autocast": "AutocastCPU"},
}
_installed = STATE.install
NATIVE_OPS = frozenset({"matmul", "linear", "autocast_linear"})  # the families the C++ routes serve


class OverrideConflictError(XpuRuntimeError):
    """Another library already overrides an aten kernel that the policy needs."""


def installed_overrides() -> dict[str, list[str]]:
    """The overridden aten ops per xpuruntime op, e.g. {'matmul': ['mm@CUDA', 'bmm@CUDA', ...]}."""
    with _installed.lock:
        return {op: [f"{name}@{key}" for name, key in _functions(op)] for op in sorted(_installed.ops)}


def _functions(op: str) -> dict[tuple[str, str], Callable]:
    """(aten op, dispatch key) -> override function, for every routed device type."""
    functions = {}
    for device in _installed.devices:
        for aten_name, level, fn in ROUTES.get(op, ()):
            functions[(aten_name, _DEVICE_KEYS[device][level])] = fn
    return functions


def _needed(policy: KernelPolicy) -> frozenset[str]:
    """The routed ops of `policy` that have overrides (cached per policy: scope entry is a hot path)."""
    routed = routed_ops(policy)
    needed = _installed.needed.get(routed)
    if needed is None:
        if len(_installed.needed) > 1024:
            _installed.needed.clear()
        needed = _installed.needed[routed] = frozenset(op for op in routed if op in ROUTES)
    return needed


def _wanted_ops() -> frozenset[str]:
    return frozenset().union(_needed(process_policy()), *(_needed(entry[0]) for entry in _installed.scoped.values()))


def refresh_overrides() -> None:
    """Make the installed overrides exactly those the policies in force need (after every change of the
    process policy; also drops those kept for scopes that have ended)."""
    with _installed.lock:
        wanted = _wanted_ops()
        if wanted != _installed.ops:
            _rebuild(wanted)


STATE.refresh = refresh_overrides  # autotune's hand-back calls it (a layer below this one)


def scope_entered(policy: KernelPolicy) -> None:
    """A scoped policy's block begins: add the overrides it needs (nothing is rebuilt when they are in place)."""
    with _installed.lock:
        entry = _installed.scoped.get(policy.fingerprint)
        if entry is None:
            _installed.scoped[policy.fingerprint] = [policy, 1]
        else:
            entry[1] += 1
        needed = _needed(policy)
        if not needed <= _installed.ops:
            try:
                _rebuild(_installed.ops | needed)
            except BaseException:  # the block never runs, so its exit is never heard: forget the scope now
                _forget_scope(policy)
                raise
    native.scope_entered(policy, _needed(policy) & NATIVE_OPS or _needed(process_policy()) & NATIVE_OPS)
    threads = STATE.threads
    threads.multithreading.append(torch._C._is_multithreading_enabled())
    if routed_ops(policy):
        torch._C._set_multithreading_enabled(False)  # a backward here runs here, under this scope


def scope_exited(policy: KernelPolicy) -> None:
    torch._C._set_multithreading_enabled(STATE.threads.multithreading.pop())
    native.scope_exited()
    _forget_scope(policy)


def _forget_scope(policy: KernelPolicy) -> None:
    with _installed.lock:
        entry = _installed.scoped[policy.fingerprint]
        entry[1] -= 1
        if entry[1] <= 0:
            del _installed.scoped[policy.fingerprint]


def route_devices(devices: Iterable[str]) -> None:
    """Which device types get overrides: ('cuda',) normally; tests add 'cpu' to exercise routing on CPU."""
    with _installed.lock:
        devices = tuple(devices)
        unknown = set(devices) - set(_DEVICE_KEYS)
        if unknown:
            raise XpuRuntimeError(f"route_devices: unknown device type(s) {sorted(unknown)}; expected cuda or cpu")
        ops, _installed.devices = _installed.ops, devices
        _rebuild(frozenset(), check=False)
        _rebuild(ops)


def _rebuild(ops: frozenset[str], check: bool = True) -> None:
    """Make the installed overrides those `ops` need: a registration both sets share stays in place, so
    a concurrent call never finds aten's own kernel in between."""
    functions: dict[tuple[str, str], Callable] = {}
    for op in sorted(ops):
        functions.update(_functions(op))
    added = {where: fn for where, fn in functions.items() if where not in _installed.removers}
    if check:
        for aten_name, key in added:
            _check_no_foreign_kernel(aten_name, key)
    if functions:
        track_launches(True)  # before any override exists: they must see which calls our kernels make
    for (aten_name, key), fn in added.items():
        _installed.removers[(aten_name, key)] = _install(aten_name, key, fn)
    for where in [where for where in _installed.removers if where not in functions]:
        _installed.removers.pop(where)()
    _installed.ops = ops
    if not functions:
        track_launches(False)
    native.reset(routing=bool(functions))


def _install(aten_name: str, key: str, fn: Callable) -> Callable[[], None]:
    """Override aten::name at `key`: natively (C++) where `native` has a route, else with `fn` in a
    Python library of its own. Returns what removes it."""
    remove = native.install(aten_name, key)
    if remove is None:
        library = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="(?s).*Overriding a previously registered kernel")
            library.impl(aten_name, fn, key)
        remove = library._destroy
    _forget_python_dispatch(aten_name)

    def removed() -> None:
        remove()
        _forget_python_dispatch(aten_name)

    return removed


def _forget_python_dispatch(aten_name: str) -> None:
    """PyTorch's Python dispatcher (used while torch.compile traces) caches which key serves each op: after a
    registration changes, a stale entry would call a kernel that is gone (aten's autograd fallback)."""
    packet = getattr(torch.ops.aten, aten_name)
    for overload in packet.overloads():
        getattr(packet, overload)._dispatch_cache.clear()


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
