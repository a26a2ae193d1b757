"""`patch(model)`: one line that puts xpuruntime's fused training ops into a Hugging Face model; `unpatch(model)`
takes them out again.

    import xpuruntime.pytorch as xtorch
    model = transformers.LlamaForCausalLM(config)
    xtorch.patch(model)                      # or patch(model, policy="rms_norm=triton,swiglu=triton")
    loss = model(input_ids, labels=labels).loss   # RMSNorm, SwiGLU, RoPE, head + loss: fused ops
    xtorch.unpatch(model)                    # the very same modules and forwards as before

What is swapped, per architecture, is in `architectures`; `patch(model, dry_run=True)` lists it without changing
anything. A swap binds a forward on one module instance (never on its class or module, so other models in the
process, an unpatched baseline among them, keep Hugging Face's code), computes what the module computes through
the fused ops (forward and backward, eager or under torch.compile), and replaces or re-creates no parameter:
state_dict, DDP and FSDP2's `fully_shard` (on the decoder layers and the root, the usual way) see the same
parameters. Gradient checkpointing (`model.gradient_checkpointing_enable()`) keeps working: the decoder layers'
own forwards are not swapped. With labels in training mode, a language model's output carries the loss and
`logits=None` (the logits are never made); in eval mode, or without labels, its own forward runs.

`policy=` pins a policy (a KernelPolicy, a spec string or a mapping) to the patched modules: their ops dispatch
under it whatever policy is in force around them (otherwise: the policy in force at each call). Patch before
wrapping the model (DDP, fully_shard, torch.compile); a model wrapped by DDP or torch.compile is patched inside.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ...errors import ArgumentError, UnsupportedModelError, argument_error
from ...policy import KernelPolicy, as_policy
from ..router import pin
from .architectures import DEFAULT_KINDS, KINDS, NOT_BY_DEFAULT, plan
from .binding import Swap

__all__ = ["DEFAULT_KINDS", "KINDS", "PatchPlan", "Swap", "patch", "patched", "unpatch"]

RECORD = "_xpuruntime_patch"  # where a patched model keeps its applied plan (the instance's __dict__)


@dataclasses.dataclass
class PatchPlan:
    """The swaps `patch` makes (or, with dry_run=True, would make) in one model: a Swap per module, a fused
    forward or the reason it is kept. Iterating gives the swaps; `str()` a table."""

    model: str  # the model's class name
    model_type: str
    policy: KernelPolicy | None  # pinned to the patched modules (None: the policy in force at each call)
    swaps: list[Swap]
    applied: bool = False

    def __iter__(self) -> Iterator[Swap]:
        return iter(self.swaps)

    def __len__(self) -> int:
        return len(self.swaps)

    @property
    def swapped(self) -> list[Swap]:
        """The swaps that bind a fused forward."""
        return [s for s in self.swaps if not s.kept]

    @property
    def kept(self) -> list[Swap]:
        """The modules of a known pattern left as they are, each with its reason."""
        return [s for s in self.swaps if s.kept]

    def __str__(self) -> str:
        state = "patched" if self.applied else "would patch (dry run)"
        lines = [f"{self.model} ({self.model_type}): {state} {len(self.swapped)} modules, kept {len(self.kept)}"
                 f"; policy {self.policy!r}"]  # fmt: skip
        width = max((len(s.path) for s in self.swaps), default=0)
        for s in self.swaps:
            ops = ", ".join(s.ops) or "-"
            lines.append(f"  {s.path or '(model)':<{width}}  {s.kind:<20} {ops:<45} {s.note}")
        return "\n".join(lines)


def patch(
    model: Any, policy: KernelPolicy | str | Mapping[str, Any] | None = None, dry_run: bool = False,
    kinds: Iterable[str] | None = None,
) -> PatchPlan:  # fmt: skip
    """Swap the known module patterns of a Hugging Face `model` for xpuruntime's fused ops (module docstring).

    Every swap is planned and checked before any is made: an unknown architecture or a module that does not
    have its pattern's structure raises `UnsupportedModelError` and leaves the model untouched. `dry_run=True`
    returns the plan without changing anything. `kinds` limits the swaps to those kinds (of `KINDS`; e.g.
    `kinds=["linear_cross_entropy"]` under torch.compile, leaving the rest to inductor), the others listed as
    kept; by default every kind but plain LayerNorms (`DEFAULT_KINDS`: a swap must replace a chain of PyTorch
    operations to pay for itself; `kinds=KINDS` swaps everything). Returns the plan (applied)."""
    root = _unwrapped(model)
    if not hasattr(root, "named_modules"):
        raise UnsupportedModelError(f"patch: expected a torch.nn.Module, got {type(model).__name__}")
    if RECORD in root.__dict__:
        raise UnsupportedModelError(f"patch: {type(root).__name__} is already patched; call unpatch(model) first")
    wanted = _kinds(kinds)
    pinned_policy = as_policy(policy)
    why = NOT_BY_DEFAULT if kinds is None else {}
    swaps = [s if s.kind in wanted or s.kept else s.left_out(why.get(s.kind)) for s in plan(root, pin(pinned_policy))]
    result = PatchPlan(type(root).__name__, root.config.model_type, pinned_policy, swaps)
    for message in dict.fromkeys(s.warning for s in swaps if s.warning):  # once per class and reason
        warnings.warn(message, UserWarning, stacklevel=2)
    if dry_run:
        return result
    done: list[Swap] = []
    try:
        for swap in swaps:
            swap.apply()
            done.append(swap)
    except BaseException:
        for swap in reversed(done):
            swap.undo()
        raise
    result.applied = True
    root.__dict__[RECORD] = result
    return result


def unpatch(model: Any) -> PatchPlan:
    """Undo `patch(model)`: every swapped module gets back exactly the forward it had (its class's). Returns the
    plan that was undone; raises UnsupportedModelError for a model that is not patched."""
    root = _unwrapped(model)
    record = getattr(root, "__dict__", {}).get(RECORD)
    if record is None:
        raise UnsupportedModelError(f"unpatch: {type(root).__name__} is not patched")
    for swap in reversed(record.swaps):
        swap.undo()
    del root.__dict__[RECORD]
    record.applied = False
    return record


def _kinds(kinds: Iterable[str] | None) -> frozenset[str]:
    if kinds is None:
        return DEFAULT_KINDS
    wanted = frozenset([kinds] if isinstance(kinds, str) else kinds)
    unknown = sorted(wanted - KINDS)
    if unknown:
        raise argument_error(ArgumentError, "patch", "kinds", f"names among {', '.join(sorted(KINDS))}", unknown)
    return wanted


def patched(model: Any) -> PatchPlan | None:
    """The plan applied to `model` by `patch`, or None if it is not patched."""
    return getattr(_unwrapped(model), "__dict__", {}).get(RECORD)


def _unwrapped(model: Any) -> Any:
    """The module inside a torch.compile wrapper (`_orig_mod`) or DistributedDataParallel (`module`)."""
    while True:
        wrapper = type(model).__name__
        inner = getattr(model, {"OptimizedModule": "_orig_mod", "DistributedDataParallel": "module"}.get(wrapper, ""),
                        None)  # fmt: skip
        if inner is None:
            return model
        model = inner
