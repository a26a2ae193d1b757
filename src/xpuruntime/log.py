"""Dispatch logging: every dispatched op with its kernel, the reason, shapes and time.

Observers (this log, profilers) are kept in `OBSERVERS`; the dispatcher takes its slow, timed path
only while that list is non-empty, so logging costs nothing when it is off.
"""

from __future__ import annotations

import collections
import contextlib
import operator
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np

from .errors import ArgumentError, clip

if TYPE_CHECKING:
    from .plan import Plan

DEFAULT_MAX_RECORDS = 10_000
MAX_CAPACITY = 2**31 - 1  # a bound beyond any memory, still a valid deque size


class DispatchEvent(NamedTuple):
    """What an observer hears about one dispatch. Times are time.perf_counter_ns() values; `thread_id`
    is the OS thread id (what trace viewers show)."""

    plan: Plan
    record: DispatchRecord
    dispatch_start_ns: int
    launch_start_ns: int
    launch_end_ns: int
    thread_id: int


class Observer(Protocol):
    def on_dispatch(self, event: DispatchEvent) -> None: ...


OBSERVERS: list[Observer] = []
_observers_lock = threading.Lock()
_on_change: list[Callable[[], None]] = []


def add_observer(observer: Observer) -> None:
    with _observers_lock:
        added = observer not in OBSERVERS
        if added:
            OBSERVERS.append(observer)
    if added:
        _observers_changed()


def remove_observer(observer: Observer) -> None:
    with _observers_lock:
        removed = observer in OBSERVERS
        if removed:
            OBSERVERS.remove(observer)
    if removed:
        _observers_changed()


def on_observers_changed(listener: Callable[[], None]) -> None:
    """Call `listener()` after each change of `OBSERVERS` (the native aten routes forget their decisions)."""
    _on_change.append(listener)


def _observers_changed() -> None:
    for listener in list(_on_change):
        listener()


ORIGINS = ("eager", "compile", "graph")


class DispatchRecord(NamedTuple):
    """One line of the dispatch log. `reason` is how the plan chose its kernel (policy / auto /
    fallback); `cache_hit` says whether this call reused a cached plan. `elapsed_us` is the launch.
    `origin`: "eager" for a call made as the program ran, "graph" for one made by a compiled graph (a
    front end's custom op inside it), "compile" for a decision made while a graph was compiled (no launch)."""

    op_name: str
    selected_kernel: str
    backend: str
    reason: str
    cache_hit: bool
    input_shapes: tuple[tuple[int, ...], ...]
    dtype: str
    elapsed_us: float
    launch_config: str
    timestamp: float  # time.time() when the record was made
    origin: str = "eager"

    def as_dict(self) -> dict[str, Any]:
        """The record as a plain dict (for JSON and tables)."""
        return self._asdict()

    @classmethod
    def make(cls, plan: Plan, cache_hit: bool, elapsed_us: float, origin: str | None = None) -> DispatchRecord:
        """The record of one dispatch of `plan`: its decision's fields, whether the plan came from the cache, the time
        taken, and where the call came from (`origin`, else the innermost `dispatch_origin` block's, else eager)."""
        op, kernel, backend, reason, shapes, dtype, config = plan.log_fields
        origin = origin or _origin.value or "eager"
        return cls(op, kernel, backend, reason, cache_hit, shapes, dtype, elapsed_us, config, time.time(), origin)


class _Origin(threading.local):
    value: str | None = None  # None: not set by any block ("eager")


_origin = _Origin()


def current_origin() -> str | None:
    """The origin set by the innermost `dispatch_origin` block of this thread, None outside any."""
    return _origin.value


@contextlib.contextmanager
def dispatch_origin(origin: str) -> Iterator[None]:
    """Record the dispatches this thread makes inside the block with `origin` (see DispatchRecord)."""
    if origin not in ORIGINS:
        raise ArgumentError(f"dispatch_origin: argument 'origin' expected one of {ORIGINS}, got {clip(origin)}")
    before, _origin.value = _origin.value, origin
    try:
        yield
    finally:
        _origin.value = before


def log_record(
    op: str, kernel: str, backend: str, reason: str, shapes: tuple, dtype: str, origin: str
) -> DispatchRecord | None:
    """Add a call that ran outside the dispatcher (a front end handed it to its framework's own kernel, with
    `reason`) to the dispatch log, if it is on."""
    if _log not in OBSERVERS:
        return None
    record = DispatchRecord(op, kernel, backend, reason, False, shapes, dtype, 0.0, "", time.time(), origin)
    _log.records.append(record)
    return record


def log_decision(plan: Plan, origin: str) -> DispatchRecord | None:
    """Add a decision made without a launch (e.g. while compiling a graph) to the dispatch log, if it is on."""
    if _log not in OBSERVERS:
        return None
    record = DispatchRecord.make(plan, False, 0.0, origin)
    _log.records.append(record)
    return record


class DispatchLog:
    """A bounded in-memory buffer of DispatchRecords: the oldest records go first."""

    def __init__(self, max_records: int = DEFAULT_MAX_RECORDS) -> None:
        self.records: collections.deque[DispatchRecord] = collections.deque(maxlen=max_records)

    def on_dispatch(self, event: DispatchEvent) -> None:
        self.records.append(event.record)


_log = DispatchLog()


def check_capacity(function: str, arg: str, value: object) -> int:
    """A buffer bound: an int >= 1 (None would mean unbounded, which is never what a long run wants)."""
    try:
        number = operator.index(value) if not isinstance(value, bool | np.bool_) else 0
    except (TypeError, ValueError):  # not an integer, or one whose __index__ fails
        number = 0
    if not 1 <= number <= MAX_CAPACITY:
        raise ArgumentError(f"{function}: argument '{arg}' expected an int in [1, {MAX_CAPACITY}], got {clip(value)}")
    return number


def enable_dispatch_logging(max_records: int = DEFAULT_MAX_RECORDS) -> None:
    """Start recording every dispatch (keeps at most `max_records`, dropping the oldest)."""
    max_records = check_capacity("enable_dispatch_logging", "max_records", max_records)
    if _log.records.maxlen != max_records:
        _log.records = collections.deque(_log.records, maxlen=max_records)
    add_observer(_log)


def disable_dispatch_logging() -> None:
    """Stop recording dispatches; the records kept so far stay readable."""
    remove_observer(_log)


def dispatch_logging_enabled() -> bool:
    """Whether dispatches are being recorded."""
    return _log in OBSERVERS


def get_dispatch_logs() -> list[DispatchRecord]:
    """The records kept so far, oldest first (at most `max_records` of them)."""
    return list(_log.records)


def clear_dispatch_logs() -> None:
    """Forget the records kept so far (logging stays on or off as it was)."""
    _log.records.clear()
