"""The module patterns `patch` knows, per architecture, matched by class name and checked by structure.

`plan(model, pinned)` walks the model's modules and returns one `Swap` per module a pattern of the model's
architecture (its `config.model_type`) covers, a fused forward or a reason it is kept. It changes nothing: it
raises `UnsupportedModelError` for an unknown architecture, for a module that has a known class name but not the
structure its pattern needs (a transformers version that moved things), and for an architecture whose required
patterns matched no module, so that `patch` never half-patches a model. Where a swap reuses Hugging Face's own
forward with one piece replaced (the attention's rotary function, a language model's head + loss) and this
transformers version writes that forward otherwise, the module is kept, with the reason, and `patch` warns.

    Llama, Mistral, Qwen2   *RMSNorm (HF's casting form), *MLP (SwiGLU, or GeGLU for a GELU act), *Attention
                            (q and k rotated in one launch), *ForCausalLM (head + loss fused, labels shifted)
    GPT-2                   nn.LayerNorm (only when asked for: DEFAULT_KINDS), GPT2MLP (c_fc's bias + tanh GELU in
                            its GEMM), GPT2LMHeadModel
    BERT                    nn.LayerNorm (as GPT-2's), BertSelfOutput / BertOutput (residual add + LayerNorm),
                            BertIntermediate (bias + GELU when the GELU is the tanh form), BertForMaskedLM

The residual add + RMSNorm of a Llama decoder layer (add_rms_norm) is not fused: that add sits in the decoder
layer's own forward, whose gradient checkpointing lives in a wrapper of its class forward in transformers 5.x
(a forward bound on the instance would bypass it), and fusing it saves about one pass over the fp32 residual
stream forward and two backward per layer, ~0.3 ms of the ~45 ms Llama step (under 1 %).
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any

import torch

from ...errors import UnsupportedModelError
from ..router import Pinned
from . import forwards
from .binding import Swap, with_globals, with_inner

LLAMA_LIKE = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2"}
ARCHITECTURES = (*LLAMA_LIKE, "gpt2", "bert")
KINDS = frozenset({"rms_norm", "layer_norm", "add_layer_norm", "gated_mlp", "linear+gelu", "rotary_embedding",
                   "linear_cross_entropy"})  # what a swap fuses (Swap.kind)  # fmt: skip
# What patch swaps unless told otherwise: every kind that replaces a chain of PyTorch operations. A plain
# nn.LayerNorm is already one PyTorch kernel each way (F.layer_norm): our op in its place saves no pass over
# memory, costs more host time per call than PyTorch's (an eager GPT-2 step, host-bound, measured 1.31x eager
# patched with the head + loss alone and 1.21x with the LayerNorms swapped too, on an H200), and under
# torch.compile it would hide the norm from inductor's fusion. `kinds=KINDS` swaps them as well.
DEFAULT_KINDS = KINDS - {"layer_norm"}
NOT_BY_DEFAULT = {
    "layer_norm": "nn.LayerNorm is one PyTorch kernel each way already; swapped only when kinds names it"
}  # fmt: skip

# activation modules by class name -> (the fused op's activation, what it computes)
GATE_ACTIVATIONS = {
    "SiLU": "silu", "SiLUActivation": "silu",
    "GELUActivation": "none", "GELU": "none",
    "NewGELUActivation": "tanh", "GELUTanh": "tanh", "PytorchGELUTanh": "tanh", "FastGELUActivation": "tanh",
}  # fmt: skip


def plan(model: torch.nn.Module, pinned: Pinned) -> list[Swap]:
    """Every swap `patch(model)` would make (see the module docstring); raises instead of planning part of it."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"patch: no known module patterns for {type(model).__name__} (model type {model_type!r}); xpuruntime "
            f"patches Hugging Face models of type {', '.join(ARCHITECTURES)}"
        )
    patterns = _patterns(model_type, pinned)
    swaps = []
    for path, module in model.named_modules():
        for matches, make in patterns:
            if matches(module):
                swaps.append(make(path, module))
                break
    _check_coverage(model, model_type, swaps)
    fused_norms = {f"{s.path}.LayerNorm" for s in swaps if s.kind == "add_layer_norm"}  # their owner's forward
    return [s for s in swaps if s.path not in fused_norms]  # runs them; their own would never be called


Pattern = tuple[Callable[[Any], bool], Callable[[str, Any], Swap]]


def _patterns(model_type: str, pinned: Pinned) -> list[Pattern]:
    if model_type in LLAMA_LIKE:
        prefix = LLAMA_LIKE[model_type]
        return [
            (_named(f"{prefix}RMSNorm"), lambda path, m: _rms_norm(path, m, pinned)),
            (_named(f"{prefix}MLP"), lambda path, m: _gated_mlp(path, m, pinned)),
            (_named(f"{prefix}Attention"), lambda path, m: _attention(path, m, pinned)),
            (_named(f"{prefix}ForCausalLM"), lambda path, m: _head(path, m, _CAUSAL, pinned)),
        ]
    if model_type == "gpt2":
        return [
            (_is_layer_norm, lambda path, m: _layer_norm(path, m, pinned)),
            (_named("GPT2MLP"), lambda path, m: _conv1d_mlp(path, m, pinned)),
            (_named("GPT2LMHeadModel"), lambda path, m: _head(path, m, _CAUSAL, pinned)),
        ]
    return [  # bert
        (_named("BertSelfOutput", "BertOutput"), lambda path, m: _add_norm_output(path, m, pinned)),
        (_is_layer_norm, lambda path, m: _layer_norm(path, m, pinned)),
        (_named("BertIntermediate"), lambda path, m: _intermediate(path, m, pinned)),
        (_named("BertForMaskedLM"), lambda path, m: _head(path, m, _MASKED, pinned)),
    ]


# which kinds each architecture must have found (else its modules are not what the patterns know)
REQUIRED = {
    "llama": {"rms_norm", "gated_mlp", "rotary_embedding"},
    "gpt2": {"layer_norm", "linear+gelu"},
    "bert": {"layer_norm", "add_layer_norm"},
}


def _check_coverage(model: Any, model_type: str, swaps: list[Swap]) -> None:
    found = {swap.kind for swap in swaps}
    required = REQUIRED["llama" if model_type in LLAMA_LIKE else model_type]
    missing = sorted(required - found)
    if missing:
        raise UnsupportedModelError(
            f"patch: {type(model).__name__} (model type {model_type!r}) has no module for the pattern(s) "
            f"{', '.join(missing)}: this transformers version's modules differ from the ones xpuruntime knows"
        )


def _named(*names: str) -> Callable[[Any], bool]:
    """Matches a module whose class (or a base class: FSDP2 and others subclass it) has one of `names`."""
    wanted = set(names)
    return lambda module: any(cls.__name__ in wanted for cls in type(module).__mro__)


def _is_layer_norm(module: Any) -> bool:
    return isinstance(module, torch.nn.LayerNorm)


def _require(path: str, module: Any, *attributes: str) -> None:
    missing = [a for a in attributes if getattr(module, a, None) is None]
    if missing:
        raise UnsupportedModelError(
            f"patch: {type(module).__name__} at '{path}' has no {', '.join(missing)}: not the structure xpuruntime's "
            "pattern for it expects (a transformers version that changed it?); nothing was patched"
        )


def _original(module: Any) -> Callable[..., Any]:
    """The class's forward, which the swap shadows (and falls back to)."""
    return type(module).forward


def _rms_norm(path: str, module: Any, pinned: Pinned) -> Swap:
    _require(path, module, "weight", "variance_epsilon")
    forward = forwards.hf_rms_norm(_original(module), pinned)
    return Swap(path, module, "rms_norm", ("rms_norm", "rms_norm_backward"), forward,
                "weight * (x * rsqrt(mean(x^2) + eps)).to(x.dtype) in one pass each way")  # fmt: skip


def _layer_norm(path: str, module: Any, pinned: Pinned) -> Swap:
    forward = forwards.torch_layer_norm(_original(module), pinned)
    return Swap(path, module, "layer_norm", ("layer_norm", "layer_norm_backward"), forward, "F.layer_norm")


def _gated_mlp(path: str, module: Any, pinned: Pinned) -> Swap:
    _require(path, module, "gate_proj", "up_proj", "down_proj", "act_fn")
    activation = _activation(module.act_fn)
    if activation is None:
        note = f"kept: {type(module.act_fn).__name__} gates it, which neither swiglu nor geglu computes"
        return Swap(path, module, "gated_mlp", (), None, note)
    op = "swiglu" if activation == "silu" else "geglu"
    note = "act_fn(gate_proj(x)) * up_proj(x) in one pass each way" + ("" if op == "swiglu" else f" ({activation})")
    return Swap(path, module, "gated_mlp", (op, f"{op}_backward"), forwards.gated_mlp(activation, pinned), note)


def _activation(act: Any) -> str | None:
    """The fused op's activation for an activation module (None: not one the gated ops compute)."""
    if isinstance(act, torch.nn.GELU):
        return act.approximate
    return GATE_ACTIVATIONS.get(type(act).__name__)


def _conv1d_mlp(path: str, module: Any, pinned: Pinned) -> Swap:
    _require(path, module, "c_fc", "c_proj", "act", "dropout")
    if _activation(module.act) != "tanh":
        note = f"kept: {type(module.act).__name__} is not the tanh GELU that the GEMM's epilogue computes"
        return Swap(path, module, "linear+gelu", (), None, note)
    ops = ("linear", "linear_grad_input", "linear_grad_weight")
    note = "c_fc's bias and gelu_new in its GEMM; the pre-activation recomputed in the backward"
    return Swap(path, module, "linear+gelu", ops, forwards.conv1d_gelu_mlp(pinned), note)


def _intermediate(path: str, module: Any, pinned: Pinned) -> Swap:
    _require(path, module, "dense", "intermediate_act_fn")
    if _activation(module.intermediate_act_fn) != "tanh":
        act = type(module.intermediate_act_fn).__name__
        note = f"kept: {act} (erf GELU) has no fused kernel here (cuBLASLt's GELU epilogue is the tanh form)"
        return Swap(path, module, "linear+gelu", (), None, note)
    ops = ("linear", "linear_grad_input", "linear_grad_weight")
    return Swap(path, module, "linear+gelu", ops, forwards.linear_gelu(pinned), "dense's bias and the GELU in its GEMM")


def _add_norm_output(path: str, module: Any, pinned: Pinned) -> Swap:
    _require(path, module, "dense", "dropout", "LayerNorm")
    ops = ("add_layer_norm", "add_layer_norm_backward")
    note = "LayerNorm(dropout(dense(h)) + input_tensor): the residual add and the norm in one pass each way"
    return Swap(path, module, "add_layer_norm", ops, forwards.add_norm_output(pinned), note)


def _attention(path: str, module: Any, pinned: Pinned) -> Swap:
    kind, forward = "rotary_embedding", type(module).forward
    inner = inspect.unwrap(forward)
    original = inner.__globals__.get("apply_rotary_pos_emb")
    if "apply_rotary_pos_emb" not in inner.__code__.co_names or original is None:
        return _unadapted(path, module, kind, "its forward calls no module-level apply_rotary_pos_emb")
    try:
        forwards.rotary_signature(original)
    except ValueError as exc:
        return _unadapted(path, module, kind, str(exc))
    stand_in = forwards.rotary(original, pinned)
    copied = with_inner(forward, lambda f: with_globals(f, {"apply_rotary_pos_emb": stand_in}))
    if copied is None:
        return _unadapted(path, module, kind, "a decorator of its forward keeps the function elsewhere than in a cell")
    note = "its forward with apply_rotary_pos_emb: q and k rotated in one launch each way"
    return Swap(path, module, kind, ("rotary_embedding", "rotary_embedding_backward"), copied, note)


def _unadapted(path: str, module: Any, kind: str, why: str) -> Swap:
    """A module of a known pattern whose code this transformers version writes otherwise than the versions the
    swap adapts (a function copied with one piece replaced): kept, with a warning from `patch`."""
    message = (f"patch: {type(module).__name__} modules kept as they are: {why} (this transformers version differs "
               "from the ones xpuruntime adapts); the plan lists them")  # fmt: skip
    return Swap(path, module, kind, (), None, f"kept: {why}", warning=message)


_CAUSAL = forwards.Head(hidden=lambda model, h: h, projection=lambda model: model.lm_head, shifted=True)
_MASKED = forwards.Head(
    hidden=lambda model, h: model.cls.predictions.transform(h),
    projection=lambda model: model.cls.predictions.decoder,
    shifted=False,
)


def _head(path: str, module: Any, head: forwards.Head, pinned: Pinned) -> Swap:
    if head is _CAUSAL:
        _require(path, module, "lm_head", "base_model")
    else:
        _require(path, module, "cls", "base_model")
    kind, forward = "linear_cross_entropy", type(module).forward
    output_class = _output_class(inspect.unwrap(forward))
    if output_class is None:
        return _unadapted(path, module, kind, "its forward's return annotation names no ModelOutput class")
    copied = with_inner(forward, lambda inner: forwards.language_model(inner, head, output_class, pinned))
    if copied is None:
        return _unadapted(path, module, kind, "a decorator of its forward keeps the function elsewhere than in a cell")
    shift = "labels shifted as HF's ForCausalLMLoss, " if head.shifted else ""
    note = f"with labels in training: head + loss in row chunks ({shift}logits None), else its own forward"
    return Swap(path, module, kind, ("linear_cross_entropy",), copied, note)


def _output_class(inner: Callable[..., Any]) -> type | None:
    """The ModelOutput class a forward's return annotation names (`X` or `tuple | X`)."""
    from transformers.utils import ModelOutput

    annotation = inner.__annotations__.get("return")
    if isinstance(annotation, str):
        try:
            annotation = eval(annotation, inner.__globals__)  # the model file's own annotation
        except Exception:
            return None
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, ModelOutput):
            return candidate
    return None
