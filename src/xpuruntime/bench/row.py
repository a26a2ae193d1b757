"""The row API: what a benchmark module declares (`Row`, `Setup`) and what a run records per row (`Result`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

TARGET_KINDS = ("ratio", "TB/s", "TFLOP/s", "µs over anchor")
UNITS = ("TB/s", "TFLOP/s", "ms", "µs")

Timer = Callable[[Callable[[], Any]], float]  # median milliseconds of one call


@dataclass
class Setup:
    """What a row's setup returns: the two callables to time and the work one call does.

    `anchor_bytes` / `anchor_flops` default to ours (same problem); set them when the anchor does a different
    amount of work (a plain copy as the bandwidth anchor, say). `check` runs after one call of `ours` and may
    return a message when ours computed a wrong result: the row is then reported as "wrong" and meets no
    target. `alternatives` (from `kernel_alternatives`) are timed beside ours, so the report shows how close
    automatic selection comes to the fastest kernel.

    `measure` is for rows whose variants cannot alternate call by call (a training step under a policy
    installs process-wide overrides; a host-cost row times µs-long calls in batches): given the run's timer,
    it returns median milliseconds by name, "ours" and "anchor" at least, and the runner uses them as they are.
    """

    ours: Callable[[], Any]
    anchor: Callable[[], Any] | None = None
    bytes: int = 0
    flops: int = 0
    anchor_bytes: int | None = None
    anchor_flops: int | None = None
    check: Callable[[], str | None] | None = None
    note: str = ""
    alternatives: dict[str, Callable[[], Any]] = field(default_factory=dict)
    measure: Callable[[Timer], dict[str, float]] | None = None


@dataclass(frozen=True)
class Row:
    """One benchmark line: `setup()` builds inputs (lazily, when the row runs) and returns a `Setup`.

    `group` is a finer label within the subject (a table section); `subject` is the module the row comes
    from (filled in by discovery). `target` is a ratio (ours over anchor throughput) when `target_kind` is
    "ratio", an absolute rate of ours in TB/s or TFLOP/s, or, for host-cost rows ("µs over anchor"), how many
    µs ours may take beyond the anchor. `units` is what the table reports for each side; `anchor` names what
    ours is compared with, `doc` says what the row measures. `requires` returns a reason string when the row
    cannot run here (no GPU, no nvmath), else None.
    """

    name: str
    group: str
    setup: Callable[[], Setup]
    target: float | None = None
    target_kind: str = "ratio"
    units: str = "TB/s"
    requires: Callable[[], str | None] | None = None
    doc: str = ""
    anchor: str = ""
    subject: str = ""

    def __post_init__(self) -> None:
        if self.target_kind not in TARGET_KINDS:
            raise ValueError(f"Row {self.name}: target_kind must be one of {TARGET_KINDS}, got {self.target_kind!r}")
        if self.units not in UNITS:
            raise ValueError(f"Row {self.name}: units must be one of {UNITS}, got {self.units!r}")


@dataclass
class Result:
    """The measured outcome of one row (what the result file holds per row)."""

    name: str
    group: str
    units: str
    target: float | None
    target_kind: str
    ours_ms: float | None = None
    anchor_ms: float | None = None
    ours_value: float | None = None  # in `units`
    anchor_value: float | None = None
    ratio: float | None = None  # ours over anchor throughput (anchor time over ours for equal work)
    met: bool | None = None
    missed_by: float | None = None  # fraction of the target short, e.g. 0.12 = 12 % short
    status: str = "ok"  # ok | skipped | error | wrong
    message: str = ""
    alternatives_ms: dict[str, float] = field(default_factory=dict)  # each registered kernel, forced by policy
    ours_vs_best: float | None = None  # fastest alternative's time over ours
    selection_vs_best: dict[str, float] = field(default_factory=dict)  # "auto"/"autotune": fastest time over theirs
    subject: str = ""
    anchor: str = ""
    doc: str = ""
    source: str = ""  # a row transcribed from an older measurement: its raw file, relative to the result file

    @classmethod
    def for_row(cls, row: Row) -> Result:
        """An empty result carrying the row's identity and target."""
        return cls(row.name, row.group, row.units, row.target, row.target_kind, subject=row.subject,
                   anchor=row.anchor, doc=row.doc)  # fmt: skip
