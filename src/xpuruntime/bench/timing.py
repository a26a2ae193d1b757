"""How rows are timed: device events on a GPU (or `triton.testing.do_bench`), the host clock elsewhere, and
variants interleaved so that drift (GPU clocks, host load) hits every variant alike."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from .row import Timer

ROUNDS = 4


def device_timer(warmup_ms: int = 25, rep_ms: int = 40) -> Timer:
    """Median milliseconds of one call by device events, each from a flushed L2 cache with the host latency
    before its first launch hidden (`autotune.cuda_sampler`). Its `sample` attribute (one call, µs) lets
    `interleaved` alternate variants call by call."""
    import torch

    from ..autotune import cuda_sampler

    measure = cuda_sampler(f"cuda:{torch.cuda.current_device()}", None)

    def timer(fn: Callable[[], Any]) -> float:
        until = time.perf_counter() + warmup_ms / 1e3
        once = measure(fn)
        while time.perf_counter() < until:
            once = measure(fn)
        reps = max(5, min(1000, int(rep_ms * 1e3 / max(once, 1.0))))
        return statistics.median(measure(fn) for _ in range(reps)) / 1e3

    timer.sample = measure  # type: ignore[attr-defined]
    timer.budget_ms = ROUNDS * rep_ms  # type: ignore[attr-defined]
    return timer


def do_bench_timer(warmup_ms: int = 25, rep_ms: int = 40) -> Timer:
    """Median milliseconds through `triton.testing.do_bench` (device events, L2 flushed between runs; the host
    latency before the first launch counts whenever it outlasts the flush)."""
    from triton.testing import do_bench

    def timer(fn: Callable[[], Any]) -> float:
        return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))

    return timer


def host_timer(warmup: int = 3, repeat: int = 11) -> Timer:
    """Median milliseconds by the host clock (for CPU-only machines and tests)."""

    def timer(fn: Callable[[], Any]) -> float:
        for _ in range(warmup):
            fn()
        samples = []
        for _ in range(repeat):
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e3)
        return statistics.median(samples)

    return timer


TIMERS = {"device": device_timer, "do_bench": do_bench_timer}


def default_timer(kind: str = "device") -> Timer:
    """On a CUDA device `device_timer` (or `do_bench_timer` for kind "do_bench"), the host clock otherwise."""
    try:
        import torch

        if torch.cuda.is_available():
            return TIMERS[kind]()
    except ImportError:
        pass
    return host_timer()


def interleaved(variants: dict[Any, Callable[[], Any]], timer: Timer, rounds: int = ROUNDS) -> dict[Any, float]:
    """The best of `rounds` timings of each variant, the rounds interleaved so that drift hits every variant
    alike (one pass over the variants showed 4 % spreads between calls of the same kernel). Each round starts
    further into the list (rotated by len / rounds), so no variant always runs right after the same heavy
    neighbour. A timer that can take single samples alternates the variants call by call instead
    (`interleaved_samples`)."""
    if getattr(timer, "sample", None) is not None:
        return interleaved_samples(variants, timer.sample, timer.budget_ms)  # type: ignore[attr-defined]
    best = dict.fromkeys(variants, float("inf"))
    order = list(variants)
    for r in range(rounds):
        shift = r * len(order) // rounds
        for key in order[shift:] + order[:shift]:
            best[key] = min(best[key], float(timer(variants[key])))
    return best


def interleaved_samples(
    variants: dict[Any, Callable[[], Any]], sample: Callable[[Callable[[], Any]], float], budget_ms: float,
    min_reps: int = 15, max_reps: int = 400,
) -> dict[Any, float]:  # fmt: skip
    """Median milliseconds of each variant, sampled one call at a time, variant after variant in an order
    rotated every pass, about `budget_ms` of calls per variant. At S8192 attention the H100 runs at its 700 W
    cap and its clock moved between 1.7 and 2.0 GHz: the same cuDNN kernel measured 3.24 to 3.81 ms from one
    block of samples to the next, while neighbouring single calls see the same clock."""
    order = list(variants)
    for fn in variants.values():  # compile, tune, fill caches
        fn()
    first = [sample(variants[key]) for key in order]
    reps = max(min_reps, min(max_reps, int(budget_ms * 1e3 / max(statistics.mean(first), 1.0))))
    samples: dict[Any, list[float]] = {key: [] for key in order}
    for r in range(reps):
        shift = r % len(order)
        for key in order[shift:] + order[:shift]:
            samples[key].append(sample(variants[key]))
    return {key: statistics.median(values) / 1e3 for key, values in samples.items()}
