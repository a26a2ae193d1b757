"""Training: Hugging Face Llama and GPT-2 steps (random init from their configs, batch 8 x 1024 tokens, bf16 autocast,
fused AdamW) under eager PyTorch, torch.compile, Liger-Kernel and xpuruntime (policies, `patch`, compiled), side by
side in one process.

    python -m xpuruntime.bench.hf_training --model llama --out DIR [--rounds 8] [--variants a,b,...]

Two phases, every variant from the same initial weights and the same fixed batch (so the loss falls, as a
memorising run does):
1. Losses: `--loss-steps` steps per variant, each variant's from the same random seed (GPT-2 trains with
   dropout: every variant that draws its masks as eager does gets eager's masks; inductor draws its own); each
   variant's losses against eager's and against further eager runs (`eager2`, `eager3`: the noise floor is the
   largest difference between two of the eager runs, for bf16 with nondeterministic backward kernels differs run
   to run; one pair alone is a noisy estimate of it). The per-step losses go into the JSON. Peak memory
   per variant is measured here (the step's own peak plus its model's parameters; other models excluded), and
   the first step's wall time ("first step s": compilation included; the graph variants capture while built).
2. Step time: interleaved rounds (every variant runs `--steps` steps per round, in turn); wall time per step
   (synchronised) and device time (CUDA events), medians over rounds; ratios against eager and compiled PyTorch.
Variants a session cannot run (no liger-kernel) are reported as skipped with the reason.

The `patched` variants call `xpuruntime.pytorch.patch(model, policy=PATCH_POLICY)`: the policy pinned to the
patched modules names, at these shapes (8192 rows; hidden 1024 / 768; an fp32 residual stream under autocast),
the kernels that do each fused op in one pass over memory each way: Triton for the norms, the gated activation,
the rotary embedding and the head + loss (whose logits never exist whole: the largest tensor of an eager step),
and cuBLASLt for GPT-2's c_fc + GELU (bias and GELU in the GEMM's epilogue, the bias gradient in its BGRADB
epilogue). The policy in force around the step is `autocast_linear=fused_cast`, the best eager policy for the
nn.Linear projections that stay PyTorch's (matmul and attention stay PyTorch's: cuBLAS and SDPA's cuDNN kernel
are the fastest at these shapes, and routing them costs host time). `patched_auto` patches with no policy
(automatic selection), to show what the selector picks alone; compiled, it leaves the norms, the MLP's
activation and the rotary embedding to inductor (no kernel named for them: `custom_ops.inline`), while
`patched+compile` traces the Triton kernels PATCH_POLICY names into the graph. `patched_head+compile` patches
only the head + loss (`kinds=("linear_cross_entropy",)`) before compiling, leaving the norms, the MLP and the
rotary embedding to inductor, which fuses them with their neighbours (an opaque custom op cannot be fused into).

`graph` and `patched+graph` capture the whole step (forward, backward, fused AdamW with capturable=True) once
with `xpuruntime.pytorch.CUDAGraphWrapper` and replay it: at these sizes an eager step is host-bound (the host
queues kernels more slowly than the GPU runs them), and a replay costs the host one launch.

As bench rows (`xpuruntime bench --only hf_training`), the patched eager and patched + compiled steps are timed
against eager and compiled PyTorch, alternating step by step.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BATCH, SEQ = 8, 1024
LOSS_SEED = 1234
REPEATS = ("eager2", "eager3")  # eager again: the noise floor's runs (not timed)
POLICY_SEEDS = "matmul=cublasLt,attention=flash_v2"  # the seeds' policy
EAGER_POLICY = "autocast_linear=fused_cast"  # the best eager policy for the projections PyTorch keeps
PATCH_POLICY = (
    "rms_norm=triton,add_rms_norm=triton,layer_norm=triton,add_layer_norm=triton,swiglu=triton,geglu=triton,"
    "rotary_embedding=triton,linear_cross_entropy=triton,linear=cublasLt"
)  # pinned to the patched modules (module docstring); linear's backward ops follow it


def llama_config() -> Any:
    import transformers as tf

    return tf.LlamaConfig(
        vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
        num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=2048,
    )  # fmt: skip


def gpt2_config() -> Any:
    import transformers as tf

    return tf.GPT2Config(n_embd=768, n_layer=12, n_head=12, n_positions=1024)


MODELS = {"llama": ("LlamaForCausalLM", llama_config), "gpt2": ("GPT2LMHeadModel", gpt2_config)}


@dataclass
class Variant:
    """One way of running the step: how the model is prepared, and the policy in force while it runs."""

    name: str
    policy: str | None = None  # set globally while this variant runs (and while it compiles)
    compile: str | None = None  # None, "default" or "reduce-overhead"
    patch: bool = False  # xpuruntime.pytorch.patch(model, policy=patch_policy, kinds=kinds)
    patch_policy: str | None = None
    kinds: tuple[str, ...] | None = None  # None: patch's default swaps
    liger: bool = False
    liger_only: str | None = None  # one of Liger's swaps (rope, rms_norm, swiglu, fused_linear_cross_entropy)
    graph: bool = False  # the whole step (forward, backward, AdamW) captured once by xpuruntime's CUDAGraphWrapper
    model: Any = None
    opt: Any = None
    step: Callable[[], Any] | None = None
    skipped: str | None = None
    losses: list[float] = field(default_factory=list)
    first_step_s: float | None = None  # the first step, compilation (or capture) included
    wall_ms: list[float] = field(default_factory=list)
    gpu_ms: list[float] = field(default_factory=list)
    peak_gib: float | None = None


def default_variants(model: str) -> list[Variant]:
    variants = [
        Variant("eager"),
        Variant("eager2"),
        Variant("eager3"),
        Variant("compile", compile="default"),
        Variant("compile+seeds_policy", policy=POLICY_SEEDS, compile="default"),
        Variant("compile+autotune", policy="autotune=true", compile="default"),
        Variant("patched", policy=EAGER_POLICY, patch=True, patch_policy=PATCH_POLICY),
        Variant("patched_auto", patch=True),
        Variant("patched+compile", patch=True, patch_policy=PATCH_POLICY, compile="default"),
        Variant("patched_auto+compile", patch=True, compile="default"),
        Variant(
            "patched_head+compile",
            patch=True,
            patch_policy=PATCH_POLICY,
            kinds=("linear_cross_entropy",),
            compile="default",
        ),
        Variant("autotune", policy="autotune=true"),
        Variant("fused_cast", policy=EAGER_POLICY),
        Variant("reduce-overhead", compile="reduce-overhead"),
        Variant("reduce-overhead+patched", patch=True, patch_policy=PATCH_POLICY, compile="reduce-overhead"),
        Variant("reduce-overhead+patched_auto", patch=True, compile="reduce-overhead"),
        Variant("graph", graph=True),
        Variant("patched+graph", policy=EAGER_POLICY, patch=True, patch_policy=PATCH_POLICY, graph=True),
    ]
    if model == "llama":
        variants.append(Variant("liger", liger=True))
    return variants


@contextlib.contextmanager
def policy_in_force(spec: str | None) -> Iterator[None]:
    if spec is None:
        yield
        return
    import xpuruntime.pytorch as xtorch

    xtorch.set_kernel_policy(spec)
    try:
        yield
    finally:
        xtorch.clear_kernel_policy()


class LigerSwitch:
    """Liger-Kernel patches transformers' modules and classes process-wide; its variant gets those patches only
    while it runs, so the other variants of the same run keep transformers' own code."""

    def __init__(self) -> None:
        self.patched: dict[tuple[Any, str], Any] = {}
        self.original: dict[tuple[Any, str], Any] = {}

    def apply(self, model: Any, only: str | None = None) -> None:
        """Liger's Llama patches on `model` (`only`: one of its swaps, the others off)."""
        from liger_kernel.transformers import apply_liger_kernel_to_llama
        from transformers.models.llama import modeling_llama as ml

        owners = [ml, *(v for v in vars(ml).values() if isinstance(v, type) and v.__module__ == ml.__name__)]
        before = {id(o): dict(vars(o)) for o in owners}
        swaps = ("rope", "rms_norm", "swiglu", "fused_linear_cross_entropy")
        flags = {} if only is None else {name: name == only for name in swaps}
        apply_liger_kernel_to_llama(model=model, **flags)
        for owner in owners:
            for name, value in vars(owner).items():
                old = before[id(owner)].get(name, _ABSENT)
                if old is not value:
                    self.patched[(owner, name)], self.original[(owner, name)] = value, old
        self._set(self.original)

    def _set(self, values: dict[tuple[Any, str], Any]) -> None:
        for (owner, name), value in values.items():
            if value is _ABSENT:
                with contextlib.suppress(AttributeError):
                    delattr(owner, name)
            else:
                setattr(owner, name, value)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        self._set(self.patched)
        try:
            yield
        finally:
            self._set(self.original)


_ABSENT = object()


def initial_state(model_name: str) -> tuple[dict, Any]:
    """(the weights every variant starts from, the fixed batch of token ids): a model from its config with seed 0,
    on the GPU."""
    import torch
    import transformers as tf

    torch.manual_seed(0)
    cls_name, config = MODELS[model_name]
    state = {k: v.detach().clone() for k, v in getattr(tf, cls_name)(config()).cuda().state_dict().items()}
    generator = torch.Generator("cuda").manual_seed(1)
    ids = torch.randint(0, config().vocab_size, (BATCH, SEQ), device="cuda", generator=generator)
    return state, ids


def build(variant: Variant, model_name: str, state: dict, ids: Any, liger: LigerSwitch) -> None:
    import torch
    import transformers as tf

    cls_name, config = MODELS[model_name]
    model = getattr(tf, cls_name)(config()).cuda()
    model.load_state_dict(state)
    model.train()
    if variant.patch:
        import xpuruntime.pytorch as xtorch

        xtorch.patch(model, policy=variant.patch_policy, kinds=variant.kinds)
    if variant.liger:
        try:
            liger.apply(model, variant.liger_only)
        except Exception as exc:  # liger-kernel missing or incompatible
            variant.skipped = f"liger-kernel: {type(exc).__name__}: {exc}"[:300]
            return
    runner = model if variant.compile is None else torch.compile(model, mode=variant.compile)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True, capturable=variant.graph)

    def step() -> Any:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = runner(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()

    variant.model, variant.opt, variant.step = model, opt, step
    if variant.graph:  # its peak is the capture's: replays allocate nothing (their memory is the graph's pool)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        with running(variant, liger):
            variant.step = captured_step(step, model, opt, state)
        variant.peak_gib = (torch.cuda.max_memory_allocated() - base + param_bytes(model)) / 2**30


def captured_step(step: Callable[[], Any], model: Any, opt: Any, state: dict) -> Callable[[], Any]:
    """`step` captured once by xpuruntime.pytorch.CUDAGraphWrapper (after its warm-up steps), then replayed.
    The warm-up and capture train the model, so the weights are loaded again and AdamW's state zeroed, in place
    (the graph holds their addresses): the first replay is the same first step as the other variants'."""
    import torch

    import xpuruntime.pytorch as xtorch

    wrapper = xtorch.CUDAGraphWrapper(warmup_iters=3)
    loss = wrapper.capture(step)
    torch.cuda.synchronize()
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            tensor.copy_(state[name])
        for values in opt.state.values():
            for value in values.values():
                if isinstance(value, torch.Tensor):
                    value.zero_()

    def replay() -> Any:
        wrapper.replay()
        return loss

    return replay


@contextlib.contextmanager
def running(variant: Variant, liger: LigerSwitch) -> Iterator[None]:
    with policy_in_force(variant.policy), liger.active() if variant.liger else contextlib.nullcontext():
        yield


def param_bytes(model: Any) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def loss_phase(variants: list[Variant], steps: int, liger: LigerSwitch) -> None:
    import torch

    for v in variants:
        if v.skipped:
            continue
        torch.manual_seed(LOSS_SEED)  # the same dropout masks for every variant that draws them as eager does
        try:
            with running(v, liger):
                torch.cuda.synchronize()
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                t0 = time.perf_counter()
                v.losses = [float(v.step())]
                torch.cuda.synchronize()
                v.first_step_s = time.perf_counter() - t0
                v.losses += [float(v.step()) for _ in range(steps - 1)]
                torch.cuda.synchronize()
                if not v.graph:
                    v.peak_gib = (torch.cuda.max_memory_allocated() - base + param_bytes(v.model)) / 2**30
        except Exception as exc:
            v.skipped = f"{type(exc).__name__}: {exc}"[:400]
            traceback.print_exc()
        print(f"losses {v.name}: first {v.losses[:1]} last {v.losses[-1:]} peak {v.peak_gib}", flush=True)


def timing_phase(variants: list[Variant], rounds: int, steps: int, liger: LigerSwitch) -> None:
    import torch

    live = [v for v in variants if not v.skipped and v.name not in REPEATS]
    for r in range(rounds):
        order = live if r % 2 == 0 else live[::-1]  # alternate the order: no variant always follows the same one
        for v in order:
            with running(v, liger):
                v.step()  # one untimed step after the switch
                for _ in range(steps):
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    start.record()
                    v.step()
                    end.record()
                    torch.cuda.synchronize()
                    v.wall_ms.append((time.perf_counter() - t0) * 1e3)
                    v.gpu_ms.append(start.elapsed_time(end))


def rel_diff(a: list[float], b: list[float]) -> float | None:
    if not a or not b:
        return None
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))


def noise_floor(variants: list[Variant]) -> float | None:
    """The largest max-relative loss difference between two of the eager runs (eager, eager2, eager3)."""
    runs = [v.losses for v in variants if v.name in ("eager", *REPEATS) and v.losses]
    pairs = [rel_diff(a, b) for i, a in enumerate(runs) for b in runs[i + 1 :]]
    return max(pairs) if pairs else None


def report(variants: list[Variant], model: str) -> dict:
    by = {v.name: v for v in variants}
    eager, compiled = by.get("eager"), by.get("compile")
    floor = noise_floor(variants)
    rows = {}
    for v in variants:
        row: dict[str, Any] = {"policy": v.policy, "compile": v.compile, "patch": v.patch, "liger": v.liger}
        if v.patch:
            row["patch_policy"], row["kinds"] = v.patch_policy, v.kinds
        if v.skipped:
            row["skipped"] = v.skipped
        if v.wall_ms:
            row["wall_ms"] = round(statistics.median(v.wall_ms), 2)
            row["gpu_ms"] = round(statistics.median(v.gpu_ms), 2)
            for anchor, name in ((eager, "vs_eager"), (compiled, "vs_compile")):
                if anchor is not None and anchor.wall_ms:
                    row[name] = round(statistics.median(anchor.wall_ms) / row["wall_ms"], 3)
        if v.peak_gib is not None:
            row["peak_gib"] = round(v.peak_gib, 2)
        if v.first_step_s is not None:
            row["first_step_s"] = round(v.first_step_s, 2)
        if v.losses:
            row["loss_first_last"] = [round(v.losses[0], 4), round(v.losses[-1], 4)]
            row["loss_rel_diff_vs_eager"] = rel_diff(v.losses, eager.losses) if eager else None
            row["losses"] = [round(x, 5) for x in v.losses]
        rows[v.name] = row
    return {"model": model, "batch": BATCH, "seq": SEQ, "noise_floor_rel": floor, "rows": rows}


def markdown(result: dict) -> str:
    lines = [
        f"### {result['model']} training step, B{result['batch']} S{result['seq']}, bf16 autocast, fused AdamW",
        f"noise floor (largest max-relative loss difference between two eager runs): {result['noise_floor_rel']}",
        "",
        "| variant | wall ms | GPU ms | vs eager | vs compile | peak GiB | loss diff vs eager | first step s | note |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, r in result["rows"].items():
        diff = r.get("loss_rel_diff_vs_eager")
        lines.append(
            f"| {name} | {r.get('wall_ms', '')} | {r.get('gpu_ms', '')} | {r.get('vs_eager', '')} | "
            f"{r.get('vs_compile', '')} | {r.get('peak_gib', '')} | {'' if diff is None else f'{diff:.2e}'} | "
            f"{r.get('first_step_s', '')} | {r.get('skipped', '')} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """The command line (module docstring)."""
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="llama")
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per variant per round")
    parser.add_argument("--loss-steps", type=int, default=50)
    parser.add_argument("--variants", default="", help="comma-separated names (default: all)")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    import transformers as tf

    variants = default_variants(args.model)
    if args.variants:
        wanted = args.variants.split(",")
        variants = [v for v in variants if v.name in wanted]
    state, ids = initial_state(args.model)
    liger = LigerSwitch()
    for v in variants:
        t0 = time.time()
        try:
            build(v, args.model, state, ids, liger)
        except Exception as exc:
            v.skipped = f"{type(exc).__name__}: {exc}"[:400]
            traceback.print_exc()
        print(f"built {v.name} in {time.time() - t0:.1f}s {v.skipped or ''}", flush=True)
    loss_phase(variants, args.loss_steps, liger)
    timing_phase(variants, args.rounds, args.steps, liger)
    result = report(variants, args.model)
    result["versions"] = {
        "torch": torch.__version__,
        "transformers": tf.__version__,
        "gpu": torch.cuda.get_device_name(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"hf_training_{args.model}.json").write_text(json.dumps(result, indent=1))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


# -- bench rows ---------------------------------------------------------------------------------------


def _needs_transformers() -> str | None:
    import importlib.util

    from .common import needs_cuda

    if importlib.util.find_spec("transformers") is None:
        return "needs transformers (pip install transformers)"
    return needs_cuda()


def _step_pair(model_name: str, ours: str, anchor: str) -> Any:
    """A Setup timing variant `ours` against variant `anchor` (default_variants' names), step by step in turn."""

    from .row import Setup, Timer
    from .training import ROUNDS, alternate_steps

    state, ids = initial_state(model_name)
    variants = {v.name: v for v in default_variants(model_name)}
    pair = {"ours": variants[ours], "anchor": variants[anchor]}
    liger = LigerSwitch()
    for variant in pair.values():
        build(variant, model_name, state, ids, liger)
        if variant.skipped:
            raise RuntimeError(f"{variant.name}: {variant.skipped}")

    def entering(variant: Variant) -> Any:
        def enter() -> None:
            import xpuruntime.pytorch as xtorch

            xtorch.set_kernel_policy(variant.policy) if variant.policy else xtorch.clear_kernel_policy()

        return enter

    def measure(timer: Timer) -> dict[str, float]:
        import xpuruntime.pytorch as xtorch

        try:
            return alternate_steps({key: (entering(v), v.step) for key, v in pair.items()})
        finally:
            xtorch.clear_kernel_policy()

    return Setup(pair["ours"].step, measure=measure, note=f"median of {ROUNDS} alternating steps")


def _row(title: str, model_name: str, ours: str, anchor: str, target: float, doc: str) -> Any:
    from .row import Row

    name, setup = f"HF {title} step, {ours} vs {anchor}", lambda: _step_pair(model_name, ours, anchor)
    return Row(name, f"hf-{model_name}", setup, target=target, units="ms", requires=_needs_transformers,
               anchor=f"the {anchor} step", doc=doc)  # fmt: skip


ROWS = [
    _row("Llama", "llama", "patched", "eager", 1.2, "xpuruntime.pytorch.patch(model, policy=PATCH_POLICY) in eager"),
    _row("GPT-2", "gpt2", "patched", "eager", 1.2, "xpuruntime.pytorch.patch(model, policy=PATCH_POLICY) in eager"),
    _row("Llama", "llama", "patched+compile", "compile", 1.0, "the patched model under torch.compile"),
    _row("GPT-2", "gpt2", "patched+compile", "compile", 1.0, "the patched model under torch.compile"),
]
