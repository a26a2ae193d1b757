"""`patch(model)` on a CUDA device: Hugging Face Llama and GPT-2 (small configs, real vocab sizes) under bf16
autocast run the fused ops' GPU kernels (Triton; cuBLASLt for GPT-2's c_fc + GELU where nvmath is installed),
forward and backward, eager, compiled (inductor) and captured (reduce-overhead); losses and gradients stay within
bf16's rounding of the unpatched model's, and the patched step's peak memory is below the unpatched one's (the
logits are never made)."""

from __future__ import annotations

import copy

import pytest
import torch

import xpuruntime as xrt
import xpuruntime.pytorch as xtorch
from xpuruntime.bench.hf_training import PATCH_POLICY

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")]


def _available(op: str, name: str) -> bool:
    spec = xrt.default_registry().kernels.get(op, {}).get(name)
    return spec is not None and xrt.default_registry().backends[spec.backend].unavailable_reason is None


def _policy() -> str:
    """PATCH_POLICY less the kernels this machine lacks (cuBLASLt without nvmath-python)."""
    items = [item for item in PATCH_POLICY.split(",") if _available(*item.split("="))]
    return ",".join(items)


def _model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if name == "llama":
        config = transformers.LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1408,
                                          num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2)  # fmt: skip
        return transformers.LlamaForCausalLM(config).cuda().train()
    # c_fc at 4 x 512 tokens x 768 -> 3072 is large enough for cuBLASLt's size condition
    config = transformers.GPT2Config(
        vocab_size=50257, n_embd=768, n_layer=2, n_head=12, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0
    )
    return transformers.GPT2LMHeadModel(config).cuda().train()


EXPECTED = {
    "llama": {("rms_norm", "triton"), ("rms_norm_backward", "triton"), ("swiglu", "triton"),
              ("swiglu_backward", "triton"), ("rotary_embedding", "triton"), ("rotary_embedding_backward", "triton"),
              ("linear_cross_entropy", "triton")},
    "gpt2": {("linear_cross_entropy", "triton")},  # its plain LayerNorms stay PyTorch's (patching.DEFAULT_KINDS)
}  # fmt: skip


def _step(runner, model, ids) -> tuple[torch.Tensor, list]:
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = runner(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach().float(), [p.grad.float() for p in model.parameters()]


def _close(got: tuple, expected: tuple) -> None:
    torch.testing.assert_close(got[0], expected[0], rtol=2e-2, atol=2e-2)
    for g, e in zip(got[1], expected[1], strict=True):
        assert (g - e).abs().max() <= 5e-2 * e.abs().max() + 1e-4


@pytest.mark.parametrize("mode", ["eager", "inductor", "reduce-overhead"])
@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_patched_model_runs_the_gpu_kernels_forward_and_backward(name, mode):
    torch._dynamo.reset()
    model = _model(name)
    reference = copy.deepcopy(model)
    ids = torch.randint(0, model.config.vocab_size, (4, 512), device="cuda")
    expected = _step(reference, reference, ids)
    xtorch.patch(model, policy=_policy())
    runner = model if mode == "eager" else torch.compile(model, mode=None if mode == "inductor" else mode)
    for _ in range(3 if mode == "reduce-overhead" else 1):  # CUDA graphs: warm-up, capture, replay
        xrt.clear_dispatch_logs()
        xrt.enable_dispatch_logging()
        try:
            got = _step(runner, model, ids)
        finally:
            xrt.disable_dispatch_logging()
        _close(got, expected)
    if mode != "reduce-overhead":  # a replayed graph launches its kernels without the dispatcher
        calls = {(r.op_name, r.selected_kernel) for r in xrt.get_dispatch_logs()}
        wanted = set(EXPECTED[name])
        if name == "gpt2" and _available("linear", "cublasLt"):
            wanted |= {("linear", "cublasLt"), ("linear_grad_input", "cublasLt"), ("linear_grad_weight", "cublasLt")}
        assert wanted <= calls, f"missing {wanted - calls}"
    xrt.clear_dispatch_logs()


def test_the_patched_step_needs_less_memory():
    model = _model("llama")
    reference = copy.deepcopy(model)
    ids = torch.randint(0, 32000, (4, 1024), device="cuda")
    xtorch.patch(model)
    peaks = {}
    for key, m in (("unpatched", reference), ("patched", model)):
        _step(m, m, ids)  # gradients allocated
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        _step(m, m, ids)
        torch.cuda.synchronize()
        peaks[key] = torch.cuda.max_memory_allocated() - base
    logits = 4 * 1024 * 32000 * 2  # one bf16 copy of the logits; the unpatched step keeps several (and fp32 ones)
    assert peaks["patched"] < peaks["unpatched"] - logits, peaks


def test_inductor_launches_the_fused_kernels_from_its_own_code():
    """Compiled with inductor, the patched Llama's norms, SwiGLU and rotary embeddings are our Triton kernels,
    traced into the graphs and launched from inductor's generated code (custom_ops.inline): no opaque
    xpuruntime op is left for them, forward or backward. The LM head + loss (not traceable) stays one op."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    model = _model("llama")
    ids = torch.randint(0, model.config.vocab_size, (4, 512), device="cuda")
    xtorch.patch(model, policy=_policy())
    compiled = torch.compile(model)
    _, sources = run_and_get_code(lambda: _step(compiled, model, ids))
    code = "\n".join(sources)
    for kernel in ("_norm_fwd_kernel", "_norm_bwd_kernel", "_glu_fwd_kernel", "_glu_bwd_kernel", "_rotary_kernel"):
        assert kernel in code, kernel
    for op in ("rms_norm", "rms_norm_backward", "swiglu", "swiglu_backward", "rotary_embedding"):
        assert f"torch.ops.xpuruntime.{op}.default(" not in code, op
    assert "torch.ops.xpuruntime.linear_cross_entropy.default(" in code
