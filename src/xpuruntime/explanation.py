"""`explain`: every candidate kernel for a call, its verdict, the reasons it was rejected and its score."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .arguments import attr_values, coerce_input, fill_inputs, freeze
from .context import build_context
from .errors import XpuRuntimeError
from .policy import KernelPolicy, as_policy, current_policy

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from .context import DispatchContext
    from .dispatch import Dispatcher
    from .selector import Candidate, Decision


def explain_call(
    dispatcher: Dispatcher, op: str, inputs: tuple, policy: KernelPolicy | str | Mapping | None, out: Any,
    attrs: Mapping[str, Any],
) -> Explanation:  # fmt: skip
    """Evaluate every candidate for a call (arrays or TensorSpecs) without running or caching anything."""
    schema = dispatcher.registry.op(op)
    inputs = tuple(coerce_input(schema, n, x, specs=True) for n, x in zip(schema.inputs, fill_inputs(schema, inputs)))
    policy = as_policy(policy) or current_policy()
    ctx = build_context(schema, inputs, freeze(attr_values(schema, attrs)), out, policy)
    try:
        decision, error = dispatcher.selector.select(ctx, policy), None
        candidates = list(decision.candidates)
    except XpuRuntimeError as exc:  # the explanation shows why nothing could be chosen
        candidates = dispatcher.selector.evaluate(ctx, policy.preferences.get(op))  # as select() saw them
        decision, error = None, exc
    return Explanation(ctx, policy, candidates, decision, error)


def unavailable_backend(backend: str, reasons: list[str]) -> bool:
    """Whether a candidate was rejected only because its backend cannot run here (no GPU, a missing library):
    the same reason for every kernel of that backend, which a reader needs once."""
    return len(reasons) == 1 and reasons[0].startswith(f"backend '{backend}' unavailable: ")


@dataclass(frozen=True)
class Explanation:
    ctx: DispatchContext
    policy: KernelPolicy
    candidates: list[Candidate]
    decision: Decision | None
    error: Exception | None
    origin: str = "eager"  # "compile": the decision a compiled graph was built with (see log.ORIGINS)

    @property
    def selected(self) -> str | None:
        return self.decision.kernel.name if self.decision else None

    def verdict(self, candidate: Candidate) -> str:
        if self.decision is not None and candidate.kernel is self.decision.kernel:
            return f"selected ({self.decision.reason})"
        return "supported" if candidate.supported else "rejected"

    def rows(self) -> list[dict[str, Any]]:
        """One dict per candidate: kernel, backend, verdict, score, reasons (best first). (What `print` and
        `str` show merges the kernels of an unavailable backend into one row: `display_rows`.)"""
        return [
            {
                "kernel": c.kernel.name,
                "backend": c.kernel.backend,
                "verdict": self.verdict(c),
                "score": c.score,
                "reasons": list(c.reasons),
            }
            for c in self.candidates
        ]

    def display_rows(self) -> list[dict[str, Any]]:
        """`rows()` as shown to a reader: the kernels rejected only because their backend is unavailable are
        one row per backend, its kernels listed, the backend's reason said once."""
        shown: list[dict[str, Any]] = []
        merged: dict[str, dict[str, Any]] = {}
        for row in self.rows():
            if row["verdict"] == "rejected" and unavailable_backend(row["backend"], row["reasons"]):
                if row["backend"] in merged:
                    merged[row["backend"]]["kernel"] += f", {row['kernel']}"
                    continue
                merged[row["backend"]] = row = dict(row)
            shown.append(row)
        return shown

    def headline(self) -> str:
        if self.decision is not None:
            outcome = f"selected '{self.decision.kernel.name}' ({self.decision.reason})"
        else:
            outcome = f"no kernel: {type(self.error).__name__}"
        where = " (decided while compiling a graph)" if self.origin == "compile" else ""
        return f"{self.ctx.op}({self.ctx.summary()}) under {self.policy!r}: {outcome}{where}"

    def __str__(self) -> str:
        lines = [self.headline()]
        for row in self.display_rows():
            score = "-" if row["score"] is None else f"{row['score']:g}"
            reasons = "; ".join(row["reasons"])
            lines.append(f"  {row['kernel']:<16} {row['backend']:<8} {row['verdict']:<20} {score:>6}  {reasons}")
        if self.error is not None:
            lines.append(str(self.error))
        return "\n".join(lines)

    def table(self) -> Table:
        """The candidates as a rich table (the headline is printed above it by `print`)."""
        from rich.table import Table
        from rich.text import Text

        table = Table()
        for column in ("kernel", "backend", "verdict", "score", "reasons"):
            table.add_column(column, justify="right" if column == "score" else "left")
        for row in self.display_rows():
            verdict = row["verdict"]
            style = "bold green" if verdict.startswith("selected") else ("red" if verdict == "rejected" else None)
            score = "-" if row["score"] is None else f"{row['score']:g}"
            cells = (row["kernel"], row["backend"], verdict, score, "\n".join(row["reasons"]))
            table.add_row(*(Text(cell) for cell in cells), style=style)  # Text: reasons may contain [brackets]
        return table

    def print(self, console: Console | None = None) -> None:
        from rich.console import Console
        from rich.text import Text

        console = console or Console()
        console.print(Text(self.headline()), soft_wrap=True)
        console.print(self.table())
        if self.error is not None:
            console.print(Text(str(self.error), style="red"))
