"""A patched tiny Hugging Face Llama under DDP and under FSDP2 (`fully_shard`), two CPU processes (gloo): each rank
trains on its half of the batch and ends with the parameters (DDP) or the losses (FSDP2) of one process training
on the whole batch. The patch replaces or re-creates no parameter, so both wrappers see the model's own.

DDP runs the fused ops' CPU kernels (fp32). FSDP2 runs the model in bf16, where the ops take PyTorch's code (NumPy
has no bfloat16): on the CPU the NumPy kernels view a parameter's storage, which FSDP2 then cannot free after a
layer's forward (on the GPU the kernels are Triton's and cuBLASLt's; benchmarks/probes/fsdp2_patch_check.sh)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("transformers")

WORKER = textwrap.dedent(
    """
    import json, warnings
    import torch, torch.distributed as dist, transformers
    import xpuruntime.pytorch as xtorch
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.device_mesh import init_device_mesh

    warnings.simplefilter("ignore")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    ids = torch.randint(0, 64, (4, 8), generator=torch.Generator().manual_seed(1))
    policy = "rms_norm=numpy,swiglu=numpy,rotary_embedding=numpy,linear_cross_entropy=numpy"

    def models(dtype):
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(config).to(dtype).train()
        reference = transformers.LlamaForCausalLM(config).to(dtype).train()
        reference.load_state_dict(model.state_dict())
        xtorch.patch(model, policy=policy)
        return model, reference

    def train(runner, params, batch, steps=2):
        opt, losses = torch.optim.SGD(params, lr=0.5), []
        for _ in range(steps):
            loss = runner(input_ids=batch, labels=batch).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss = loss.detach().clone()
            if runner is not reference:
                dist.all_reduce(loss, op=dist.ReduceOp.AVG)
            losses.append(loss.item())
        return losses

    result = {}
    model, reference = models(torch.float32)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    result["ddp"] = train(ddp, model.parameters(), ids.chunk(world)[rank])
    result["ddp_reference"] = train(reference, reference.parameters(), ids)
    result["ddp_max_param_diff"] = max((p - q).abs().max().item()
                                       for p, q in zip(model.parameters(), reference.parameters()))
    model, reference = models(torch.bfloat16)
    mesh = init_device_mesh("cpu", (world,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    result["fsdp_swaps_kept"] = xtorch.patched(model).applied and "forward" in model.model.norm.__dict__
    result["fsdp"] = train(model, model.parameters(), ids.chunk(world)[rank], steps=3)
    result["fsdp_reference"] = train(reference, reference.parameters(), ids, steps=3)
    if rank == 0:
        print("RESULT " + json.dumps(result))
    dist.destroy_process_group()
    """
)


def test_patched_model_under_ddp_and_fsdp2_matches_one_process(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env={"OMP_NUM_THREADS": "1",
                          **__import__("os").environ})  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    result = json.loads(lines[0].removeprefix("RESULT "))
    for got, want in zip(result["ddp"], result["ddp_reference"], strict=True):
        assert abs(got - want) <= 1e-5 * abs(want)
    assert result["ddp_max_param_diff"] <= 1e-5
    assert result["fsdp_swaps_kept"]
    for got, want in zip(result["fsdp"], result["fsdp_reference"], strict=True):
        assert abs(got - want) <= 2e-2 * abs(want)  # bf16
