"""`xtorch.patch(model)` / `unpatch(model)` on tiny configs of the real Hugging Face classes (random init): the
patched model's loss and gradients equal the unpatched model's (fp32; bf16 autocast within its rounding), routed
through the CPU kernels (the dispatch log, forward and backward); unpatch restores the very same forwards; dry runs
list and change nothing; an unknown architecture or an unexpected module raises before anything changes; other
models of the same classes keep Hugging Face's code; torch.compile (aot_eager, inductor, fullgraph), gradient
checkpointing, eval mode and HF's loss arguments."""

from __future__ import annotations

import collections
import copy

import pytest
import torch

import xpuruntime as xrt
import xpuruntime.pytorch as xtorch
from xpuruntime.pytorch.patching import KINDS

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")

VOCAB = 64
CPU_KERNELS = xrt.KernelPolicy(
    {
        op: "numpy"
        for op in (
            "rms_norm",
            "layer_norm",
            "add_layer_norm",
            "swiglu",
            "rotary_embedding",
            "linear",
            "linear_cross_entropy",
        )
    }
)
DECODER = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=32)  # fmt: skip
MODELS = {
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**DECODER)),
    "mistral": lambda: transformers.MistralForCausalLM(transformers.MistralConfig(**DECODER)),
    "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**DECODER)),
    "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=32, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0)),
    "bert": lambda: transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        hidden_act="gelu_new")),
}  # fmt: skip
# the ops each model's forward and backward dispatch (all through the CPU kernels)
OPS = {
    "llama": {"rms_norm", "rms_norm_backward", "swiglu", "swiglu_backward", "rotary_embedding",
              "rotary_embedding_backward", "linear_cross_entropy"},
    "gpt2": {"layer_norm", "layer_norm_backward", "linear", "linear_grad_input", "linear_grad_weight",
             "linear_cross_entropy"},
    "bert": {"layer_norm", "layer_norm_backward", "add_layer_norm", "add_layer_norm_backward", "linear",
             "linear_grad_input", "linear_grad_weight", "linear_cross_entropy"},
}  # fmt: skip
OPS["mistral"] = OPS["qwen2"] = OPS["llama"]


def _pair(name: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A model and an unpatched copy with the same weights, both in training mode."""
    torch.manual_seed(0)
    model = MODELS[name]().train()
    return model, copy.deepcopy(model)


def _batch(name: str, seq: int = 8) -> dict:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (2, seq), generator=g)
    labels = ids.clone()
    labels[:, 1::3] = -100  # ignored positions (for BERT: the unmasked ones)
    return {"input_ids": ids, "labels": labels}


def _step(model, batch: dict, runner=None) -> tuple[torch.Tensor, list]:
    model.zero_grad(set_to_none=True)
    loss = (model if runner is None else runner)(**batch).loss
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()]


def _assert_same(a: tuple, b: tuple, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    torch.testing.assert_close(a[0], b[0], rtol=rtol, atol=atol)
    for x, y in zip(a[1], b[1], strict=True):
        torch.testing.assert_close(x, y, rtol=rtol, atol=atol)


def _logged(step) -> collections.Counter:
    xrt.clear_dispatch_logs()
    xrt.enable_dispatch_logging()
    try:
        step()
    finally:
        xrt.disable_dispatch_logging()
    calls = collections.Counter((r.op_name, r.selected_kernel, r.origin) for r in xrt.get_dispatch_logs())
    xrt.clear_dispatch_logs()
    return calls


def _instance_forwards(model) -> dict:
    return {name: m.__dict__["forward"] for name, m in model.named_modules() if "forward" in m.__dict__}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_patched_model_gives_the_unpatched_loss_and_gradients_and_unpatch_restores_it(name):
    model, reference = _pair(name)
    batch = _batch(name)
    expected = _step(reference, batch)
    plan = xtorch.patch(model, policy=CPU_KERNELS, kinds=KINDS)
    assert plan.applied and xtorch.patched(model) is plan and not plan.kept
    got = []
    calls = _logged(lambda: got.append(_step(model, batch)))
    _assert_same(got[0], expected)
    assert {op for op, _, _ in calls} == OPS[name]
    assert {(kernel, origin) for _, kernel, origin in calls} == {("numpy", "eager")}
    state = {k: v.clone() for k, v in model.state_dict().items()}
    assert xtorch.unpatch(model) is plan and not plan.applied
    assert _instance_forwards(model) == {} and xtorch.patched(model) is None
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert _logged(lambda: _assert_same(_step(model, batch), expected, rtol=0, atol=0)) == {}


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_bf16_autocast_stays_within_the_rounding_of_the_unpatched_model(name):
    model, reference = _pair(name)
    batch = _batch(name)
    xtorch.patch(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = _step(reference, batch)
        got = _step(model, batch)
    torch.testing.assert_close(got[0], expected[0], rtol=2e-2, atol=2e-2)
    for g, e in zip(got[1], expected[1]):  # bf16 gradients: within a few of bf16's roundings of their scale
        assert (g - e).abs().max() <= 5e-2 * e.abs().max() + 1e-6


def test_under_autocast_a_patched_rms_norm_gives_its_readers_the_autocast_dtype():
    """Its readers (projections) cast to bf16 under autocast anyway: the patched norm hands them bf16 at once,
    the very values they would compute with, and the fp32 result is not kept for their backward."""
    model, reference = _pair("llama")
    xtorch.patch(model, policy=CPU_KERNELS)
    x = torch.randn(2, 5, 32)
    norm, original = model.model.layers[0].input_layernorm, reference.model.layers[0].input_layernorm
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, want = norm(x), original(x)
        projected, expected = (
            model.model.layers[0].self_attn.q_proj(got),
            reference.model.layers[0].self_attn.q_proj(want),
        )
    assert got.dtype == torch.bfloat16 and want.dtype == torch.float32
    torch.testing.assert_close(got, want.bfloat16(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(projected.float(), expected.float(), rtol=2e-2, atol=2e-2)
    assert norm(x).dtype == torch.float32  # outside autocast: the module's own dtype


def test_dry_run_lists_every_swap_and_changes_nothing():
    model, _ = _pair("llama")
    before = _instance_forwards(model)
    plan = xtorch.patch(model, dry_run=True)
    assert not plan.applied and _instance_forwards(model) == before and xtorch.patched(model) is None
    kinds = collections.Counter(swap.kind for swap in plan)
    assert kinds == {"rms_norm": 5, "gated_mlp": 2, "rotary_embedding": 2, "linear_cross_entropy": 1}
    assert {swap.path for swap in plan} >= {"", "model.norm", "model.layers.1.mlp", "model.layers.0.self_attn"}
    text = str(plan)
    assert "would patch (dry run) 10 modules" in text and "model.layers.1.post_attention_layernorm" in text


def test_plain_layer_norms_are_swapped_only_when_asked_for():
    """A plain nn.LayerNorm is one PyTorch kernel each way: by default it is kept, with the reason."""
    model, _ = _pair("gpt2")
    plan = xtorch.patch(model, dry_run=True)
    assert {s.kind for s in plan.swapped} == {"linear+gelu", "linear_cross_entropy"}
    assert [s.path for s in plan.kept] == ["transformer.h.0.ln_1", "transformer.h.0.ln_2", "transformer.h.1.ln_1",
                                           "transformer.h.1.ln_2", "transformer.ln_f"]  # fmt: skip
    assert all("one PyTorch kernel" in s.note for s in plan.kept)
    assert {s.kind for s in xtorch.patch(model, dry_run=True, kinds=KINDS).swapped} >= {"layer_norm"}


def test_modules_without_a_fused_kernel_are_listed_as_kept():
    """BERT's default GELU is the erf form, which cuBLASLt's GELU epilogue (tanh) does not compute."""
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=32)  # fmt: skip
    plan = xtorch.patch(transformers.BertForMaskedLM(config), dry_run=True, kinds=KINDS)
    assert [(s.path, s.kind) for s in plan.kept] == [("bert.encoder.layer.0.intermediate", "linear+gelu")]
    assert "erf GELU" in plan.kept[0].note and plan.kept[0].forward is None


def test_unknown_architecture_raises_and_changes_nothing():
    torch.manual_seed(0)
    config = transformers.GPTNeoXConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                        intermediate_size=64, max_position_embeddings=32)  # fmt: skip
    model = transformers.GPTNeoXForCausalLM(config)
    with pytest.raises(xrt.UnsupportedModelError, match=r"model type 'gpt_neox'.*llama, mistral, qwen2, gpt2, bert"):
        xtorch.patch(model)
    with pytest.raises(xrt.UnsupportedModelError, match=r"expected a torch\.nn\.Module"):
        xtorch.patch(object())
    assert _instance_forwards(model) == {}


def test_a_module_off_its_pattern_raises_before_anything_is_swapped():
    model, _ = _pair("llama")
    del model.model.layers[1].post_attention_layernorm.variance_epsilon  # planned after layer 0's swaps
    with pytest.raises(
        xrt.UnsupportedModelError, match=r"model\.layers\.1\.post_attention_layernorm.*variance_epsilon"
    ):
        xtorch.patch(model)
    assert _instance_forwards(model) == {} and xtorch.patched(model) is None


def test_patch_twice_and_unpatch_of_an_unpatched_model_raise():
    model, _ = _pair("gpt2")
    with pytest.raises(xrt.UnsupportedModelError, match="not patched"):
        xtorch.unpatch(model)
    xtorch.patch(model)
    with pytest.raises(xrt.UnsupportedModelError, match="already patched"):
        xtorch.patch(model)
    xtorch.unpatch(model)


def test_only_the_patched_instance_changes():
    """Classes, module globals and other models of the same classes keep Hugging Face's code."""
    from transformers.models.llama import modeling_llama

    class_forwards = {c: c.forward for c in (modeling_llama.LlamaRMSNorm, modeling_llama.LlamaMLP,
                                             modeling_llama.LlamaAttention, modeling_llama.LlamaForCausalLM)}  # fmt: skip
    rotary = modeling_llama.apply_rotary_pos_emb
    model, other = _pair("llama")
    xtorch.patch(model)
    assert {c: c.forward for c in class_forwards} == class_forwards
    assert modeling_llama.apply_rotary_pos_emb is rotary
    assert _logged(lambda: _step(other, _batch("llama"))) == {}
    assert _logged(lambda: _step(model, _batch("llama")))


def test_the_pinned_policy_applies_whatever_policy_is_in_force():
    model, _ = _pair("llama")
    xtorch.patch(model, policy="rms_norm=numpy,swiglu=numpy,rotary_embedding=numpy,linear_cross_entropy=numpy")
    with xtorch.kernel_policy(rms_norm="torch", strict=True):  # cannot run on the CPU: would raise if it applied
        calls = _logged(lambda: _step(model, _batch("llama")))
    assert {op for op, _, _ in calls} == OPS["llama"]
    assert repr(xtorch.patched(model).policy).startswith("KernelPolicy(linear_cross_entropy='numpy'")


@pytest.mark.parametrize(("name", "backend"), [("llama", "aot_eager"), ("llama", "inductor"), ("gpt2", "aot_eager")])
def test_torch_compile_of_a_patched_model_runs_the_fused_ops_forward_and_backward(name, backend):
    torch._dynamo.reset()
    model, reference = _pair(name)
    batch = _batch(name)
    expected = _step(reference, batch)
    xtorch.patch(model, policy=CPU_KERNELS, kinds=KINDS)
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    got = []
    calls = _logged(lambda: got.append(_step(model, batch, compiled)))
    _assert_same(got[0], expected)
    assert {op for op, _, _ in calls} == OPS[name]
    assert {(kernel, origin) for _, kernel, origin in calls} == {("numpy", "graph")}


@pytest.mark.parametrize("reentrant", [True, False])
def test_gradient_checkpointing_recomputes_the_fused_ops(reentrant):
    model, reference = _pair("llama")
    batch = _batch("llama")
    for m in (model, reference):
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    expected = _step(reference, batch)
    xtorch.patch(model)
    got = []
    calls = _logged(lambda: got.append(_step(model, batch)))
    _assert_same(got[0], expected)
    forwards = collections.Counter()
    for (op, _, _), n in calls.items():
        forwards[op] += n
    assert forwards["rms_norm"] == 5 + 4 and forwards["swiglu"] == 2 * 2  # the two layers run twice


def test_eval_mode_and_hugging_face_loss_arguments():
    model, reference = _pair("llama")
    batch = _batch("llama")
    xtorch.patch(model)
    assert model(**batch).logits is None  # training with labels: the logits are never made
    model.eval(), reference.eval()
    out, ref = model(**batch), reference(**batch)
    torch.testing.assert_close(out.logits, ref.logits)
    torch.testing.assert_close(out.loss, ref.loss)
    model.train(), reference.train()
    count = torch.tensor(5)
    kwargs = {"num_items_in_batch": count, "return_dict": False}
    loss, *_ = model(**batch, **kwargs)
    torch.testing.assert_close(loss, reference(**batch, **kwargs)[0])
    shift = torch.randint(0, VOCAB, batch["labels"].shape)
    torch.testing.assert_close(model(**batch, shift_labels=shift).loss, reference(**batch, shift_labels=shift).loss)


def test_patch_finds_the_model_inside_a_compile_wrapper():
    model, _ = _pair("gpt2")
    wrapped = torch.compile(model, backend="eager")
    plan = xtorch.patch(wrapped)
    assert xtorch.patched(model) is plan
    xtorch.unpatch(wrapped)
    assert _instance_forwards(model) == {}


def test_kinds_limits_the_swaps_and_lists_the_rest_as_kept():
    model, reference = _pair("llama")
    plan = xtorch.patch(model, kinds=["linear_cross_entropy"], policy=CPU_KERNELS)
    assert [s.path for s in plan.swapped] == [""] and len(plan.kept) == 9
    assert all("not asked for" in s.note for s in plan.kept)
    calls = _logged(lambda: _assert_same(_step(model, _batch("llama")), _step(reference, _batch("llama"))))
    assert {op for op, _, _ in calls} == {"linear_cross_entropy"}
    xtorch.unpatch(model)
    with pytest.raises(xrt.ArgumentError, match="argument 'kinds'"):
        xtorch.patch(model, kinds=["lce"])
    assert _instance_forwards(model) == {}


def test_a_forward_this_version_writes_otherwise_is_kept_with_a_warning(monkeypatch):
    """An attention whose forward does not call a module-level apply_rotary_pos_emb (as some transformers version
    might): its modules are kept, listed with the reason, and patch warns once; the rest is patched."""
    from transformers.models.llama import modeling_llama

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, **kwargs):
        return hidden_states, None

    monkeypatch.setattr(modeling_llama.LlamaAttention, "forward", forward)
    model, _ = _pair("llama")
    with pytest.warns(UserWarning, match="LlamaAttention modules kept as they are") as caught:
        plan = xtorch.patch(model, dry_run=True)
    assert len([w for w in caught if "kept as they are" in str(w.message)]) == 1
    assert [s.path for s in plan.kept] == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    assert len(plan.swapped) == 8
