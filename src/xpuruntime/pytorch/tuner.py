"""Autotune hands a call signature, then a whole op family, back to PyTorch when routing it through
xpuruntime cannot pay for itself.

A routed call costs host time that PyTorch's own call does not (the Python override, the dispatcher,
an autograd Function for attention and the norms), and an eager training step is usually host-bound.
So under `autotune` each signature the overrides route gets a verdict when it is tuned: run our fastest
kernel only when it beats PyTorch's own (the `torch` backend's candidates, timed in the same tuning) by
more than that op's routing cost (`ROUTING_COST_US`); otherwise the plan runs PyTorch's kernel, which
the native matrix-product routes then reach without Python. When every signature of an op family has
said "PyTorch" and no new signature has appeared for a while, the family is handed back: the policy
stops steering it and its aten overrides are removed once the current backward has finished (never while
an override is running), so the family costs nothing again. Signatures first seen afterwards run
PyTorch's kernels. An op without a PyTorch candidate (e.g. layer_norm_backward) has no say; a family
where nothing could be compared keeps routing. Explicit kernel names are never handed back, and calls
made through `xrt.ops` directly keep the fastest kernel (routed calls dispatch under a twin of the policy,
`routed_view`, so the two never share a plan). Calls that the native matrix-product routes serve from
C++ (signatures already tuned to PyTorch's kernel) count too: the extension reports them in batches.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch

from .. import autotune
from ..policy import KernelPolicy, current_policy
from . import native
from .families import FAMILY_OF, all_preferences, rebuilt
from .state import STATE, Verdicts

log = logging.getLogger("xpuruntime.pytorch")

# host µs a routed call adds over PyTorch's own call in the GPT example's training step on the H100
# (bf16; the step's profile, BENCHMARKS.md): a GEMM through the Python route, and each direction
# (forward or backward) of an autograd-Function route
ROUTING_COST_US = {"matmul": 40.0, "attention": 250.0, "layer_norm": 200.0, "rms_norm": 200.0}
TIMING_NOISE = 0.03  # a gain within 3 % of PyTorch's time is not trusted (single-launch event timings)
QUIET_CALLS = 32  # routed calls of a family without a new signature before it may be handed back
NATIVE_FAMILY = "matmul"  # the family whose calls the native (C++) routes serve: mm, bmm, addmm
_tuner = STATE.tuner


def steering(policy: KernelPolicy) -> tuple:
    """What a policy steers, without its math mode or sync: the policy `autocast` scopes in the forward
    and the one in force in the backward then share their verdicts and hand-backs."""
    key = _tuner.steering.get(policy.fingerprint)
    if key is None:
        if len(_tuner.steering) > 1024:
            _tuner.steering.clear()
        prefs = frozenset(policy.preferences.items())
        key = _tuner.steering[policy.fingerprint] = (policy.autotune, policy.autotune_ops, prefs, policy.deterministic)
    return key


class _Routed(KernelPolicy):
    """A tuning policy as the aten overrides dispatch under it: the same choices, plans of its own (autotune
    weighs the routing cost for routed calls only, so a direct `xrt.ops` call must not share their plans)."""

    __slots__ = ()

    def _content(self) -> tuple:
        return (*super()._content(), "routed by the aten overrides")


def routed_view(policy: KernelPolicy) -> KernelPolicy:
    """The policy a routed call dispatches under: a tuning policy's `_Routed` twin, any other policy itself."""
    if not (policy.autotune or policy.autotune_ops) or type(policy) is _Routed:
        return policy
    view = _tuner.views.get(policy.fingerprint)
    if view is None:
        if len(_tuner.views) > 1024:
            _tuner.views.clear()
        view = _tuner.views[policy.fingerprint] = rebuilt(policy, all_preferences(policy), _Routed)
    return view


def on_tuned(op: str, key: str, times: dict[str, float], backends: dict[str, str], policy: KernelPolicy) -> str | None:
    """Autotune arbiter for the calls the overrides route: record whether this signature beats PyTorch's
    own kernel by more than the routing cost, and if not, name PyTorch's fastest kernel to run."""
    family = FAMILY_OF.get(op)
    if family is None or type(policy) is not _Routed:
        return None
    if _tuner.graph_warmups:  # a replayed graph launches its kernels without any host work
        route, why = verdict(op, times, backends, 0.0)
        why += " (tuned for a CUDA graph: no routing cost on replay)"
    else:
        route, why = verdict(op, times, backends, ROUTING_COST_US.get(family, 0.0))
    if family == NATIVE_FAMILY:
        _count_native_calls()
    with _tuner.lock:
        state = _tuner.families.setdefault((steering(current_policy()), family), Verdicts())
        if key not in state.verdicts:
            state.quiet = 0
        state.verdicts[key] = (route, why)
    if route is False:
        return min((name for name in times if backends.get(name) == "torch"), key=times.__getitem__)
    return None


def verdict(op: str, times: dict[str, float], backends: dict[str, str], cost_us: float) -> tuple[bool | None, str]:
    """(route?, reason) for one tuned signature: route when ours beat PyTorch's by more than `cost_us`
    plus the timing noise;
    None when there is no PyTorch kernel to compare with (the family's other ops decide)."""
    theirs = [t for name, t in times.items() if backends.get(name) == "torch"]
    ours = {name: t for name, t in times.items() if backends.get(name) != "torch"}
    if not theirs:
        return None, f"{op}: no PyTorch kernel to compare with"
    if not ours:
        return False, f"{op}: only PyTorch's kernel can run"
    best = min(ours, key=ours.__getitem__)
    gain = min(theirs) - ours[best]
    margin = cost_us + TIMING_NOISE * min(theirs)
    needed = f"{margin:.0f} us (routing cost {cost_us:.0f} us + timing noise)"
    if gain > margin:
        return True, f"{op}: {best} beats PyTorch by {gain:.1f} us > {needed}"
    return False, f"{op}: {best} gains {gain:.1f} us over PyTorch, under {needed}"


@contextlib.contextmanager
def for_graph() -> Iterator[None]:
    """Signatures tuned inside this block (a CUDA graph's warm-up) run captured, so their verdicts charge no
    routing cost. Process-wide: a backward's calls are tuned on autograd's own threads."""
    with _tuner.lock:
        _tuner.graph_warmups += 1
    try:
        yield
    finally:
        with _tuner.lock:
            _tuner.graph_warmups -= 1


def note_call(op: str, calls: int = 1) -> None:
    """Count routed calls of `op`; hand its family back when every verdict says PyTorch and no new
    signature came for QUIET_CALLS calls (checked inside a backward pass: its end is a safe point)."""
    family = FAMILY_OF.get(op)
    steers = steering(current_policy())
    state = _tuner.families.get((steers, family)) if family else None
    if state is None or state.returned:
        return
    state.quiet += calls
    if state.quiet < max(QUIET_CALLS, 4 * len(state.verdicts)) or not _inside_backward():
        return
    routes = {route for route, _ in state.verdicts.values()}
    if True in routes or False not in routes:  # some signature gains, or nothing was compared
        return
    _hand_back(steers, family, state)


def _count_native_calls() -> None:
    """Have the native routes report the calls they serve (all are NATIVE_FAMILY's), in batches."""
    native.report_native_calls(_native_calls, QUIET_CALLS // 4)


def _native_calls(calls: int) -> None:
    note_call(NATIVE_FAMILY, calls)


def _inside_backward() -> bool:
    return torch._C._current_graph_task_id() != -1


def _hand_back(steers: tuple, family: str, state: Verdicts) -> None:
    with _tuner.lock:
        state.returned = True
        ops = {op for op, head in FAMILY_OF.items() if head == family}
        _tuner.returned[steers] = _tuner.returned.get(steers, frozenset()) | ops
        _tuner.reasons[family] = "; ".join(sorted({why for _, why in state.verdicts.values()}))
        STATE.router.routed.clear()  # the routed sets cached per policy: some lose this family now
    log.info("autotune hands %s back to PyTorch: %s", family, _tuner.reasons[family])
    torch.autograd.Variable._execution_engine.queue_callback(STATE.refresh)


def handed_back() -> dict[str, str]:
    """The op families autotune handed back to PyTorch, with the verdicts that decided it."""
    with _tuner.lock:
        return dict(_tuner.reasons)


def verdicts() -> dict[str, list[tuple[bool | None, str]]]:
    """Every tuned signature's verdict per op family (route it to our kernel?, why), all policies."""
    with _tuner.lock:
        found: dict[str, list[tuple[bool | None, str]]] = {}
        for (_, family), state in _tuner.families.items():
            found.setdefault(family, []).extend(state.verdicts.values())
        return found


def watching() -> bool:
    """Whether any family has verdicts (the routed path counts calls only then)."""
    return bool(_tuner.families)


def reset() -> None:
    """Forget every verdict and hand-back (e.g. after kernels were registered); overrides follow."""
    with _tuner.lock:
        _tuner.families.clear()
        _tuner.returned.clear()
        _tuner.reasons.clear()
        STATE.router.routed.clear()
    native.report_native_calls(None)
    STATE.refresh()


if on_tuned not in autotune.ARBITERS:
    autotune.ARBITERS.append(on_tuned)
