"""The policy inside torch.compile: what a route decides while a graph is traced, the guard that recompiles
a graph when the routing changes, and the calls a policy cannot take.

While torch.compile traces a function (Dynamo's fake tensors, then AOTAutograd's functional tensors), the
routes at or above autograd (SDPA, layer_norm, rms_norm) still run. Where the policy in force then steers
the op, the route asks `in_graph` whether the graph gets our custom op (`custom_ops`) instead of PyTorch's
decomposition:

- with static shapes the call is decided once per signature, as a plan would be: a kernel the policy names
  that can run it puts our op in the graph (logged with origin "compile" and kept for
  `compiled_decisions()`); one that cannot leaves PyTorch's code there with one `KernelFallbackWarning`, or
  under `strict=True` fails the compilation with every candidate's reasons; `autotune` times our candidates
  against PyTorch's kernel on random inputs of the signature and puts our op in only where ours wins;
- with symbolic shapes our op goes in and decides at run time per concrete signature (the plan cache).

Every frame Dynamo compiles while xpuruntime.pytorch is loaded gets a guard on `router.routing_token()`
(what the policy in force steers, with which kernels, and whether strictly): a graph compiled under another
routing is never reused, so a policy change after compiling recompiles (Dynamo keeps each variant).
The routes and the fused ops install it while they trace, and the inductor pass (`compiled`) for frames
without either. The fused ops decide their kernels later, when AOTAutograd traces their bodies
(`custom_ops.inline`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import torch

from .. import log
from ..abi import TensorSpec
from ..errors import UnsupportedByPolicyError, XpuRuntimeError
from ..explanation import Explanation, explain_call
from ..policy import AUTOTUNE, KernelPolicy, current_policy
from .router import (
    NOT_OURS,
    family_policy,
    get_dispatcher,
    guard_routing,
    remember_compiled,
    routing_token,
    tensor_specs,
    warn_once,
)
from .state import STATE

_tracing = STATE.tracing
_MAX_DECISIONS = 4096


def in_graph(op: str, head: str, args: tuple, attrs: dict[str, Any], why_not: str | None = None) -> bool:
    """While tracing a call of `op` that the policy in force steers (through its family `head`): whether the
    graph gets our custom op. `why_not`: an argument no kernel of ours takes (e.g. dropout)."""
    guard_routing()
    policy = current_policy()
    if why_not is not None:
        declined(head, why_not, policy, args, origin="compile")
        return False
    specs = tensor_specs(args)
    if specs is None:
        return True  # symbolic shapes: decided at run time per concrete signature (the plan cache)
    key = (routing_token(), op, specs, tuple(sorted(attrs.items(), key=lambda kv: kv[0])))
    chosen = _tracing.decisions.get(key)
    if chosen is None:
        chosen = _decide(op, head, specs, attrs, family_policy(policy), policy)
        if len(_tracing.decisions) > _MAX_DECISIONS:
            _tracing.decisions.clear()
        _tracing.decisions[key] = chosen
    return chosen


def _decide(op: str, head: str, specs: tuple, attrs: dict, policy: KernelPolicy, user: KernelPolicy) -> bool:
    """One call site's decision at compile time (see the module docstring)."""
    dispatcher = get_dispatcher()
    if policy.tunes(op):
        return _tuned(op, head, specs, attrs, policy, user)
    explanation = dataclasses.replace(explain_call(dispatcher, op, specs, policy, None, attrs), origin="compile")
    remember_compiled(explanation)
    if isinstance(explanation.error, UnsupportedByPolicyError):
        raise UnsupportedByPolicyError(f"while compiling a graph: {explanation.error}") from None
    if explanation.decision is None:  # no kernel of ours takes this call: PyTorch's code stays
        error = explanation.error
        if error is not None and not isinstance(error, NOT_OURS):
            declined(head, str(error).splitlines()[0], user, specs, origin="compile")
        return False
    decision = explanation.decision
    if decision.reason == "fallback":
        declined(head, decision.preferred_refusal(), user, specs, origin="compile")
        return False
    _log(dispatcher, decision, policy)
    return True


def _tuned(op: str, head: str, specs: tuple, attrs: dict, policy: KernelPolicy, user: KernelPolicy) -> bool:
    """autotune at compile time: our fastest candidate against PyTorch's kernel on random inputs of this
    signature; our op goes in only where ours is faster (else inductor's code stays)."""
    from .. import autotune
    from ..arguments import attr_values, normalize_call

    dispatcher = get_dispatcher()
    schema = dispatcher.registry.op(op)
    with torch._subclasses.fake_tensor.unset_fake_temporarily(), torch.utils._python_dispatch._disable_current_modes():
        inputs = tuple(_random(s) for s in specs)
        try:
            inputs_, attrs_, _ = normalize_call(schema, inputs, attr_values(schema, attrs), None)
            decision = dispatcher.decide(op, inputs_, attrs_, None, policy)
        except XpuRuntimeError:
            return False
        supported = [c for c in decision.candidates if c.supported]
        times = autotune.time_candidates(dispatcher, decision, supported, inputs_, policy) if supported else {}
    backends = {c.kernel.name: c.kernel.backend for c in supported}
    ours = {name: t for name, t in times.items() if backends[name] != "torch"}
    theirs = [t for name, t in times.items() if backends[name] == "torch"]
    if not ours:
        return False
    best = min(ours, key=ours.__getitem__)
    chosen = not theirs or ours[best] < min(theirs)
    if chosen:
        winner = next(c for c in supported if c.kernel.name == best)
        _log(dispatcher, dataclasses.replace(decision, kernel=winner.kernel, reason=autotune.REASON), policy)
    return chosen


def _random(spec: Any) -> Any:
    """A real tensor like a traced one (random values; booleans mostly True), for timing at compile time."""
    if not isinstance(spec, TensorSpec):
        return spec
    dtype = getattr(torch, spec.dtype)
    if dtype == torch.bool:
        return torch.rand(spec.shape, device=spec.device) < 0.9
    if not dtype.is_floating_point:
        return torch.randint(0, 8, spec.shape, dtype=dtype, device=spec.device)
    return torch.randn(spec.shape, dtype=dtype, device=spec.device)


def _log(dispatcher: Any, decision: Any, policy: KernelPolicy) -> None:
    if log.dispatch_logging_enabled():
        with contextlib.suppress(Exception):  # a launch config that needs real arrays: the decision stands, unlogged
            log.log_decision(dispatcher.make_plan(decision, policy), "compile")


def compiled_decisions() -> list[Explanation]:
    """The decisions made while compiling graphs (the latest 256): every candidate of each routed call site
    with its verdict and reasons, as `explain` shows a call (origin "compile")."""
    return list(_tracing.explanations)


def declined(op: str, why: str, policy: KernelPolicy, args: tuple = (), origin: str | None = None) -> None:
    """A call the policy steers but no kernel of ours can take for an argument's sake: PyTorch's kernel runs
    it. One KernelFallbackWarning per op and reason, a dispatch-log entry, or under strict an error."""
    preferred = policy.preferences.get(op) or (AUTOTUNE if policy.tunes(op) else "")
    where = "while compiling a graph" if origin == "compile" else "for this call"
    message = f"{op}: the policy's kernel '{preferred}' cannot be used {where}: {why}"
    if policy.strict:
        raise UnsupportedByPolicyError(message)
    if log.dispatch_logging_enabled():
        tensors = [a for a in args if isinstance(a, torch.Tensor | TensorSpec)]
        shapes = tuple(tuple(int(n) for n in a.shape) if _concrete(a) else () for a in tensors)
        dtype = str(tensors[0].dtype).removeprefix("torch.") if tensors else ""
        log.log_record(op, "torch", "torch", "fallback", shapes, dtype, origin or "eager")
    warn_once(_tracing.warned, (op, why), f"{message}; PyTorch's kernel runs it", stacklevel=4)


def _concrete(t: Any) -> bool:
    return not any(isinstance(n, torch.SymInt) for n in t.shape)
