"""How an aten override hands a call to the xpuruntime dispatcher, and when it hands it back.

An override routes a call only when the policy in force here names a kernel for the op. A call the
op cannot describe (a dtype mix, a shape outside its semantics) or that no registered kernel can run
goes back to PyTorch's kernel; strict policies still raise. Calls made while the dispatcher is
already running a kernel (a `torch_*` kernel calling back into aten) go to PyTorch directly.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from ..dispatch import LAUNCHING, default_dispatcher
from ..errors import (
    ArgumentError,
    DeviceMismatchError,
    DTypeError,
    KernelFallbackWarning,
    LayoutError,
    NoKernelError,
    ShapeError,
    UnsupportedByPolicyError,
)
from ..policy import current_policy
from . import handback, native_routes

_NOT_OURS = (ArgumentError, DeviceMismatchError, DTypeError, LayoutError, ShapeError)


class _Router:
    """The dispatcher the overrides use (the process-wide one unless a test swaps it), and what the
    overrides derive from its op schemas once instead of per call (`memoized`)."""

    def __init__(self) -> None:
        self.run: Callable[..., Any] | None = None
        self.dispatcher: Any = None
        self.memo: dict[Hashable, Any] = {}


router = _Router()
_warned_ops: set[tuple[str, str]] = set()


def use_dispatcher(dispatcher: Any = None) -> None:
    """Route through `dispatcher` (None: the process-wide one, made on first use)."""
    router.dispatcher = dispatcher
    router.run = None if dispatcher is None else dispatcher.run
    router.memo = {}
    if dispatcher is not None:
        native_routes.watch_registry(dispatcher.registry)
    native_routes.reset()  # decisions made with the previous dispatcher


def get_dispatcher() -> Any:
    if router.dispatcher is None:
        use_dispatcher(default_dispatcher())
    return router.dispatcher


# An op's companions: a policy naming a kernel for the op names it for these too (see `families`), so
# the overrides a policy needs include the companions' (the set never changes inside a backward).
FAMILIES = {
    "attention": ("attention_forward", "attention_backward"),
    "layer_norm": ("layer_norm_backward",),
    "rms_norm": ("rms_norm_backward",),
    "matmul": ("linear",),
}
FRONT_END_OPS = frozenset(FAMILIES).union(*FAMILIES.values())  # what `autotune=True` steers
handback.watch_families(FAMILIES)
_routed: dict[int, frozenset[str]] = {}


def routed_ops(policy: Any) -> frozenset[str]:
    """The ops a policy asks to steer: those it names a kernel for or autotunes, minus those autotune
    handed back to PyTorch (see `handback`)."""
    ops = _routed.get(policy.fingerprint)
    if ops is None:
        names = set(policy.preferences) | set(getattr(policy, "autotune_ops", ()))
        names.update(*(FAMILIES.get(op, ()) for op in list(names)))
        if getattr(policy, "autotune", False):
            names |= FRONT_END_OPS
        if handback.RETURNED:
            names -= handback.RETURNED.get(handback.steering(policy), frozenset())
        ops = _routed[policy.fingerprint] = frozenset(names)
    return ops


def forget_routed() -> None:
    """Drop the cached routed sets (autotune handed some ops back)."""
    _routed.clear()


def nested() -> bool:
    """True while a kernel the dispatcher chose runs on this thread: its framework calls go to the framework."""
    return LAUNCHING.depth > 0


def wants(op: str) -> bool:
    """True when this thread's policy steers `op` and no kernel the dispatcher chose is running here."""
    return not nested() and op in routed_ops(current_policy())


def dispatch(op: str, inputs: tuple, attrs: tuple = (), warn: bool = True, policy: Any = None) -> Any:
    """Run `op` through the dispatcher under `policy` (None: the one in force); None means 'let PyTorch
    run it' (see the module docstring). warn=False: the caller has another route to try, whose own
    fallback warns."""
    run = router.run or get_dispatcher().run
    if handback.watching():
        handback.note_call(op)
    try:
        return run(op, inputs, attrs, None, handback.routed_view(policy or current_policy()))
    except _NOT_OURS:
        return None
    except UnsupportedByPolicyError:
        raise
    except NoKernelError as exc:
        if warn:
            _warn_no_kernel(op, exc, policy or current_policy())
        return None


# kernels whose launch for the overrides' calls (mm, bmm; addmm as linear with a bias and no activation)
# is exactly the aten op's own kernel
PYTORCH_OWN_KERNELS = {"matmul": "torch", "linear": "torch"}


def torch_kernel_ran(op: str, inputs: tuple, policy: Any = None, **attrs: Any) -> str | None:
    """The name of the torch-backend kernel that the plan which just ran `op` on `inputs` (under `policy`,
    None: the one in force) launches and nothing else (no sync, no workspace); "" for any other plan,
    None when there is no plan to ask."""
    try:
        policy = handback.routed_view(policy or current_policy())
        plan = get_dispatcher().plan(op, *inputs, policy=policy, **attrs)
    except Exception:  # the call ran, so this is not expected; just learn nothing
        return None
    plain_launch = plan.kernel.backend == "torch" and plan.finish is None and not plan.workspace_bytes
    return plan.kernel.name if plain_launch else ""


def runs_pytorch_kernel(op: str, inputs: tuple, policy: Any = None) -> bool | None:
    """Whether the plan that just ran `op` on `inputs` runs PyTorch's own kernel and nothing else; None
    when there is no plan to ask (see `torch_kernel_ran`)."""
    name = torch_kernel_ran(op, inputs, policy)
    return None if name is None else name == PYTORCH_OWN_KERNELS.get(op)


def _warn_no_kernel(op: str, exc: NoKernelError, policy: Any) -> None:
    """One warning per op and preferred kernel when PyTorch's kernel runs instead of the policy's."""
    preferred = policy.preferences.get(op)
    if preferred is None or (op, preferred) in _warned_ops:
        return  # an op the policy does not name (e.g. a backward op) just keeps PyTorch's kernel
    _warned_ops.add((op, preferred))
    first = str(exc).splitlines()[0]
    warnings.warn(f"{first}; running PyTorch's kernel instead", KernelFallbackWarning, stacklevel=4)


_MAX_MEMO = 4096
_MISSING = object()


def memoized(key: Hashable, make: Callable[[], Any]) -> Any:
    """`make()`, made once per dispatcher and `key`: for values fixed by the op schemas (a registered op's
    schema never changes), such as attribute tuples and input orders."""
    value = router.memo.get(key, _MISSING)
    if value is _MISSING:
        value = make()
        if len(router.memo) >= _MAX_MEMO:
            router.memo.clear()
        router.memo[key] = value  # router.memo: `make` may have chosen the dispatcher (a new memo)
    return value


def has_op(op: str) -> bool:
    return op in get_dispatcher().registry.ops


def attrs_for(op: str, values: Mapping[str, Any]) -> tuple:
    """The op's attributes in schema order from `values`, defaults for the rest."""
    schema = get_dispatcher().registry.op(op)
    return tuple(values[name] if name in values else schema.defaults.get(name) for name in schema.attrs)


def inputs_for(op: str, values: Mapping[str, Any], aliases: Mapping[str, str]) -> tuple | None:
    """The op's inputs in schema order, found by name (through `aliases`, a module constant); None if a
    required one is missing."""
    inputs = []
    for name, required in memoized(("inputs", op, id(aliases)), lambda: input_names(op, aliases)):
        value = values.get(name)
        if value is None and required:
            return None
        inputs.append(value)
    return tuple(inputs)


def input_names(op: str, aliases: Mapping[str, str]) -> tuple[tuple[str, bool], ...]:
    """(name as the overrides supply it, required?) for each of the op's inputs, in schema order."""
    schema = get_dispatcher().registry.op(op)
    return tuple((aliases.get(name, name), name not in schema.optional) for name in schema.inputs)
