"""The PyTorch front end's state: one object, `STATE`, that every layer reads and writes.

Nothing else in `xpuruntime.pytorch` keeps mutable module-level data. The groups below belong to the
layers that own them (see the package docstring for the layering): `router` (the dispatcher the routes
use and what it derives from the op schemas), `tuner` (autotune's verdicts and hand-backs), `native`
(the C++ routes), `install` (the aten registrations in place), `tracing` (what compiled graphs were
built under). A test can reset the whole front end by resetting these groups.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RouterState:
    """The dispatcher the routes use (the process-wide one unless a test swaps it) and values derived once
    per dispatcher from its op schemas and the policies seen."""

    dispatcher: Any = None
    run: Callable[..., Any] | None = None
    memo: dict[Hashable, Any] = field(default_factory=dict)  # attribute tuples, input orders, backward routes
    routed: dict[Any, frozenset[str]] = field(default_factory=dict)  # policy fingerprint -> ops it steers
    family: dict[tuple, Any] = field(default_factory=dict)  # (fingerprint, registry, generation) -> policy
    warned: set[tuple[str, str]] = field(default_factory=set)  # (op, kernel) fallback warnings given
    pinned: dict[str, Any] = field(default_factory=dict)  # a pinned policy's key (its JSON) -> the policy


@dataclass
class Verdicts:
    """Autotune's verdicts for one op family under one tuning policy: tuning key -> (route?, why)."""

    verdicts: dict[str, tuple[bool | None, str]] = field(default_factory=dict)
    quiet: int = 0
    returned: bool = False


@dataclass
class TunerState:
    """Autotune's verdicts on routed calls and the families it handed back to PyTorch."""

    families: dict[tuple, Verdicts] = field(default_factory=dict)  # (steering key, family head) -> verdicts
    returned: dict[tuple, frozenset[str]] = field(default_factory=dict)  # steering key -> ops no longer steered
    reasons: dict[str, str] = field(default_factory=dict)  # family head -> why it was handed back
    steering: dict[Any, tuple] = field(default_factory=dict)  # fingerprint -> steering key
    views: dict[Any, Any] = field(default_factory=dict)  # fingerprint -> the policy routed calls dispatch under
    graph_warmups: int = 0  # CUDA-graph warm-ups running (their tuning charges no routing cost)
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class NativeState:
    """The C++ routes (xpuruntime's extension): loaded or not, and what Python registered for them."""

    ops: Any = None  # torch.ops.xpuruntime_native once loaded
    tried: bool = False
    python_routes: Any = None  # the torch.library.Library holding the Python side of each route
    routing: bool = False  # native overrides installed now
    watched: list = field(default_factory=list)  # weak references to the registries whose changes reset decisions
    # aten op -> (its Python route, the dispatch key that route registers at), from `native.python_route`
    route_functions: dict[str, tuple[Callable[..., Any], str]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class InstallState:
    """The aten registrations in place: exactly those that the policies in force need, plus those of scopes
    that have ended, kept until the process policy next changes (re-entering such a scope costs nothing)."""

    removers: dict[tuple[str, str], Callable[[], None]] = field(default_factory=dict)  # (aten op, key) -> remove
    ops: frozenset[str] = frozenset()
    devices: tuple[str, ...] = ("cuda",)
    scoped: dict[Any, list] = field(default_factory=dict)  # fingerprint -> [policy, open scopes], any thread
    needed: dict[frozenset, frozenset] = field(default_factory=dict)  # routed ops -> those with overrides
    lock: threading.RLock = field(default_factory=threading.RLock)


@dataclass
class TracingState:
    """What the compiled graphs were decided under: decisions per call signature, the warnings given."""

    decisions: dict[tuple, bool] = field(default_factory=dict)  # (token, op, signature) -> our op in the graph?
    tokens: dict[Any, tuple] = field(default_factory=dict)  # policy fingerprint -> routing token
    warned: set[tuple[str, str]] = field(default_factory=set)  # (op, reason) warnings given
    explanations: list = field(default_factory=list)  # the latest compile-time decisions (Explanations)


@dataclass
class ReplayState:
    """Fused ops' eager bodies kept as launch recipes (custom_ops.replay)."""

    recipes: dict[tuple, Any] = field(default_factory=dict)  # signature -> 1 (seen once), a Recipe or "not replayable"
    owner: tuple | None = None  # (id of the dispatcher, its registry's generation) the recipes belong to


class _ThreadScopes(threading.local):
    """Per thread: what each open scope changed, undone when it closes."""

    def __init__(self) -> None:
        self.multithreading: list[bool] = []  # autograd's multithreading flag as each scope found it
        self.native: list[bool] = []  # per open scope: told to the C++ routes?
        self.eager_bodies = 0  # fused ops' bodies running eagerly here (custom_ops.eager), not in a compiled graph
        self.inlining = 0  # fused ops' bodies being traced into a graph here (custom_ops.inline)


@dataclass
class FrontEndState:
    router: RouterState = field(default_factory=RouterState)
    tuner: TunerState = field(default_factory=TunerState)
    native: NativeState = field(default_factory=NativeState)
    install: InstallState = field(default_factory=InstallState)
    tracing: TracingState = field(default_factory=TracingState)
    replay: ReplayState = field(default_factory=ReplayState)
    threads: _ThreadScopes = field(default_factory=_ThreadScopes)
    # set by `install` at import: brings the aten registrations in line with the policies (a lower layer
    # that changes what is routed, autotune's hand-back, calls it without importing the layer above)
    refresh: Callable[[], None] = lambda: None


STATE = FrontEndState()
