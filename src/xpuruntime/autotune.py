"""The `autotune` selection mode: time every supported kernel once per call signature, keep the fastest.

`KernelPolicy(attention="autotune")` tunes one op, `KernelPolicy(autotune=True)` every op without an
explicit preference. On a plan-cache miss the dispatcher hands the selector's decision here: each
supported candidate is launched on the call's own inputs (fresh outputs, a warm-up launch first, so
JIT compilation stays out of the numbers) and timed with the backend's device events (a host clock
after a synchronize where a backend has none); the winner becomes the plan with reason "autotune" and
is remembered in the on-disk tuning cache, so another process with the same signature skips the timing.
A progress bar appears when tuning takes more than a second.

On a GPU each sample starts with the L2 cache flushed and the device kept busy until the launch is
queued: kernel time from a cold cache, as `triton.testing.do_bench` measures and as a layer's inputs
usually arrive. A sample costs the larger of that device time and the host time the launch took to
queue: what one call costs in a stream of calls, so a kernel with a slow launch path never wins a
problem too small to hide it. Timed back to back on a warm cache, flash_v2's forward won on an H100
where cuDNN's is 15 % faster cold (B4 H16 S2048 D128 causal), and the pair it made was 5 % slower than
cuDNN's own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .abi import ArgPack, TensorSpec
from .selector import Candidate, Decision

if TYPE_CHECKING:
    from .dispatch import Dispatcher
    from .policy import KernelPolicy

REASON = "autotune"
TARGET_MS = 20.0  # measure each candidate for about this long
MAX_REPS = 50
# how candidates are timed, part of the tuning-cache key: a change of method never reuses old winners
TIMING = "cold-l2, max(device, host)"
PROGRESS_AFTER_S = 1.0
ENV_PRINT = "XPURUNTIME_PRINT_AUTOTUNING"  # "1": a line on stderr per tuning result, like TRITON_PRINT_AUTOTUNING


class _Store:
    """The tuning cache's get/put, with a process-local dict when the cache cannot be used."""

    def __init__(self) -> None:
        self.memory: dict[str, dict] = {}

    def get(self, key: str) -> dict | None:
        try:
            from .runtime import tuning_cache

            return tuning_cache.get(key)
        except Exception:  # an unusable cache folder must not break dispatch
            return self.memory.get(key)

    def put(self, key: str, value: dict) -> None:
        self.memory[key] = value
        try:
            from .runtime import tuning_cache

            tuning_cache.put(key, value)
        except Exception:
            pass


STORE = _Store()
# asked as arbiter(op, key, times_us, backend_of_kernel, policy) after each tuned signature (measured or
# stored); one may name the kernel to run instead of the fastest (the PyTorch front end weighs its routing cost)
ARBITERS: list[Callable[[str, str, dict[str, float], dict[str, str], KernelPolicy], str | None]] = []


def cache_key(decision: Decision, names: list[str]) -> str:
    """The signature: op, per-argument dtype/shape/strides (or scalar / absent), attributes, math mode,
    device and arch, the candidates."""
    from .runtime import tuning_cache

    ctx = decision.ctx
    tensors = ctx.tensors
    attrs = {k: repr(ctx.attrs.get(k)) for k in ctx.attr_names}
    # which argument each tensor is: an absent optional or a Python scalar elsewhere is another call
    args = ["tensor" if isinstance(s, TensorSpec) else getattr(s, "__name__", None) for s in ctx.inputs]
    return tuning_cache.key(
        ctx.op, dtypes=[t.dtype for t in tensors], layout=[list(t.strides) for t in tensors], bucket=False,
        shape=[], shapes=[list(t.shape) for t in tensors], attrs=attrs, device=ctx.device.split(":")[0],
        arch=ctx.compute_capability or "cpu", candidates=sorted(names), selection=REASON, timing=TIMING,
        args=args, math_mode=ctx.math_mode.value,
    )  # fmt: skip


def tune(dispatcher: Dispatcher, decision: Decision, inputs: tuple, policy: KernelPolicy) -> Decision:
    """The decision with the fastest supported kernel for this call (reason "autotune")."""
    supported = [c for c in decision.candidates if c.supported]
    if len(supported) <= 1:
        _arbitrate(decision, "", {c.kernel.name: 0.0 for c in supported}, supported, policy)
        return dataclasses.replace(decision, reason=REASON)
    names = [c.kernel.name for c in supported]
    key = cache_key(decision, names)
    stored = STORE.get(key)
    stored = stored if isinstance(stored, dict) else {}
    winner, times = stored.get("kernel"), stored.get("times_us")
    source = "from the tuning cache"
    if not _usable(winner, times, names):
        times = time_candidates(dispatcher, decision, supported, inputs, policy)
        if not times:
            return decision
        winner = min(times, key=times.__getitem__)
        STORE.put(key, {"kernel": winner, "times_us": times})
        source = "timed"
    fastest, winner = winner, _arbitrate(decision, key, times, supported, policy) or winner
    if winner != fastest:
        source += f"; {fastest} was fastest, the front end's routing cost chose {winner}"
    report(describe(decision), winner, times, source)
    chosen = next(c for c in supported if c.kernel.name == winner)
    return dataclasses.replace(decision, kernel=chosen.kernel, reason=REASON)


def describe(decision: Decision) -> str:
    """The tuned call in a few words: 'matmul float32[256x512] float32[512x128] on cpu'."""
    ctx = decision.ctx
    shapes = " ".join(f"{t.dtype}[{'x'.join(map(str, t.shape))}]" for t in ctx.tensors)
    return f"{ctx.op} {shapes} on {ctx.device}"


def report(what: str, winner: Any, times_us: dict | None, source: str) -> None:
    """One line on stderr about a tuning result when $XPURUNTIME_PRINT_AUTOTUNING is 1 (as Triton prints its
    autotuner's picks under TRITON_PRINT_AUTOTUNING): what was tuned, the winner, where it came from (timed
    now, or the tuning cache) and each candidate's time, fastest first."""
    if os.environ.get(ENV_PRINT, "0").strip() in ("", "0"):
        return
    timed = ", ".join(f"{name} {us:.1f} µs" for name, us in sorted((times_us or {}).items(), key=lambda kv: kv[1]))
    print(f"xpuruntime autotune: {what} -> {winner} ({source}){': ' + timed if timed else ''}", file=sys.stderr,
          flush=True)  # fmt: skip


def _usable(winner: Any, times: Any, names: list[str]) -> bool:
    """Whether a stored tuning result names a candidate and times only candidates, in numbers."""
    return (
        winner in names
        and isinstance(times, dict)
        and all(name in names and isinstance(t, (int, float)) for name, t in times.items())
    )


def _arbitrate(
    decision: Decision, key: str, times: dict[str, float], supported: list[Candidate], policy: KernelPolicy
) -> str | None:
    """Show the arbiters what tuning found; the first timed kernel one of them names, if any."""
    if not ARBITERS:
        return None
    key = key or cache_key(decision, [c.kernel.name for c in supported])
    backends = {c.kernel.name: c.kernel.backend for c in supported}
    named = [arbiter(decision.ctx.op, key, times, backends, policy) for arbiter in ARBITERS]
    return next((name for name in named if name in times), None)


def time_candidates(
    dispatcher: Dispatcher, decision: Decision, candidates: list[Candidate], inputs: tuple, policy: KernelPolicy
) -> dict[str, float]:
    """Median microseconds per launch of each candidate; a candidate that raises is left out."""
    times: dict[str, float] = {}
    start = time.perf_counter()
    bar = None
    try:
        for i, cand in enumerate(candidates):
            if bar is None and time.perf_counter() - start > PROGRESS_AFTER_S:
                bar = _Progress(decision.ctx.op, len(candidates), i)
            if bar is not None:
                bar.update(i, cand.kernel.name)
            try:
                times[cand.kernel.name] = _time_one(dispatcher, decision, cand, inputs, policy)
            except Exception:  # a kernel that cannot run here simply does not win
                continue
    finally:
        if bar is not None:
            bar.close()
    return times


def _time_one(
    dispatcher: Dispatcher, decision: Decision, cand: Candidate, inputs: tuple, policy: KernelPolicy
) -> float:
    plan = dispatcher.make_plan(dataclasses.replace(decision, kernel=cand.kernel, reason=REASON), policy)
    backend = dispatcher.registry.backends[cand.kernel.backend]
    stream = None if plan.current_stream is None else plan.current_stream(plan.device)
    out = None if plan.returns_output else plan.allocate(stream)  # as dispatch runs it: no copy into a buffer
    workspace = (
        dispatcher.workspaces.lend(plan.workspace_bytes, plan.device, plan.empty, stream)
        if plan.workspace_bytes
        else None
    )
    args = ArgPack(_fresh_buffers(plan, inputs, stream), out, plan.attrs, plan.config, workspace, stream)
    plan.launch(args)  # warm-up: JIT compilation, caches
    backend.synchronize(plan.device, stream)
    if _is_cuda(plan.device):
        measure = cuda_sampler(plan.device, stream, host_bound=True)
    else:
        measure = _host_sampler(backend, plan.device, stream)
    return median_us(measure, lambda: plan.launch(args))


def _fresh_buffers(plan: Any, inputs: tuple, stream: Any) -> tuple:
    """The call's inputs with a fresh array for each buffer the kernels write (schema.buffers): the timing
    launches must not write the caller's, which may be an input itself (add_rms_norm's in-place residual)."""
    buffers = plan.schema.buffers
    if not buffers:
        return inputs
    specs = dict(zip(plan.schema.inputs, plan.decision.ctx.inputs))
    return tuple(
        plan.empty(specs[name].shape, specs[name].dtype, plan.device, stream) if name in buffers and x is not None
        else x
        for name, x in zip(plan.schema.inputs, inputs)
    )  # fmt: skip


def median_us(measure: Callable[[Callable[[], None]], float], fn: Callable[[], None]) -> float:
    """The median of as many `measure(fn)` samples as fit in TARGET_MS (at most MAX_REPS)."""
    once = measure(fn)
    reps = max(1, min(MAX_REPS, int(TARGET_MS * 1000 / max(once, 1.0))))
    samples = sorted(measure(fn) for _ in range(reps))
    return samples[len(samples) // 2]


def _is_cuda(device: str) -> bool:
    return "torch" in sys.modules and device.startswith("cuda")


def _host_sampler(backend: Any, device: str, stream: Any) -> Callable[[Callable[[], None]], float]:
    """Microseconds of one call by the host clock, the backend synchronized after it."""

    def measure(fn: Callable[[], None]) -> float:
        t0 = time.perf_counter()
        fn()
        backend.synchronize(device, stream)
        return (time.perf_counter() - t0) * 1e6

    return measure


# The most host time a sample's sleep covers. A callable that synchronises (HF's BERT checks its mask on the
# host) waits out the sleep, so its queueing time is the sleep plus its own: uncapped, the next sleep doubled
# every sample (a zoo row ran for hours after 20 samples). Capped, such a sample costs at most 2 x 20 ms.
MAX_HOST_US = 20_000.0


def cuda_sampler(
    device: str, stream: Any, cold: bool = True, host_bound: bool = False
) -> Callable[[Callable[[], None]], float]:
    """Microseconds of one launch by CUDA events on the launch stream, from a flushed L2 cache (`cold`),
    with the stream kept busy (torch.cuda._sleep) until the launch is queued so host latency stays out;
    with `host_bound`, the larger of that and the host time the call took (its cost in a stream of calls)."""
    torch = sys.modules["torch"]
    dev = torch.device(device)
    on = stream if stream is not None else torch.cuda.current_stream(dev)
    l2_bytes = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0) or 64 << 20
    flush = None  # without one (or on a nearly full device), time from whatever the cache holds
    if cold:
        with contextlib.suppress(torch.OutOfMemoryError):
            flush = torch.empty(2 * l2_bytes, dtype=torch.uint8, device=dev)  # twice L2: every line evicted
    sleep = getattr(torch.cuda, "_sleep", None)
    cycles_per_us = 2000  # H100 clocks ~1.98 GHz; a longer sleep only costs tuning time
    # how long each callable takes to queue its launches, so the next sleep covers it: per callable, since
    # callers alternate callables whose host times differ (one entering a policy scope takes 25+ µs more)
    host_us: weakref.WeakKeyDictionary[Callable[[], None], float] = weakref.WeakKeyDictionary()

    def measure(fn: Callable[[], None]) -> float:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if flush is not None:
            flush.zero_()  # `on` is the current stream: launches go there
        before = host_us.get(fn, 50.0)
        if sleep is not None:
            sleep(int((2 * before + 20) * cycles_per_us))
        begin.record(on)
        t0 = time.perf_counter()
        fn()
        queued_us = (time.perf_counter() - t0) * 1e6
        with contextlib.suppress(TypeError):  # a callable without weak references keeps the default
            host_us[fn] = min(max(before * 0.9, queued_us), MAX_HOST_US)
        end.record(on)
        end.synchronize()
        device_us = begin.elapsed_time(end) * 1000.0
        return max(device_us, queued_us) if host_bound else device_us

    return measure


class _Progress:
    """A transient rich progress bar on stderr (a no-op without rich)."""

    def __init__(self, op: str, total: int, done: int) -> None:
        try:
            from rich.console import Console
            from rich.progress import Progress
        except ImportError:
            self.progress = None
            return
        self.progress = Progress(console=Console(file=sys.stderr), transient=True)
        self.progress.start()
        self.task = self.progress.add_task(f"autotune {op}", total=total, completed=done)

    def update(self, done: int, name: str) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=done, description=f"autotune: {name}")

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
