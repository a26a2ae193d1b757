"""Does a patched Hugging Face Llama train under FSDP2 (`fully_shard`) on two GPUs to the losses it reaches on one
GPU with the same global batch, with the pinned policy's kernels on every rank?

    python3 benchmarks/probes/fsdp2_patch_check.py --json one.json            # one GPU, the global batch
    torchrun --standalone --nproc-per-node 2 benchmarks/probes/fsdp2_patch_check.py --json fsdp.json
    (benchmarks/probes/fsdp2_patch_check.sh runs both, and a second one-GPU run for the noise floor)

The model is the bench's Llama (8 layers, hidden 1024, GQA 16/4, vocab 32000; `--layers` for fewer), random init
from seed 0, batch 8 x 1024 tokens in all (each rank takes its half), bf16 autocast, AdamW; `patch(model,
policy=PATCH_POLICY)` before `fully_shard` on each decoder layer and on the root. Each process writes its losses,
median step time, peak memory and the (op, kernel) pairs of one logged step to JSON (per rank under torchrun).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
import transformers

import xpuruntime as xrt
import xpuruntime.pytorch as xtorch
from xpuruntime.bench.hf_training import PATCH_POLICY

GLOBAL_BATCH, SEQ = 8, 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0, help="data and init seed")
    args = parser.parse_args()
    distributed = "RANK" in os.environ
    rank, world = 0, 1
    if distributed:
        dist.init_process_group("nccl")
        rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank)
    torch.manual_seed(args.seed)
    config = transformers.LlamaConfig(
        vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=args.layers,
        num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=2048,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config).cuda().train()
    plan = xtorch.patch(model, policy=PATCH_POLICY)
    if distributed:
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
    ids = torch.randint(0, 32000, (GLOBAL_BATCH, SEQ), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    ids = ids.chunk(world)[rank]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> float:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if distributed:  # the global batch's loss: the ranks' halves hold equally many labelled tokens
            loss = loss.detach().clone()
            dist.all_reduce(loss, op=dist.ReduceOp.AVG)
        return float(loss)

    xrt.enable_dispatch_logging()
    losses = [step()]
    kernels = sorted({(r.op_name, r.selected_kernel) for r in xrt.get_dispatch_logs()})
    xrt.disable_dispatch_logging()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.steps - 1):
        torch.cuda.synchronize()
        start = time.perf_counter()
        losses.append(step())
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    result = {
        "rank": rank, "world": world, "losses": losses, "median_step_ms": statistics.median(times),
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30, "kernels": kernels, "swapped": len(plan.swapped),
        "policy": PATCH_POLICY, "torch": torch.__version__, "transformers": transformers.__version__,
    }  # fmt: skip
    path = args.json if not distributed else args.json.with_suffix(f".rank{rank}.json")
    path.write_text(json.dumps(result, indent=1))
    print(f"rank {rank}/{world}: losses {losses[0]:.4f} -> {losses[-1]:.4f}, median step {result['median_step_ms']:.1f} "
          f"ms, peak {result['peak_gib']:.2f} GiB, kernels {['/'.join(k) for k in kernels]}")  # fmt: skip
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
