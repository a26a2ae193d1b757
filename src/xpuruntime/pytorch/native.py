"""Native routes: the mm / bmm / addmm overrides and nn.Linear's autocast override in C++
(`native_routes.cpp`), so that a call already known to run PyTorch's own kernel (or, for linear, the C++
`fused_cast` kernel) costs no Python.

The C++ override keys each call as the dispatcher's plan key does (dtype, shape, strides, device,
16-byte alignment). A signature it has not seen goes to the Python route (`routes.matmul`), which reports
what it decided; from then on a call that the route hands to PyTorch's kernel (the policy's kernel is
PyTorch's own, or declines the call) runs that kernel straight from C++, and the rest keep the Python
route. Decisions are forgotten whenever one could change (`reset`): the process policy, the registry, the
dispatch observers, the installed overrides. They are kept per policy (the process one, or the scoped
policy open on the calling thread), and neither used nor learned while dispatch logging or profiling
observes calls. Under `autotune` a signature is learned once it is tuned: its plan is fixed from then on.

The C++ fused_cast linear's backward computes fp32 weight and bias gradients with one cuBLASLt GEMM (BGRADB
epilogue) where the cuBLASLt backend can plan it (`backends.cublaslt.bias_grad`); C++ launches the plan.

The routes are part of xpuruntime's C++ extension (`runtime/extension.py`). Where it cannot be built, or
with XPURUNTIME_NATIVE=0, the Python overrides run as before (`status()` says why).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from .. import log as dispatch_log
from ..errors import XpuRuntimeError
from ..policy import KernelPolicy, _scoped, process_policy
from ..runtime import extension
from .state import STATE

ROUTE_IDS = {"mm": 0, "bmm": 1, "addmm": 2, "linear": 3}  # RouteOp in the C++ source
PYTHON, PYTORCH, FUSED_CAST = 0, 1, 2  # Action in the C++ source: what a learned signature runs
_native = STATE.native


def load() -> Any | None:
    """The extension's ops with the Python routes registered, on first call; None where the extension
    cannot be built (see `status`)."""
    if not _native.tried:
        with _native.lock:
            if not _native.tried:
                module = extension.load()
                if module is not None:
                    _native.python_routes = _register_python_routes()
                    module.set_bias_grad_planner(_bias_grad_planner())
                    dispatch_log.on_observers_changed(reset)
                    _native.ops = torch.ops.xpuruntime_native
                _native.tried = True
    return _native.ops


def _bias_grad_planner() -> Callable | None:
    """The cuBLASLt backend's planner of fused_cast's dW + db GEMM, or None where that backend is absent."""
    try:
        from ..backends.cublaslt.bias_grad import plan_weight_and_bias_grad
    except ImportError:
        return None
    return plan_weight_and_bias_grad


def fuse_bias_grad(enabled: bool = True) -> None:
    """Whether the fused_cast backward takes dW and db from one BGRADB GEMM (the default) or from a GEMM and
    a column sum; no-op where the extension is not loaded."""
    if load() is not None:
        extension.load().set_bias_grad_planner(_bias_grad_planner() if enabled else None)


def status() -> str:
    if _native.ops is not None:
        return "native (C++) matrix-product and autocast-linear routes"
    return extension.status()


# -- the Python side of each route -------------------------------------------------------------------

# True (PYTORCH): the call ran PyTorch's own kernel for reasons fixed by its signature and the policy;
# False (PYTHON): it ran one of ours, through Python; FUSED_CAST: the C++ fused_cast linear; None: nothing
# may be learned from it (e.g. a nested call); or a function that says which, asked only when the
# decision is to be learned
Decision = bool | int | None | Callable[[], bool | int | None]


def python_route(name: str, key: str = "CompositeExplicitAutograd") -> Callable:
    """Register `fn(*args) -> (out, decision)` as the Python route of aten::name, at dispatch `key`
    (CompositeImplicitAutograd for a route above autograd, whose outputs carry their own graph)."""

    def register(fn: Callable) -> Callable:
        _native.route_functions[name] = (fn, key)
        return fn

    return register


def _register_python_routes() -> torch.library.Library:
    library = torch.library.Library("xpuruntime_native", "IMPL")
    for name, (fn, key) in _native.route_functions.items():
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
            _native.ops.learn(op_id, tensors, scalars, dtype, epoch, scope_token(_scoped.get()), int(decision))
        return out

    return run


# -- control -----------------------------------------------------------------------------------------


def install(aten_name: str, dispatch_key: str) -> Callable[[], None] | None:
    """Override aten::name at `dispatch_key` with its native route; returns its remover, or None where
    there is no native route."""
    if aten_name not in _native.route_functions or load() is None:
        return None
    handle = _native.ops.install(aten_name, dispatch_key)
    return lambda: _native.ops.uninstall(handle)


def watch_registry(registry: Any) -> None:
    """Forget the learned decisions whenever `registry` (the routing dispatcher's) changes."""
    watched = _native.watched
    watched[:] = [ref for ref in watched if ref() is not None]
    if not any(ref() is registry for ref in watched):
        watched.append(weakref.ref(registry))
        registry.on_change(_registry_changed)


def _registry_changed(op: str) -> None:
    reset()


def reset(routing: bool | None = None) -> None:
    """Forget every learned decision; the fast path stays on only where learning is sound.
    `routing`: whether native overrides are installed now (None: unchanged)."""
    if _native.ops is None:
        return
    if routing is not None:
        _native.routing = routing
    try:
        policy = process_policy()
    except XpuRuntimeError:  # a malformed environment policy: every routed call raises it anyway
        policy = None
    _native.ops.reset(_native.routing and policy is not None and not dispatch_log.OBSERVERS)


def scope_token(policy: KernelPolicy | None) -> int:
    """What the extension keys a policy's decisions by: 0 for the process policy, else the scoped
    policy's fingerprint serial + 1."""
    return 0 if policy is None else policy.fingerprint.serial + 1


def scope_entered(policy: KernelPolicy, steers_native: bool = True) -> None:
    """A scoped policy's block begins on this thread: the C++ routes key their decisions by it. Skipped (no
    C++ call) where neither it, the process policy nor an open outer scope steers an op they serve: their
    decisions then all run PyTorch's kernels, right for this scope too."""
    ops = _native.ops
    told = ops is not None and (steers_native or any(STATE.threads.native))
    STATE.threads.native.append(told)
    if told:
        ops.enter_scope(scope_token(policy))


def scope_exited() -> None:
    told = STATE.threads.native
    if told and told.pop():
        _native.ops.exit_scope()


def report_native_calls(callback: Callable[[int], None] | None, every: int = 32) -> None:
    """Call callback(every) after each `every` calls the native routes serve (None: stop); no-op where the
    extension is not loaded. Autotune's hand-back counts these calls, which never reach Python."""
    if _native.ops is not None:
        extension.load().report_native_calls(callback, every)


def stats() -> dict[str, int]:
    """Native calls, Python-routed calls, learned signatures, the epoch, whether the fast path is on, and the
    BGRADB GEMMs the fused_cast backward launched."""
    if _native.ops is None:
        return {}
    names = ("native_calls", "routed_calls", "learned", "epoch", "enabled", "fused_bias_grads")
    return dict(zip(names, _native.ops.stats()))
