"""Host-time helpers the probes share (not a probe itself)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def host_us(fn: Callable[[], Any], calls: int = 100, rounds: int = 60) -> float:
    """Best-of-rounds host µs per call of a CUDA call: each round starts from an idle GPU and stops the clock
    before the GPU catches up, so the launch queue never fills and the figure is host time, not kernel time."""
    import torch

    best = float("inf")
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    torch.cuda.synchronize()
    return best


def per_call_us(variants: dict[str, Callable[[], Any]], number: int = 20_000, repeat: int = 15,
                sync: Callable[[], Any] | None = None) -> dict[str, float]:  # fmt: skip
    """Best µs per call of each variant over `repeat` interleaved rounds of `number` calls (`sync`, a device
    synchronize, ends each round)."""
    sync = sync or (lambda: None)
    best = dict.fromkeys(variants, float("inf"))
    for _ in range(repeat):
        for name, fn in variants.items():
            sync()
            start = time.perf_counter()
            for _ in range(number):
                fn()
            sync()
            best[name] = min(best[name], (time.perf_counter() - start) / number * 1e6)
    return best
