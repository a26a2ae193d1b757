"""The selector: from the registry's candidates, drop those that cannot run, score the rest, pick one.

Rules: a policy's preferred kernel that supports the call wins ("policy"); one that
does not falls back to automatic choice ("fallback"), or raises in strict mode; with no preference the
best-scoring supported kernel wins ("auto"). Ties go to the alphabetically first kernel name, so the
choice never depends on import or registration order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .context import DispatchContext
from .errors import NoKernelError, UnknownNameError, UnsupportedByPolicyError
from .policy import KernelPolicy
from .registry import KernelSpec, Registry

Scorer = Callable[[KernelSpec, DispatchContext], float]

FUSED_BONUS = 50
TENSOR_CORE_BONUS = 30


def default_scorer(kernel: KernelSpec, ctx: DispatchContext) -> float:
    """Base priority, +50 if fused, +30 if it uses tensor cores on sm80 or newer."""
    score = float(kernel.priority)
    if kernel.fused:
        score += FUSED_BONUS
    if kernel.tensor_cores and ctx.compute_capability is not None and ctx.compute_capability >= (8, 0):
        score += TENSOR_CORE_BONUS
    return score


@dataclass(frozen=True)
class Candidate:
    """One kernel's verdict for a call: the reasons it cannot run (empty = supported) and its score."""

    kernel: KernelSpec
    reasons: tuple[str, ...]
    score: float | None  # None when rejected

    @property
    def supported(self) -> bool:
        return not self.reasons


@dataclass(frozen=True)
class Decision:
    """The selector's answer, with everything needed to explain it."""

    ctx: DispatchContext
    kernel: KernelSpec
    reason: str  # "policy", "auto" or "fallback"
    preferred: str | None
    candidates: tuple[Candidate, ...]

    def preferred_refusal(self) -> str:
        """For a "fallback": why the policy's kernel could not run the call ("'k' cannot run <call>: <reasons>")."""
        chosen = next(c for c in self.candidates if c.kernel.name == self.preferred)
        return f"'{self.preferred}' cannot run {self.ctx.summary()}: {'; '.join(chosen.reasons)}"


def _format_reasons(candidates: Sequence[Candidate]) -> str:
    lines = []
    for c in candidates:
        verdict = "; ".join(c.reasons) if c.reasons else f"supported (score {c.score:g})"
        lines.append(f"  - {c.kernel.name} [{c.kernel.backend}]: {verdict}")
    return "\n".join(lines) or "  (no kernels registered)"


class Selector:
    """Filter, score and choose. The scorer is replaceable: `Selector(scorer=my_cost_model)`."""

    def __init__(self, registry: Registry, scorer: Scorer = default_scorer) -> None:
        self.registry = registry
        self.scorer = scorer

    def evaluate(self, ctx: DispatchContext, preferred: str | None = None) -> list[Candidate]:
        """Every kernel of the op with its reasons and score, best first (ties by name)."""
        candidates = []
        for kernel in self.registry.kernels_for(ctx.op):
            reasons = tuple(self.registry.not_supported_reasons(kernel, ctx, preferred))
            score = None if reasons else self.scorer(kernel, ctx)
            candidates.append(Candidate(kernel, reasons, score))
        candidates.sort(key=lambda c: (c.score is None, -(c.score or 0.0), c.kernel.name))
        return candidates

    def select(self, ctx: DispatchContext, policy: KernelPolicy) -> Decision:
        preferred = policy.preferences.get(ctx.op)
        candidates = self.evaluate(ctx, preferred)
        best = candidates[0] if candidates and candidates[0].supported else None
        if preferred is not None:
            try:  # an unknown name (e.g. from the environment, read before user kernels exist): error + suggestion
                self.registry.kernel(ctx.op, preferred)
            except UnknownNameError as exc:
                raise type(exc)(f"{policy.source}: {exc}" if policy.source else str(exc)) from None
            chosen = next(c for c in candidates if c.kernel.name == preferred)
            if chosen.supported:
                return Decision(ctx, chosen.kernel, "policy", preferred, tuple(candidates))
            if policy.strict:
                raise UnsupportedByPolicyError(
                    f"{ctx.op}: strict policy prefers '{preferred}', which cannot run this call "
                    f"({ctx.summary()}):\n{_format_reasons(candidates)}"
                )
        if best is None:
            raise NoKernelError(
                f"{ctx.op}: no registered kernel supports this call ({ctx.summary()}):\n{_format_reasons(candidates)}"
            )
        reason = "auto" if preferred is None else "fallback"
        return Decision(ctx, best.kernel, reason, preferred, tuple(candidates))
