"""Tiny Hugging Face Llama and GPT-2 (the real `transformers` classes, random init) under torch.compile with
aot_eager and inductor: the routed ops dispatch through xpuruntime exactly as in eager mode (same ops, same
kernels, same counts, forward and backward) and the loss and gradients match eager's (issue 29). CPU
routing; inductor compiles are slow on the CPU, so the models are one layer deep."""

from __future__ import annotations

import collections

import pytest
import torch
from pytorch_cpu_routing import forget_warnings, policy, routed_registry

import xpuruntime as xrt
import xpuruntime.pytorch as xtorch

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


@pytest.fixture(scope="module")
def cpu_routing():
    import torch._inductor.config as inductor_config

    with inductor_config.patch(compile_threads=1):
        yield from routed_registry()


def _llama() -> torch.nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32, attn_implementation="sdpa",
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


def _gpt2() -> torch.nn.Module:
    config = transformers.GPT2Config(
        vocab_size=64, n_embd=32, n_layer=1, n_head=4, n_positions=32, attn_pdrop=0.0, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_implementation="sdpa",
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


MODELS = {"llama": _llama, "gpt2": _gpt2}


def _step(model, fn, ids: torch.Tensor) -> tuple[collections.Counter, torch.Tensor, list]:
    model.zero_grad(set_to_none=True)
    xrt.clear_dispatch_logs()
    xrt.enable_dispatch_logging()
    try:
        loss = fn(input_ids=ids, labels=ids).loss
        loss.backward()
    finally:
        xrt.disable_dispatch_logging()
    calls = collections.Counter(
        (r.op_name, r.selected_kernel) for r in xrt.get_dispatch_logs() if r.origin != "compile"
    )
    return calls, loss.detach(), [p.grad for p in model.parameters()]


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_tiny_hugging_face_model_dispatches_as_in_eager(cpu_routing, name, backend):
    torch._dynamo.reset()
    forget_warnings()
    torch.manual_seed(0)
    model = MODELS[name]().train()
    ids = torch.randint(0, 64, (2, 8))
    xtorch.set_kernel_policy(policy("matmul", "attention", "layer_norm", "rms_norm", registry=cpu_routing))
    try:
        eager, loss_eager, grads_eager = _step(model, model, ids)
        routed = {op for op, _ in eager}
        assert {"matmul", "attention_forward", "attention_backward"} <= routed
        if name == "gpt2":  # Conv1D is addmm (our linear op); LayerNorm and its backward
            assert {"linear", "layer_norm", "layer_norm_backward"} <= routed
        compiled = torch.compile(model, backend=backend)
        for _ in range(2):
            calls, loss, grads = _step(model, compiled, ids)
            assert calls == eager, f"compiled {dict(calls)} != eager {dict(eager)}"
            torch.testing.assert_close(loss, loss_eager, rtol=1e-5, atol=1e-5)
            for g, e in zip(grads, grads_eager):
                torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
    finally:
        xtorch.clear_kernel_policy()
