"""The built-in demo: a small transformer-encoder forward pass run under four kernel policies.

It shows automatic selection, an explicit policy, an automatic fallback (with its warning) and a strict
policy's error (and, with a CUDA device, automatic selection on CUDA tensors), then the dispatch log
aggregated per decision, the plan-cache statistics, and each run's output checked against a float64
NumPy reference of the same forward pass. Used by `xpuruntime demo`.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

import xpuruntime as xrt
from xpuruntime.errors import KernelFallbackWarning, UnsupportedByPolicyError
from xpuruntime.log import DispatchRecord, dispatch_logging_enabled
from xpuruntime.ops.attention import reference as attention_reference
from xpuruntime.ops.elementwise import reference as sin_affine_reference
from xpuruntime.ops.matmul import reference as matmul_reference
from xpuruntime.ops.norm import layer_norm_reference, rms_norm_reference
from xpuruntime.ops.reduction import reference as sum_reference
from xpuruntime.ops.softmax import reference as softmax_reference
from xpuruntime.profiling import Profiler, check_trace_path

TOLERANCE = 1e-4  # max-abs error allowed against the float64 reference (float32 compute)
SEED = 0


@dataclass(frozen=True)
class Size:
    """Model dimensions of the demo encoder."""

    batch: int
    seq: int
    d_model: int
    heads: int
    d_ff: int
    vocab: int

    def describe(self) -> str:
        return (
            f"batch {self.batch}, seq {self.seq}, d_model {self.d_model}, heads {self.heads}, "
            f"d_ff {self.d_ff}, vocab {self.vocab}"
        )


SIZES = {
    "small": Size(batch=2, seq=64, d_model=64, heads=4, d_ff=128, vocab=256),
    "medium": Size(batch=4, seq=256, d_model=256, heads=8, d_ff=1024, vocab=1024),
}


@dataclass(frozen=True)
class Ops:
    """The heavy ops of the forward pass, so one `forward` serves both xrt.ops and the float64 references."""

    layer_norm: Callable[..., Any]
    matmul: Callable[..., Any]
    attention: Callable[..., Any]
    rms_norm: Callable[..., Any]
    sin_affine: Callable[..., Any]
    softmax: Callable[..., Any]
    sum: Callable[..., Any]


XRT_OPS = Ops(
    xrt.ops.layer_norm, xrt.ops.matmul, xrt.ops.attention, xrt.ops.rms_norm, xrt.ops.sin_affine,
    xrt.ops.softmax, xrt.ops.sum,
)  # fmt: skip
REFERENCE_OPS = Ops(
    layer_norm_reference, matmul_reference, attention_reference, rms_norm_reference, sin_affine_reference,
    softmax_reference, sum_reference,
)  # fmt: skip


def make_inputs(size: Size, seed: int = SEED) -> dict[str, np.ndarray]:
    """Seeded float32 activations, weights and one-hot targets."""
    rng = np.random.default_rng(seed)
    d, f, v = size.d_model, size.d_ff, size.vocab

    def weight(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(rows)).astype(np.float32)

    targets = rng.integers(0, v, (size.batch, size.seq))
    return {
        "x": rng.standard_normal((size.batch, size.seq, d)).astype(np.float32),
        "ln_weight": (1 + 0.1 * rng.standard_normal(d)).astype(np.float32),
        "ln_bias": (0.1 * rng.standard_normal(d)).astype(np.float32),
        "w_qkv": weight(d, 3 * d),
        "w_out": weight(d, d),
        "rms_weight": (1 + 0.1 * rng.standard_normal(d)).astype(np.float32),
        "w_up": weight(d, f),
        "w_logits": weight(f, v),
        "targets": np.eye(v, dtype=np.float32)[targets],
    }


def forward(ops: Ops, p: dict[str, np.ndarray], heads: int) -> dict[str, np.ndarray]:
    """Encoder block plus logits head; returns the token probabilities and the scalar 'loss'."""
    x = p["x"]
    batch, seq, d = x.shape
    with xrt.record_range("layer 0"):
        h = ops.layer_norm(x, d, p["ln_weight"], p["ln_bias"], eps=1e-5)
        qkv = ops.matmul(h, p["w_qkv"])  # (B, S, D) @ (D, 3D): batched 3-D @ 2-D
        q, k, v = _permute(qkv.reshape(batch, seq, 3, heads, d // heads), (2, 0, 3, 1, 4))
        context = ops.attention(q, k, v, is_causal=True)  # (B, H, S, D/H)
        merged = _permute(context, (0, 2, 1, 3)).reshape(batch, seq, d)
        x = x + ops.matmul(merged, p["w_out"])  # residual
        h = ops.rms_norm(x, d, p["rms_weight"], eps=1e-6)
        h = ops.sin_affine(ops.matmul(h, p["w_up"]), 1.0, 0.1)  # sin as the activation
    with xrt.record_range("head"):
        probs = ops.softmax(ops.matmul(h, p["w_logits"]), axis=-1)
        loss = ops.sum(probs * p["targets"], axis=None)  # total probability given to the targets
    return {"probs": probs, "loss": loss}


def _permute(x: Any, axes: tuple[int, ...]) -> Any:
    """Reorder axes of a NumPy array or a PyTorch tensor (the GPU run passes CUDA tensors)."""
    return x.permute(*axes) if hasattr(x, "permute") else x.transpose(axes)


def gpu_device() -> str | None:
    """'cuda:0' when PyTorch sees a CUDA device and some CUDA backend is available, else None."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    backends = xrt.default_registry().backends.values()
    return "cuda:0" if any(b.device_type == "cuda" and b.unavailable_reason is None for b in backends) else None


def to_device(inputs: dict[str, np.ndarray], device: str) -> dict[str, Any]:
    """The demo's inputs as tensors on `device`."""
    import torch

    return {name: torch.from_numpy(value).to(device) for name, value in inputs.items()}


@dataclass(frozen=True)
class PolicyRun:
    """One of the demo's policy runs: a label, the preferences and the story it tells."""

    name: str
    preferences: dict[str, Any]
    story: str
    expect: str = ""  # "fallback": some dispatch must fall back; "error": the run must raise

    def policy(self) -> xrt.KernelPolicy:
        """A whole policy (not layered over the one in force), so the environment cannot change the demo."""
        return xrt.KernelPolicy(**self.preferences)


RUNS = (
    PolicyRun("auto", {}, "automatic selection"),
    PolicyRun("blocked+chunked", {"matmul": "blocked", "attention": "chunked"}, "explicit kernel choices"),
    PolicyRun("prefer gemv", {"matmul": "gemv"}, "a preference that cannot run these shapes", "fallback"),
    PolicyRun("strict gemv", {"matmul": "gemv", "strict": True}, "the same preference in strict mode", "error"),
)
GPU_RUN = PolicyRun("auto on GPU", {}, "automatic selection with CUDA tensors")
GPU_TOLERANCE = 2e-3  # GPU kernels may reduce in another order, and matmul may use TF32


@dataclass
class RunResult:
    """What one policy run produced: outputs (None if it stopped), log records, notes and its error."""

    run: PolicyRun
    outputs: dict[str, np.ndarray] | None = None
    records: list[DispatchRecord] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None

    def unmet_expectation(self) -> str | None:
        """Why this run did not show what it is meant to show (None when it did)."""
        if self.run.expect == "fallback" and not any(r.reason == "fallback" for r in self.records):
            return "expected a fallback, but no dispatch fell back"
        if self.run.expect == "error" and self.error is None:
            return "expected UnsupportedByPolicyError, but the run completed"
        if self.run.expect != "error" and self.error is not None:
            return "the run failed"
        return None


def _drain_logs() -> list[DispatchRecord]:
    """Take the records logged so far and clear the log, so a long run never overflows its bound."""
    records = xrt.get_dispatch_logs()
    xrt.clear_dispatch_logs()
    return records


@contextlib.contextmanager
def _fallback_notes(notes: list[str]) -> Iterator[None]:
    """Collect KernelFallbackWarnings as notes instead of printing them; other warnings pass through."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", KernelFallbackWarning)
        yield
    for w in caught:
        if issubclass(w.category, KernelFallbackWarning):
            notes.append(str(w.message))
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def run_policy(run: PolicyRun, inputs: dict[str, np.ndarray], size: Size, iterations: int) -> RunResult:
    """Run the forward pass `iterations` times under the run's policy, keeping its dispatch records."""
    result = RunResult(run)
    with _fallback_notes(result.notes), xrt.kernel_policy(run.policy()):
        try:
            for _ in range(iterations):
                result.outputs = forward(XRT_OPS, inputs, size.heads)
                result.records += _drain_logs()
            result.outputs = {k: v.cpu().numpy() if hasattr(v, "cpu") else v for k, v in result.outputs.items()}
        except UnsupportedByPolicyError as exc:
            result.outputs = None
            result.error = f"{type(exc).__name__}: {str(exc).splitlines()[0].rstrip(':')}"
            result.records += _drain_logs()
    return result


@contextlib.contextmanager
def _dispatch_logging() -> Iterator[None]:
    """Enable dispatch logging with an empty log; switch it off afterwards if it was off before."""
    was_enabled = dispatch_logging_enabled()
    xrt.enable_dispatch_logging()
    xrt.clear_dispatch_logs()
    try:
        yield
    finally:
        if not was_enabled:
            xrt.disable_dispatch_logging()


def _aggregate(records: list[DispatchRecord]) -> dict[tuple[str, str, str], list[DispatchRecord]]:
    """Group records by (op, kernel, reason), in first-seen order."""
    groups: dict[tuple[str, str, str], list[DispatchRecord]] = {}
    for record in records:
        groups.setdefault((record.op_name, record.selected_kernel, record.reason), []).append(record)
    return groups


def decisions_table(results: list[RunResult]) -> Table:
    """Dispatches aggregated by (run, op, kernel, reason): calls, plan-cache hits, mean launch time."""
    table = Table(title="Kernel decisions (from the dispatch log)", title_justify="left")
    for column in ("run", "op", "kernel", "reason", "calls", "cache hits", "mean µs"):
        table.add_column(column, justify="right" if column in ("calls", "cache hits", "mean µs") else "left")
    for result in results:
        for row, ((op, kernel, reason), records) in enumerate(_aggregate(result.records).items()):
            mean_us = sum(r.elapsed_us for r in records) / len(records)
            hits = sum(r.cache_hit for r in records)
            table.add_row(result.run.name if row == 0 else "", op, kernel, reason, str(len(records)), str(hits),
                          f"{mean_us:.1f}", style="yellow" if reason == "fallback" else None)  # fmt: skip
        table.add_section()
    return table


def plan_cache_table() -> Table:
    """The process-wide plan cache statistics."""
    stats = xrt.plan_cache().stats()
    table = Table(title="Plan cache (process-wide)", title_justify="left")
    for column in ("hits", "misses", "hit rate", "size", "evictions", "invalidations"):
        table.add_column(column, justify="right")
    table.add_row(str(stats.hits), str(stats.misses), f"{stats.hit_rate:.1%}", f"{stats.size}/{stats.maxsize}",
                  str(stats.evictions), str(stats.invalidations))  # fmt: skip
    return table


def max_abs_errors(outputs: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> dict[str, float]:
    """Max-abs error of every output against the float64 reference."""
    return {name: float(np.max(np.abs(np.asarray(outputs[name], np.float64) - ref))) for name, ref in reference.items()}


def correctness_table(results: list[RunResult], reference: dict[str, np.ndarray]) -> tuple[Table, bool]:
    """Per run, max-abs error of probs and loss against the float64 reference; False if any exceeds TOLERANCE."""
    title = f"Correctness vs float64 NumPy reference (tolerance {TOLERANCE:g}; GPU {GPU_TOLERANCE:g})"
    table = Table(title=title, title_justify="left")
    for column in ("run", "max-abs error probs", "max-abs error loss", "status"):
        table.add_column(column, justify="left" if column in ("run", "status") else "right")
    ok = True
    for result in results:
        if result.outputs is None:
            table.add_row(result.run.name, "-", "-", "not run (stopped by its error)")
            continue
        errors = max_abs_errors(result.outputs, reference)
        tolerance = GPU_TOLERANCE if result.run is GPU_RUN else TOLERANCE
        passed = all(e <= tolerance for e in errors.values())
        ok &= passed
        table.add_row(result.run.name, f"{errors['probs']:.2e}", f"{errors['loss']:.2e}",
                      "[green]ok[/]" if passed else "[bold red]FAIL[/]")  # fmt: skip
    return table, ok


def profile_table(prof: Profiler) -> Table:
    """The profiler summary of the auto run: per op/kernel calls, mean µs, GFLOP/s and GB/s."""
    table = Table(title="Profile of the auto run", title_justify="left")
    for column in ("op", "kernel", "calls", "mean µs", "GFLOP/s", "GB/s"):
        table.add_column(column, justify="left" if column in ("op", "kernel") else "right")
    for row in prof.summary():
        table.add_row(row["op"], row["kernel"], str(row["calls"]), f"{row['mean_us']:.1f}", f"{row['gflops']:.2f}",
                      f"{row['gbytes_per_s']:.2f}")  # fmt: skip
    return table


def _report_run(console: Console, result: RunResult) -> None:
    """One line per run, then its fallback notes, its error and any unmet expectation."""
    say = functools.partial(console.print, highlight=False, soft_wrap=True)
    say(f"[bold]{escape(result.run.name)}[/]: {result.run.story} under {escape(repr(result.run.policy()))}"
        f" - {len(result.records)} dispatches")  # fmt: skip
    for note in result.notes:
        say(f"  [yellow]note (KernelFallbackWarning, fallback):[/] {escape(note)}")
    if result.run.expect == "fallback" and not result.notes:
        say("  note: the fallback was already warned about in this process (once per call signature)")
    if result.error:
        say(f"  [red]error:[/] {escape(result.error)}")
    if result.unmet_expectation():
        say(f"  [bold red]FAIL:[/] {result.unmet_expectation()}")


def run_demo(console: Console, iterations: int = 3, size: str = "small", trace: str | Path | None = None) -> int:
    """Run every policy, print the decisions, plan cache, correctness (and profile); 0 when all are correct."""
    dims = SIZES[size]
    inputs = make_inputs(dims)
    console.print(f"[bold]xpuruntime demo[/]: encoder forward pass ({dims.describe()}), "
                  f"{iterations} iteration(s) per policy run\n")  # fmt: skip
    if trace is not None:
        check_trace_path(trace, "run_demo: argument 'trace'")  # a bad path fails before the work, not after it
    prof_scope = xrt.profiler() if trace is not None else contextlib.nullcontext()
    with _dispatch_logging():
        with prof_scope as prof:
            results = [run_policy(RUNS[0], inputs, dims, iterations)]
        results += [run_policy(run, inputs, dims, iterations) for run in RUNS[1:]]
        device = gpu_device()
        if device is not None:
            try:
                results.append(run_policy(GPU_RUN, to_device(inputs, device), dims, iterations))
            except xrt.XpuRuntimeError as exc:
                results.append(RunResult(GPU_RUN, error=f"{type(exc).__name__}: {exc}", records=_drain_logs()))
    for result in results:
        _report_run(console, result)
    console.print()
    console.print(decisions_table(results))
    console.print(plan_cache_table())
    reference = forward(REFERENCE_OPS, inputs, dims.heads)
    table, ok = correctness_table(results, reference)
    console.print(table)
    ok = ok and not any(result.unmet_expectation() for result in results)
    if prof is not None:
        console.print(profile_table(prof))
        if prof.dropped_events:
            dropped, bound = prof.dropped_events, prof.max_events
            console.print(f"The profiler dropped its {dropped} oldest events (max_events={bound}).")
        path = prof.export_chrome_trace(trace)
        console.print(f"Chrome trace of the auto run written to {escape(str(path))} (open in ui.perfetto.dev)",
                      highlight=False, soft_wrap=True)  # fmt: skip
    return 0 if ok else 1
