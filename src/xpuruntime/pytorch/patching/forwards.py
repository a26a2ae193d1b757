"""The forwards that `patch` binds on Hugging Face modules: each computes what the module's own forward does,
through xpuruntime's fused ops (`custom_ops`) under the pinned policy (`router.Pinned`).

Each maker takes what it needs at patch time (the module's original forward, the pinned policy) and returns a
plain function of (self, ...) to bind on the instance. A forward whose call the fused op cannot express (mixed
dtypes the op does not take, gradients into cos/sin) runs the module's original forward for that call.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ..custom_ops.add_norm import add_layer_norm
from ..custom_ops.glu import geglu, swiglu
from ..custom_ops.linear import linear
from ..custom_ops.linear_cross_entropy import linear_cross_entropy
from ..custom_ops.norm import layer_norm, rms_norm
from ..custom_ops.rotary import rotary_embedding
from ..router import Pinned

Forward = Callable[..., Any]


def hf_rms_norm(original: Forward, pinned: Pinned) -> Forward:
    """LlamaRMSNorm / MistralRMSNorm / Qwen2RMSNorm: `weight * (x * rsqrt(mean(x^2) + eps)).to(x.dtype)`.

    Under autocast the result comes in the autocast dtype: in these models every reader of a norm's output is a
    projection that autocast casts to that dtype (q/k/v, gate/up, the LM head), so the values they compute with
    are the same, and the fp32 result (a (tokens x hidden) fp32 tensor per norm) is not what the projections'
    autograd keeps until the backward: 17 x 32 MiB alive at the bench's Llama step's peak, found with
    benchmarks/probes/peak_memory.py. (output_hidden_states then gives the last hidden state in that dtype.)"""

    def forward(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if hidden_states.dtype != weight.dtype:  # the module's result has the promoted dtype: its own forward
            return original(self, hidden_states)
        out = rms_norm(hidden_states, weight.shape, weight, self.variance_epsilon, casting="llama", pinned=pinned)
        device = out.device.type
        if torch.is_autocast_enabled(device) and out.dtype == torch.float32:
            return out.to(torch.get_autocast_dtype(device))
        return out

    return forward


def torch_layer_norm(original: Forward, pinned: Pinned) -> Forward:
    """nn.LayerNorm: F.layer_norm(x, normalized_shape, weight, bias, eps)."""

    def forward(self: Any, input: torch.Tensor) -> torch.Tensor:
        if not _same_dtype(input, self.weight, self.bias):
            return original(self, input)
        return layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps, pinned)

    return forward


def gated_mlp(activation: str, pinned: Pinned) -> Forward:
    """LlamaMLP and its kin: `down_proj(act_fn(gate_proj(x)) * up_proj(x))`, act(gate) * up fused (swiglu for
    "silu", else geglu with F.gelu's approximation)."""

    def forward(self: Any, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_proj(x), self.up_proj(x)
        hidden = swiglu(gate, up, pinned) if activation == "silu" else geglu(gate, up, activation, pinned)
        return self.down_proj(hidden)

    return forward


def conv1d_gelu_mlp(pinned: Pinned) -> Forward:
    """GPT2MLP: `dropout(c_proj(gelu_new(c_fc(x))))`, c_fc's bias and tanh GELU fused into its GEMM."""

    def forward(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
        c_fc = self.c_fc  # a Conv1D: x @ weight + bias, weight (in, out), so linear's weight is its transpose
        hidden = linear(hidden_states, c_fc.weight.t(), c_fc.bias, "gelu", pinned)
        return self.dropout(self.c_proj(hidden))

    return forward


def linear_gelu(pinned: Pinned) -> Forward:
    """BertIntermediate with a tanh GELU: `act(dense(x))`, dense's bias and the GELU fused into its GEMM."""

    def forward(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
        return linear(hidden_states, self.dense.weight, self.dense.bias, "gelu", pinned)

    return forward


def add_norm_output(pinned: Pinned) -> Forward:
    """BertSelfOutput / BertOutput: `LayerNorm(dropout(dense(h)) + input_tensor)`, the add and the norm fused."""

    def forward(self: Any, hidden_states: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
        x, norm = self.dropout(self.dense(hidden_states)), self.LayerNorm
        return add_layer_norm(x, input_tensor, norm.weight, norm.bias, norm.eps, pinned)[0]

    return forward


def rotary(original: Callable[..., Any], pinned: Pinned) -> Callable[..., Any]:
    """A stand-in for a modeling file's `apply_rotary_pos_emb(q, k, cos, sin[, position_ids], unsqueeze_dim=1)`
    (its signature, checked at patch time by `rotary_signature`): q and k rotated in one launch. Hugging Face's
    cos and sin are already gathered per position, so a `position_ids` argument (old signatures) is unused, as
    there."""
    names = rotary_signature(original)
    unsqueeze_at = names.index("unsqueeze_dim") - 4

    def apply_rotary_pos_emb(q: Any, k: Any, cos: Any, sin: Any, *args: Any, **kwargs: Any) -> tuple:
        unsqueeze_dim = kwargs.get("unsqueeze_dim", args[unsqueeze_at] if len(args) > unsqueeze_at else 1)
        if cos.requires_grad or sin.requires_grad:  # the fused op gives cos and sin no gradient
            return original(q, k, cos, sin, *args, **kwargs)
        return rotary_embedding(q, k, cos, sin, None, unsqueeze_dim, False, pinned)

    return apply_rotary_pos_emb


def rotary_signature(function: Callable[..., Any]) -> list[str]:
    """The parameter names of a modeling file's apply_rotary_pos_emb, if `rotary` can stand in for it (else a
    ValueError saying why)."""
    names = list(inspect.signature(function).parameters)
    if names[:4] != ["q", "k", "cos", "sin"] or "unsqueeze_dim" not in names or not set(names[4:]) <= {
        "position_ids", "unsqueeze_dim"}:  # fmt: skip
        raise ValueError(f"apply_rotary_pos_emb{inspect.signature(function)} is not (q, k, cos, sin, "
                         "[position_ids,] unsqueeze_dim=1)")  # fmt: skip
    return names


@dataclasses.dataclass(frozen=True)
class Head:
    """How a model computes its loss from the base model's output: the final hidden states (`hidden`), the output
    projection (`projection`: a module with `weight` and `bias`) and whether labels are shifted (causal LM)."""

    hidden: Callable[[Any, torch.Tensor], torch.Tensor]
    projection: Callable[[Any], Any]
    shifted: bool


def language_model(inner: Forward, head: Head, output_class: type, pinned: Pinned) -> Forward:
    """The innermost function of a ...ForCausalLM / ...ForMaskedLM forward (its decorators stay around it): in
    training with labels, the base model, then the head and the loss fused (`linear_cross_entropy`, the logits
    never made: the output's `logits` is None); otherwise the original. Hugging Face's loss: labels shifted for a
    causal LM, `ignore_index` (-100), `shift_labels` and `num_items_in_batch` (the loss summed, then divided by
    it) as its loss functions take them."""
    names = [p.name for p in inspect.signature(inner).parameters.values() if p.kind == p.POSITIONAL_OR_KEYWORD][1:]
    fields = [f.name for f in dataclasses.fields(output_class) if f.name not in ("loss", "logits")]

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs.update(zip(names, args))
        labels = kwargs.get("labels")
        if labels is None or not self.training or not _keeps_every_position(kwargs.get("logits_to_keep", 0)):
            return inner(self, **kwargs)
        outputs = self.base_model(**{k: v for k, v in kwargs.items() if k not in ("labels", "logits_to_keep")})
        hidden, projection = head.hidden(self, outputs[0]), head.projection(self)
        loss = _loss(hidden, projection, labels, head.shifted, kwargs, pinned)
        return output_class(loss=loss, logits=None, **{f: getattr(outputs, f, None) for f in fields})

    return forward


def _loss(hidden: Any, projection: Any, labels: Any, shifted: bool, kwargs: dict, pinned: Pinned) -> Any:
    ignore_index = kwargs.get("ignore_index", -100)
    target = kwargs.get("shift_labels") if shifted else labels
    if target is None:  # HF's ForCausalLMLoss: position t predicts token t + 1, the last predicts nothing
        target = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    target = target.reshape(hidden.shape[:-1]).to(hidden.device).contiguous()
    count = kwargs.get("num_items_in_batch")
    reduction = "mean" if count is None else "sum"
    loss = linear_cross_entropy(hidden, projection.weight, target, projection.bias, ignore_index, reduction=reduction,
                                pinned=pinned)  # fmt: skip
    if count is not None:
        loss = loss / (count.to(loss.device) if isinstance(count, torch.Tensor) else count)
    return loss


def _keeps_every_position(logits_to_keep: Any) -> bool:
    return logits_to_keep is None or (isinstance(logits_to_keep, int) and logits_to_keep == 0)


def _same_dtype(x: torch.Tensor, *params: Any) -> bool:
    if x.device.type == "cuda" and torch.is_autocast_enabled("cuda"):
        return True  # the op casts everything to float32 first, as PyTorch's CUDA autocast runs layer_norm
    return all(p is None or p.dtype == x.dtype for p in params)
