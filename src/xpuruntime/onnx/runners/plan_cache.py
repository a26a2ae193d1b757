"""A least-recently-used cache of execution plans, bounded in count and in bytes held."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any


class PlanCache:
    """Plans by signature key; adding one past either bound drops the least recently used ones (the newest
    plan always stays, even alone over the byte bound). `max_plans` or `max_bytes` 0 means no bound."""

    def __init__(self, max_plans: int, max_bytes: int) -> None:
        self.max_plans = max_plans
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple, Any] = OrderedDict()
        self._bytes: dict[tuple, int] = {}
        self._lock = threading.Lock()
        self.evictions = 0

    def get(self, key: tuple) -> Any:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def put(self, key: tuple, entry: Any, nbytes: int, on_evict: Callable[[Any], None] | None = None) -> None:
        with self._lock:
            self._entries[key] = entry
            self._entries.move_to_end(key)
            self._bytes[key] = nbytes
            while len(self._entries) > 1 and self._over():
                old, dropped = self._entries.popitem(last=False)
                del self._bytes[old]
                self.evictions += 1
                if on_evict is not None:
                    on_evict(dropped)

    def _over(self) -> bool:
        return bool(self.max_plans and len(self._entries) > self.max_plans) or bool(
            self.max_bytes and sum(self._bytes.values()) > self.max_bytes
        )

    @property
    def nbytes(self) -> int:
        return sum(self._bytes.values())

    def values(self) -> list[Any]:
        with self._lock:
            return list(self._entries.values())

    def last(self) -> Any:
        with self._lock:
            return next(reversed(self._entries.values()), None)

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[tuple]:
        return iter(list(self._entries))
