"""Train a small GPT with xpuruntime's kernel policy: an unmodified PyTorch loop plus three lines.

    python examples/train_gpt.py --policy matmul=cublasLt,attention=flash_v2 --steps 50
    python examples/train_gpt.py --tiny --device cpu --steps 3          # CPU smoke test

The model (token + position embeddings, pre-LN blocks of nn.Linear, SDPA and LayerNorm, AdamW) is
plain PyTorch. The policy routes its matmuls, attention and layer norms, forward and backward,
through xpuruntime; the run ends with the dispatch summary (op, kernel, reason, calls) of its first
steps (--log-steps): a logged call always takes the Python route, so later steps run unlogged.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import os
import time
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

import xpuruntime as xrt
import xpuruntime.pytorch as xtorch


class Block(nn.Module):
    """Pre-LN transformer block: causal self-attention and a GELU MLP."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv, self.proj = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)
        self.fc, self.out = nn.Linear(d_model, 4 * d_model), nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, context: int, d_model: int, n_heads: int, n_layers: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d_model), nn.Embedding(context, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.ln_f, self.head = nn.LayerNorm(d_model), nn.Linear(d_model, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--policy", default="", help="e.g. matmul=cublasLt,attention=flash_v2 (empty: PyTorch's kernels)")
    p.add_argument("--strict", action="store_true", help="a preferred kernel that cannot run is an error")
    p.add_argument("--autotune", action="store_true", help="time the candidates once per call signature")
    p.add_argument("--capture-graph", action="store_true", help="capture the whole step as one CUDA graph")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8, help="global batch (split over ranks under torchrun)")
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16", help="autocast dtype")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="2 layers, d_model 64, context 32, batch 2 (CI smoke)")
    p.add_argument("--route-cpu", action="store_true", help="test-only: route CPU tensors too (CPU kernels)")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-steps", type=int, default=2, help="steps whose dispatch decisions are logged and summed up")
    p.add_argument("--json", default="", help="write losses, step times and the dispatch summary here")
    p.add_argument("--profile-steps", type=int, default=0, help="profile the last N steps; print the top kernels")
    args = p.parse_args(argv)
    if args.tiny:
        args.layers, args.d_model, args.heads, args.context, args.batch, args.vocab = 2, 64, 4, 32, 2, 256
    if args.steps < 1:
        p.error(f"--steps must be at least 1, got {args.steps}")
    if args.log_steps < 0:
        p.error(f"--log-steps must be at least 0, got {args.log_steps}")
    if not 0 <= args.profile_steps <= args.steps:
        p.error(f"--profile-steps must be between 0 and --steps ({args.steps}), got {args.profile_steps}")
    try:
        make_policy(args)
    except xrt.XpuRuntimeError as exc:
        p.error(str(exc))
    return args


def make_policy(args: argparse.Namespace) -> xrt.KernelPolicy | None:
    spec = xrt.KernelPolicy.from_string(args.policy, "--policy").to_dict()  # op=kernel pairs and options
    if args.strict:
        spec["strict"] = True
    if args.autotune:
        for op in ("matmul", "attention", "layer_norm"):
            spec.setdefault(op, "autotune")
    policy = xrt.KernelPolicy.from_dict(spec, "--policy")
    return None if policy == xrt.KernelPolicy() else policy


def batch_for(step: int, args: argparse.Namespace, rank: int, world: int, device: str) -> tuple[torch.Tensor, ...]:
    """A deterministic synthetic batch (a repeating pattern plus noise, so the loss goes down); each rank
    takes its slice of the global batch, so any world size sees the same data per step."""
    g = torch.Generator().manual_seed(1000 + step)
    base = torch.arange(args.context + 1).repeat(args.batch, 1) * 7 % args.vocab
    noise = torch.randint(0, args.vocab, (args.batch, args.context + 1), generator=g)
    tokens = torch.where(torch.rand(base.shape, generator=g) < 0.2, noise, base)
    per_rank = args.batch // world
    tokens = tokens[rank * per_rank : (rank + 1) * per_rank].to(device)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def dispatch_summary(records: list) -> list[dict[str, Any]]:
    counts = collections.Counter((r.op_name, r.selected_kernel, r.reason) for r in records)
    return [{"op": op, "kernel": k, "reason": why, "calls": n} for (op, k, why), n in sorted(counts.items())]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    device = args.device
    if world > 1:
        local = int(os.environ.get("LOCAL_RANK", 0))
        if torch.device(device).type == "cuda":
            torch.distributed.init_process_group("nccl")
            torch.cuda.set_device(local)
            device = f"cuda:{local}"
        else:
            torch.distributed.init_process_group("gloo")
    torch.manual_seed(args.seed)
    model = GPT(args.vocab, args.context, args.d_model, args.heads, args.layers).to(device)
    trained = model
    if world > 1:
        ids = [torch.device(device).index] if torch.device(device).type == "cuda" else None
        trained = nn.parallel.DistributedDataParallel(model, device_ids=ids)
    fused = torch.device(device).type == "cuda" or None  # one kernel per step instead of a dozen foreach ones
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, capturable=args.capture_graph, fused=fused)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[args.dtype]
    device_type = torch.device(device).type

    if args.route_cpu:
        from xpuruntime.pytorch.install import route_devices

        route_devices(("cuda", "cpu"))
    policy = make_policy(args)  # the three lines a user adds: a policy ...
    if policy is not None:
        xtorch.set_kernel_policy(policy)
    xrt.clear_dispatch_logs()
    if args.log_steps:
        xrt.enable_dispatch_logging(max_records=1_000_000)  # ... and the log of what ran

    def amp() -> contextlib.AbstractContextManager:
        if dtype is None:
            return contextlib.nullcontext()
        return xtorch.autocast(dtype=dtype, device_type=device_type, cache_enabled=not args.capture_graph)

    static_x, static_y = batch_for(0, args, rank, world, device)
    losses = torch.zeros(args.steps, device=device)
    fed = [0]

    def train_step() -> torch.Tensor:
        if args.capture_graph and not torch.cuda.is_current_stream_capturing():
            feed(fed[0])  # warm-up iterations are real steps with their own batch
            fed[0] += 1
        opt.zero_grad()  # gradients to None: the backward writes fresh ones (in the graph's pool when captured)
        with amp():
            logits = trained(static_x)
            loss = F.cross_entropy(logits.float().view(-1, args.vocab), static_y.view(-1))
        loss.backward()
        opt.step()
        return loss.detach()

    def feed(step: int) -> None:
        x, y = batch_for(step, args, rank, world, device)
        static_x.copy_(x)
        static_y.copy_(y)

    times, step = [], 0
    sync = torch.cuda.synchronize if device_type == "cuda" else (lambda: None)
    profiling, prof = contextlib.ExitStack(), None
    if args.capture_graph:
        graph = xtorch.CUDAGraphWrapper(warmup_iters=min(3, args.steps))
        loss_out = graph.capture(train_step)
        for step in range(fed[0]):
            losses[step] = float("nan")  # warm-up losses are not kept by the captured step
        step = fed[0]
        xrt.disable_dispatch_logging()  # replays dispatch nothing
    # a captured step logs its warm-up steps and the capture, an eager one its first --log-steps
    logged_steps = (fed[0] if args.capture_graph else min(args.log_steps, args.steps)) if args.log_steps else 0
    while step < args.steps:
        if step == args.log_steps:
            xrt.disable_dispatch_logging()  # logging routes every call through Python: time what users run
        if args.profile_steps and prof is None and step >= args.steps - args.profile_steps:  # after any warm-up
            prof = profiling.enter_context(xtorch.profile(record_shapes=False, profile_memory=False))
        sync()
        start = time.perf_counter()
        if args.capture_graph:
            feed(step)
            graph.replay()
            losses[step].copy_(loss_out)
        else:
            feed(step)
            losses[step].copy_(train_step())
        sync()
        times.append(time.perf_counter() - start)
        step += 1
    profiling.close()
    if args.profile_steps:
        print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=25, max_name_column_width=70))

    records = xrt.get_dispatch_logs()
    result = {
        "args": vars(args),
        "rank": rank,
        "world": world,
        "policy": repr(policy),
        "losses": [None if math.isnan(v) else v for v in losses.tolist()],
        "step_ms": [t * 1e3 for t in times],
        "median_step_ms": sorted(times)[len(times) // 2] * 1e3 if times else None,
        "dispatch": dispatch_summary(records),
        "logged_steps": logged_steps,
        "overrides": xtorch.installed_overrides(),
        "handed_back": xtorch.handed_back(),
    }
    if rank == 0 or world > 1:
        print_report(result, rank)
    if args.json:
        path = args.json if world == 1 else args.json.replace(".json", f".rank{rank}.json")
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
    xtorch.clear_kernel_policy()
    xrt.disable_dispatch_logging()
    if args.route_cpu:
        route_devices(("cuda",))
    if world > 1:
        torch.distributed.destroy_process_group()
    return result


def print_report(result: dict[str, Any], rank: int) -> None:
    tag = f"[rank {rank}] " if result["world"] > 1 else ""
    kept = [v for v in result["losses"] if v is not None]
    print(f"{tag}policy {result['policy']}: loss {kept[0]:.4f} -> {kept[-1]:.4f} over {len(result['losses'])} steps")
    if result["median_step_ms"] is not None:
        print(f"{tag}median step {result['median_step_ms']:.2f} ms")
    logged = result["logged_steps"]
    what = f"{logged} warm-up steps and the capture" if result["args"]["capture_graph"] else f"first {logged} steps"
    print(f"{tag}dispatch summary of the {what} (op, kernel, reason, calls):" if logged else f"{tag}not logged")
    for row in result["dispatch"]:
        print(f"{tag}  {row['op']:<22} {row['kernel']:<14} {row['reason']:<9} {row['calls']}")
    if logged and not result["dispatch"]:
        print(f"{tag}  (nothing dispatched through xpuruntime: PyTorch's kernels ran)")
    for family, why in result["handed_back"].items():
        print(f"{tag}autotune handed {family} back to PyTorch: {why}")


if __name__ == "__main__":
    main()
