"""Op families: a policy that names a kernel for an op also names it for that op's companions.

`attention=flash_v2` means flash_v2 for the training forward (`attention_forward`, which also returns
the logsumexp) and for `attention_backward`; `layer_norm=triton` means triton for
`layer_norm_backward`; `matmul=cublasLt` means cublasLt for `linear` (nn.Linear's fused bias). A
companion the policy names itself keeps its own choice, and one without a kernel of that name is left
to automatic selection.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from .. import arguments
from .. import policy as _core_policy
from ..policy import AUTOTUNE, KernelPolicy, current_policy
from . import handback
from .routing import FAMILIES, get_dispatcher

_derived: dict[tuple, KernelPolicy] = {}


def family_policy(policy: KernelPolicy) -> KernelPolicy:
    """`policy` with each named op's kernel name extended to its companions (cached per policy)."""
    registry = get_dispatcher().registry
    key = (policy.fingerprint, id(registry), registry.generation)
    derived = _derived.get(key)
    if derived is None:
        prefs = all_preferences(policy)
        for head, members in FAMILIES.items():
            name = prefs.get(head)
            for member in members:
                known = name == AUTOTUNE or name in registry.kernels.get(member, {})
                if name is not None and member not in prefs and known:
                    prefs[member] = name
        derived = policy
        if len(prefs) != len(policy.preferences) + len(policy.autotune_ops):
            derived = rebuilt(policy, prefs)
        if len(_derived) > 1024:
            _derived.clear()
        _derived[key] = derived
    return derived


@contextlib.contextmanager
def using(policy: KernelPolicy) -> Iterator[None]:
    """Run the block under `policy` (no scope is entered when it is already the one in force)."""
    if policy is current_policy():
        yield
        return
    with _core_policy.kernel_policy(policy):
        yield


def fell_back(op: str, inputs: tuple, attrs: tuple, policy: KernelPolicy) -> bool:
    """Whether the cached plan of an earlier call chose a fallback (its preferred kernel could not run).
    No plan key is built unless some plan of `op` under `policy` fell back (rare)."""
    dispatcher = get_dispatcher()
    policy = handback.routed_view(policy)  # the policy the forward was dispatched under
    if (op, policy.fingerprint) not in dispatcher.fallbacks:
        return False
    try:
        plan = dispatcher.plans.get(arguments.plan_key(op, policy.fingerprint, attrs, inputs, None))
    except Exception:  # an argument the fast key cannot describe: no cached plan to ask
        return False
    return plan is not None and plan.reason == "fallback"


def without(policy: KernelPolicy, ops: tuple[str, ...], user: KernelPolicy) -> KernelPolicy:
    """`policy` minus the companion preferences it added for `ops` (the user's own names stay)."""
    added = [op for op in ops if op in policy.preferences and op not in user.preferences]
    if not added:
        return policy
    return rebuilt(policy, {op: k for op, k in all_preferences(policy).items() if op not in added})


def all_preferences(policy: KernelPolicy) -> dict[str, str]:
    """The op -> kernel name mapping `policy` was built from, "autotune" entries included."""
    return {**dict.fromkeys(policy.autotune_ops, AUTOTUNE), **policy.preferences}


def rebuilt(policy: KernelPolicy, prefs: dict[str, str], kind: type[KernelPolicy] = KernelPolicy) -> KernelPolicy:
    """A `kind` policy with `prefs` and every option of `policy`."""
    options: dict[str, Any] = {"strict": policy.strict, "math_mode": policy.math_mode, "sync": policy.sync}
    return kind(prefs, deterministic=policy.deterministic, autotune=policy.autotune, validate=False, **options)
