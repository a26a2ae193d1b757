"""Training: a whole training step under a policy against the same step in eager PyTorch without one, and the
step captured as one CUDA graph. The model is the repository's example GPT (examples/train_gpt.py: 6 layers,
d 768, 12 heads, context 1024, batch 8, bf16 autocast, fused AdamW).

A policy installs process-wide aten overrides, so ours and the anchor cannot alternate call by call: the
variants alternate step by step instead, each round running one warm-up and one timed step of each (the
H100 host's speed drifts by up to 1.5x between runs), and a row reports the median step (synchronized wall
time). Rows for other models call `policy_step_row` / `captured_step_row` with their own `make_step`.
"""

from __future__ import annotations

import importlib.util
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .common import needs_cuda
from .row import Row, Setup, Timer

ROUNDS = 15
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "train_gpt.py"  # present in a source checkout

MakeStep = Callable[[bool], Callable[[], Any]]  # make_step(capturable) -> one training step (not synchronized)


def _timed_step(step: Callable[[], Any]) -> float:
    import torch

    torch.cuda.synchronize()
    start = time.perf_counter()
    step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def alternate_steps(variants: dict[str, tuple[Callable[[], Any], Callable[[], Any]]], rounds: int = ROUNDS
                    ) -> dict[str, float]:  # fmt: skip
    """Median ms per step of each variant, given as (enter, step): `enter()` sets the variant up (its policy)
    before its steps; every round runs one warm-up and one timed step of each variant, in rotated order."""
    names = list(variants)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for name in names:  # tune, compile and plan outside the timed rounds
        enter, step = variants[name]
        enter()
        step(), step()
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            enter, step = variants[name]
            enter()
            step()
            samples[name].append(_timed_step(step))
    return {name: statistics.median(values) for name, values in samples.items()}


def _use_policy(policy: Any) -> Callable[[], None]:
    def enter() -> None:
        import xpuruntime.pytorch as xtorch

        if policy is None:
            xtorch.clear_kernel_policy()
        else:
            xtorch.set_kernel_policy(policy)

    return enter


def policy_step_row(name: str, make_step: MakeStep, policy: str, target: float | None, doc: str,
                    requires: Callable[[], str | None] = needs_cuda) -> Row:  # fmt: skip
    """A row timing `make_step(False)`'s step under `policy` ("autotune" or "op=kernel,...") against the same
    step without a policy."""

    def setup() -> Setup:
        import xpuruntime as xrt

        step = make_step(False)
        chosen = xrt.KernelPolicy(autotune=True) if policy == "autotune" else xrt.KernelPolicy.from_string(policy)

        def measure(timer: Timer) -> dict[str, float]:
            try:
                return alternate_steps({"ours": (_use_policy(chosen), step), "anchor": (_use_policy(None), step)})
            finally:
                _use_policy(None)()

        return Setup(step, measure=measure, note=f"median of {ROUNDS} alternating steps")

    return Row(name, "step", setup, target=target, units="ms", requires=requires, anchor="eager step, no policy",
               doc=doc)  # fmt: skip


def captured_step_row(name: str, make_step: MakeStep, target: float, doc: str,
                      requires: Callable[[], str | None] = needs_cuda) -> Row:  # fmt: skip
    """A row timing the step captured by `CUDAGraphWrapper` (replayed) against the same step in eager mode."""

    def setup() -> Setup:
        import xpuruntime.pytorch as xtorch

        eager = make_step(False)
        graph = xtorch.CUDAGraphWrapper(warmup_iters=3)
        graph.capture(make_step(True))
        replay = graph.replay

        def measure(timer: Timer) -> dict[str, float]:
            none = _use_policy(None)
            return alternate_steps({"ours": (none, replay), "anchor": (none, eager)})

        return Setup(replay, measure=measure, note=f"median of {ROUNDS} alternating steps")

    return Row(name, "captured", setup, target=target, units="ms", requires=requires,
               anchor="eager step, no policy", doc=doc)  # fmt: skip


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("xpuruntime_bench_train_gpt", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gpt_step(capturable: bool) -> Callable[[], Any]:
    """One bf16 training step of the example GPT at its default size (the example's loop: gradients set to
    None, fused AdamW; `capturable` for a step that will be captured in a CUDA graph)."""
    import torch
    import torch.nn.functional as F

    import xpuruntime.pytorch as xtorch

    example = _example()
    cfg = example.parse_args([])
    torch.manual_seed(0)
    model = example.GPT(cfg.vocab, cfg.context, cfg.d_model, cfg.heads, cfg.layers).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True, capturable=capturable)
    x, y = example.batch_for(0, cfg, 0, 1, "cuda")

    def step() -> Any:
        opt.zero_grad()
        with xtorch.autocast(dtype=torch.bfloat16, cache_enabled=not capturable):
            loss = F.cross_entropy(model(x).float().view(-1, cfg.vocab), y.view(-1))
        loss.backward()
        opt.step()
        return loss

    return step


def _needs_example() -> str | None:
    if not EXAMPLE.is_file():
        return "needs the source checkout's examples/train_gpt.py"
    return needs_cuda()


ROWS = [
    policy_step_row("GPT step, autotune", gpt_step, "autotune", 1.0, "autotune never slower than eager",
                    _needs_example),
    policy_step_row("GPT step, autocast_linear=fused_cast", gpt_step, "autocast_linear=fused_cast", 1.05,
                    "the best eager policy: nn.Linear under autocast as one node", _needs_example),
    policy_step_row("GPT step, matmul=cublasLt,attention=flash_v2", gpt_step, "matmul=cublasLt,attention=flash_v2",
                    None, "our GEMM and attention kernels routed in the step (no target)", _needs_example),
    captured_step_row("GPT step, captured CUDA graph", gpt_step, 1.1, "the step replayed as one CUDA graph",
                      _needs_example),
]  # fmt: skip
