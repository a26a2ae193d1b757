"""Native routes: the mm / bmm / addmm overrides and nn.Linear's autocast override in C++
(`native_routes.cpp`), so that a call already known to run PyTorch's own kernel (or, for linear, the C++
`fused_cast` kernel) costs no Python.

The C++ override keys each call as the dispatcher's plan key does (dtype, shape, strides, device,
16-byte alignment). A signature it has not seen goes to the Python route (`aten_matmul`), which reports
what it decided; from then on a call that the route hands to PyTorch's kernel (the policy's kernel is
PyTorch's own, or declines the call) runs that kernel straight from C++, and the rest keep the Python
route. Decisions are forgotten whenever one could change (`reset`): the process policy, the registry, the
dispatch observers, the installed overrides. They are kept per policy (the process one, or the scoped
policy open on the calling thread), and neither used nor learned while dispatch logging or profiling
observes calls. Under `autotune` a signature is learned once it is tuned: its plan is fixed from then on.

The C++ fused_cast linear's backward computes fp32 weight and bias gradients with one cuBLASLt GEMM (BGRADB
epilogue) where nvmath-python can plan it: `_plan_bias_grad` plans each problem once, C++ launches it.

The routes are part of xpuruntime's C++ extension (`runtime/extension.py`). Where it cannot be built, or
with XPURUNTIME_NATIVE=0, the Python overrides run as before (`status()` says why).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch

from .. import log as dispatch_log
from ..errors import XpuRuntimeError
from ..policy import KernelPolicy, _scoped, process_policy
from ..runtime import extension

ROUTE_IDS = {"mm": 0, "bmm": 1, "addmm": 2, "linear": 3}  # RouteOp in the C++ source
PYTHON, PYTORCH, FUSED_CAST = 0, 1, 2  # Action in the C++ source: what a learned signature runs


class _Extension:
    ops: Any = None  # torch.ops.xpuruntime_native once loaded
    tried = False
    python_routes: torch.library.Library | None = None
    routing = False  # native overrides installed now


_ext = _Extension()
_lock = threading.Lock()


def load() -> Any | None:
    """The extension's ops with the Python routes registered, on first call; None where the extension
    cannot be built (see `status`)."""
    if not _ext.tried:
        with _lock:
            if not _ext.tried:
                if extension.load() is not None:
                    _ext.python_routes = _register_python_routes()
                    extension.load().set_bias_grad_planner(_plan_bias_grad)
                    dispatch_log.on_observers_changed(reset)
                    _ext.ops = torch.ops.xpuruntime_native
                _ext.tried = True
    return _ext.ops


# -- the fused_cast backward's dW + db GEMMs -------------------------------------------------------------

# every plan handed to C++, by problem, alive for the process: C++ launches them through raw pointers
_bias_grad_plans: dict[tuple, tuple[Any, tuple[int, ...]] | None] = {}
_bias_grad_lock = threading.Lock()


def _plan_bias_grad(rows: torch.Tensor, dy: torch.Tensor) -> tuple[int, ...] | bool | None:
    """C++ asks once per problem (shapes, dtype, device and the alignment of rows and dy): the raw cuBLASLt
    launch arguments of a BGRADB GEMM for dW and db; None where cuBLASLt cannot, False to be asked again
    (planning now would break a CUDA graph being captured)."""
    from ..backends.cublaslt.common import pointer_alignment

    alignments = tuple(pointer_alignment(t.data_ptr()) for t in (rows, dy))
    key = (dy.device, dy.dtype, *rows.shape, dy.shape[1], *alignments)
    with _bias_grad_lock:  # one plan per problem: C++ may hold the first one's pointers
        if key not in _bias_grad_plans:
            if torch.cuda.is_current_stream_capturing():
                return False
            _bias_grad_plans[key] = _new_bias_grad_plan(rows, dy)
        found = _bias_grad_plans[key]
    return None if found is None else found[1]


def _new_bias_grad_plan(rows: torch.Tensor, dy: torch.Tensor) -> tuple[Any, tuple[int, ...]] | None:
    from ..backends.cublaslt import common, linear

    if common.probe() is not None:
        return None
    try:
        plan = linear.weight_and_bias_grad_plan(rows, dy)
    except Exception as exc:  # e.g. no cuBLASLt algorithm for this problem: the unfused backward serves
        logging.getLogger("xpuruntime").info("fused_cast backward: no BGRADB plan for %s (%s)", tuple(dy.shape), exc)
        return None
    args = plan.entry_args()
    if args is None:
        plan.free()
        return None
    return plan, args


def fuse_bias_grad(enabled: bool = True) -> None:
    """Whether the fused_cast backward takes dW and db from one BGRADB GEMM (the default) or from a GEMM and
    a column sum; no-op where the extension is not loaded."""
    if load() is not None:
        extension.load().set_bias_grad_planner(_plan_bias_grad if enabled else None)


def status() -> str:
    if _ext.ops is not None:
        return "native (C++) matrix-product and autocast-linear routes"
    return extension.status()


# -- the Python side of each route -------------------------------------------------------------------

# True (PYTORCH): the call ran PyTorch's own kernel for reasons fixed by its signature and the policy;
# False (PYTHON): it ran one of ours, through Python; FUSED_CAST: the C++ fused_cast linear; None: nothing
# may be learned from it (e.g. a nested call); or a function that says which, asked only when the
# decision is to be learned
Decision = bool | int | None | Callable[[], bool | int | None]
_routes: dict[str, tuple[Callable[..., tuple[torch.Tensor, Decision]], str]] = {}


def python_route(name: str, key: str = "CompositeExplicitAutograd") -> Callable:
    """Register `fn(*args) -> (out, decision)` as the Python route of aten::name, at dispatch `key`
    (CompositeImplicitAutograd for a route above autograd, whose outputs carry their own graph)."""

    def register(fn: Callable) -> Callable:
        _routes[name] = (fn, key)
        return fn

    return register


def _register_python_routes() -> torch.library.Library:
    library = torch.library.Library("xpuruntime_native", "IMPL")
    for name, (fn, key) in _routes.items():
        library.impl(f"route_{name}", _reporting(name, fn), key)
    return library


def _reporting(name: str, route: Callable) -> Callable:
    op_id = ROUTE_IDS[name]

    def run(*args: Any) -> torch.Tensor:
        *call, epoch = args
        out, decision = route(*call)
        if epoch >= 0 and not dispatch_log.OBSERVERS:
            if callable(decision):
                decision = decision()
            if decision is None:
                return out
            tensors = [x for x in call if isinstance(x, torch.Tensor)]
            scalars = [x for x in call if isinstance(x, int | float | complex)]
            dtype = next((x for x in call if isinstance(x, torch.dtype)), None)
            _ext.ops.learn(op_id, tensors, scalars, dtype, epoch, scope_token(_scoped.get()), int(decision))
        return out

    return run


# -- control -----------------------------------------------------------------------------------------


def install(aten_name: str, dispatch_key: str) -> Callable[[], None] | None:
    """Override aten::name at `dispatch_key` with its native route; returns its remover, or None where
    there is no native route."""
    if aten_name not in _routes or load() is None:
        return None
    handle = _ext.ops.install(aten_name, dispatch_key)
    return lambda: _ext.ops.uninstall(handle)


_watched: list[weakref.ref] = []


def watch_registry(registry: Any) -> None:
    """Forget the learned decisions whenever `registry` (the routing dispatcher's) changes."""
    _watched[:] = [ref for ref in _watched if ref() is not None]
    if not any(ref() is registry for ref in _watched):
        _watched.append(weakref.ref(registry))
        registry.on_change(_registry_changed)


def _registry_changed(op: str) -> None:
    reset()


def reset(routing: bool | None = None) -> None:
    """Forget every learned decision; the fast path stays on only where learning is sound.
    `routing`: whether native overrides are installed now (None: unchanged)."""
    if _ext.ops is None:
        return
    if routing is not None:
        _ext.routing = routing
    try:
        policy = process_policy()
    except XpuRuntimeError:  # a malformed environment policy: every routed call raises it anyway
        policy = None
    _ext.ops.reset(_ext.routing and policy is not None and not dispatch_log.OBSERVERS)


class _Scopes(threading.local):
    def __init__(self) -> None:
        self.told: list[bool] = []  # per open scope of this thread: told to the extension?


_scopes = _Scopes()


def scope_token(policy: KernelPolicy | None) -> int:
    """What the extension keys a policy's decisions by: 0 for the process policy, else the scoped
    policy's fingerprint serial + 1."""
    return 0 if policy is None else policy.fingerprint.serial + 1


def scope_entered(policy: KernelPolicy) -> None:
    ops = _ext.ops
    _scopes.told.append(ops is not None)
    if ops is not None:
        ops.enter_scope(scope_token(policy))


def scope_exited() -> None:
    if _scopes.told and _scopes.told.pop():
        _ext.ops.exit_scope()


def report_native_calls(callback: Callable[[int], None] | None, every: int = 32) -> None:
    """Call callback(every) after each `every` calls the native routes serve (None: stop); no-op where the
    extension is not loaded. Autotune's hand-back counts these calls, which never reach Python."""
    if _ext.ops is not None:
        extension.load().report_native_calls(callback, every)


def stats() -> dict[str, int]:
    """Native calls, Python-routed calls, learned signatures, the epoch, whether the fast path is on, and the
    BGRADB GEMMs the fused_cast backward launched."""
    if _ext.ops is None:
        return {}
    names = ("native_calls", "routed_calls", "learned", "epoch", "enabled", "fused_bias_grads")
    return dict(zip(names, _ext.ops.stats()))
