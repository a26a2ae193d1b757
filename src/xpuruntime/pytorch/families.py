"""Op families: a policy that names a kernel for an op also names it for that op's companions.

`attention=flash_v2` means flash_v2 for the training forward (`attention_forward`, which also returns
the logsumexp) and for `attention_backward`; `layer_norm=triton` means triton for
`layer_norm_backward`; `matmul=cublasLt` means cublasLt for `linear` (nn.Linear's fused bias), and
`linear=cublasLt` for linear's backward ops; `swiglu=triton` means triton for `swiglu_backward`, and so
on for each fused training op. A companion the policy names itself keeps its own choice, and one without
a kernel of that name is left to automatic selection (`router.family_policy` applies this against the
registry). An op belongs to the first family that lists it (`linear`: matmul's, for autotune's verdicts).

A new routed op with a backward op adds one line here.
"""

from __future__ import annotations

from typing import Any

from ..policy import AUTOTUNE, KernelPolicy

FAMILIES: dict[str, tuple[str, ...]] = {
    "attention": ("attention_forward", "attention_backward"),
    "layer_norm": ("layer_norm_backward",),
    "rms_norm": ("rms_norm_backward",),
    "matmul": ("linear",),
    "linear": ("linear_grad_input", "linear_grad_weight"),
    "swiglu": ("swiglu_backward",),
    "geglu": ("geglu_backward",),
    "rotary_embedding": ("rotary_embedding_backward",),
    "linear_cross_entropy": ("linear_cross_entropy_backward",),
    "add_rms_norm": ("add_rms_norm_backward",),
    "add_layer_norm": ("add_layer_norm_backward",),
}
FRONT_END_OPS = frozenset(FAMILIES).union(*FAMILIES.values())  # what `autotune=True` steers
# (built from the last family to the first, so that the first family listing an op keeps it)
FAMILY_OF = {op: head for head, members in reversed(FAMILIES.items()) for op in (head, *members)}


def all_preferences(policy: KernelPolicy) -> dict[str, str]:
    """The op -> kernel name mapping `policy` was built from, "autotune" entries included."""
    return {**dict.fromkeys(policy.autotune_ops, AUTOTUNE), **policy.preferences}


def rebuilt(policy: KernelPolicy, prefs: dict[str, str], kind: type[KernelPolicy] = KernelPolicy) -> KernelPolicy:
    """A `kind` policy with `prefs` and every option of `policy`."""
    options: dict[str, Any] = {"strict": policy.strict, "math_mode": policy.math_mode, "sync": policy.sync}
    return kind(prefs, deterministic=policy.deterministic, autotune=policy.autotune, validate=False, **options)
