"""How a routed call reaches the xpuruntime dispatcher, and when it goes back to PyTorch.

A route hands a call to the dispatcher only when the policy in force here steers the op. A call the
op cannot describe (a dtype mix, a shape outside its semantics) or that no registered kernel can run
goes back to PyTorch's kernel; strict policies still raise. Calls made while the dispatcher is
already running a kernel (a `torch_*` kernel calling back into aten) go to PyTorch directly.

Also here: a policy extended to its ops' companions (`family_policy`, see `families`), policies pinned to
some calls (`pin`: what `patch(model, policy=...)` gives its modules), and the values the routes derive once
from the op schemas (`memoized`, `attrs_for`, `inputs_for`).
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Any, NamedTuple

from .. import arguments, log
from .. import policy as core_policy
from ..abi import ArgPack, TensorSpec
from ..context import build_context
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
from ..policy import AUTOTUNE, KernelPolicy, current_policy
from ..runtime.traced import NotTraceable, recording
from . import native, tuner
from .families import FAMILIES, FRONT_END_OPS, all_preferences, rebuilt
from .state import STATE

NOT_OURS = (ArgumentError, DeviceMismatchError, DTypeError, LayoutError, ShapeError)
_router = STATE.router
_MAX_CACHED = 1024


def use_dispatcher(dispatcher: Any = None) -> None:
    """Route through `dispatcher` (None: the process-wide one, made on first use)."""
    _router.dispatcher = dispatcher
    _router.run = None if dispatcher is None else dispatcher.run
    _router.memo = {}
    if dispatcher is not None:
        native.watch_registry(dispatcher.registry)
    native.reset()  # decisions made with the previous dispatcher


def get_dispatcher() -> Any:
    if _router.dispatcher is None:
        use_dispatcher(default_dispatcher())
    return _router.dispatcher


# -- which ops a policy steers ------------------------------------------------------------------------


def routed_ops(policy: Any) -> frozenset[str]:
    """The ops a policy asks to steer: those it names a kernel for or autotunes (with their companions),
    minus those autotune handed back to PyTorch (see `tuner`)."""
    ops = _router.routed.get(policy.fingerprint)
    if ops is None:
        names = set(policy.preferences) | set(getattr(policy, "autotune_ops", ()))
        names.update(*(FAMILIES.get(op, ()) for op in list(names)))
        if getattr(policy, "autotune", False):
            names |= FRONT_END_OPS
        returned = STATE.tuner.returned
        if returned:
            names -= returned.get(tuner.steering(policy), frozenset())
        if len(_router.routed) > _MAX_CACHED:
            _router.routed.clear()
        ops = _router.routed[policy.fingerprint] = frozenset(names)
    return ops


def nested() -> bool:
    """True while a kernel the dispatcher chose runs on this thread: its framework calls go to the framework."""
    return LAUNCHING.depth > 0


def wants(op: str) -> bool:
    """True when this thread's policy steers `op` and no kernel the dispatcher chose is running here."""
    return not nested() and op in routed_ops(current_policy())


def family_policy(policy: KernelPolicy) -> KernelPolicy:
    """`policy` with each named op's kernel name extended to its companions (cached per policy)."""
    registry = get_dispatcher().registry
    key = (policy.fingerprint, id(registry), registry.generation)
    derived = _router.family.get(key)
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
        if len(_router.family) > _MAX_CACHED:
            _router.family.clear()
        _router.family[key] = derived
    return derived


class Pinned(NamedTuple):
    """A policy pinned to some calls, whatever policy is in force where they run (`patch(model, policy=...)`):
    the policy (None: the one in force at each call) and `key`, what a compiled graph's custom op carries
    for it (the policy's JSON; "" for None)."""

    policy: KernelPolicy | None
    key: str


IN_FORCE = Pinned(None, "")


def pin(policy: KernelPolicy | None) -> Pinned:
    """`policy` pinned (None: the policy in force at each call)."""
    if policy is None:
        return IN_FORCE
    key = json.dumps(policy.to_dict(), sort_keys=True)
    if len(_router.pinned) > _MAX_CACHED:
        _router.pinned.clear()
    _router.pinned[key] = policy
    return Pinned(policy, key)


def pinned_policy(pinned: KernelPolicy | str | None) -> KernelPolicy:
    """The family-extended policy a call pinned to `pinned` dispatches under: a policy, a `Pinned.key` (a
    compiled graph's; read back from its JSON in a process that never pinned it), or None / "" for the
    policy in force."""
    if not pinned:
        policy = current_policy()
    elif isinstance(pinned, str):
        policy = _router.pinned.get(pinned)
        if policy is None:
            policy = _router.pinned[pinned] = KernelPolicy.from_dict(json.loads(pinned), "a pinned policy", False)
    else:
        policy = pinned
    return family_policy(policy)


def without(policy: KernelPolicy, ops: tuple[str, ...], user: KernelPolicy) -> KernelPolicy:
    """`policy` minus the companion preferences it added for `ops` (the user's own names stay)."""
    added = [op for op in ops if op in policy.preferences and op not in user.preferences]
    if not added:
        return policy
    return rebuilt(policy, {op: k for op, k in all_preferences(policy).items() if op not in added})


@contextlib.contextmanager
def using(policy: KernelPolicy) -> Iterator[None]:
    """Run the block under `policy` (no scope is entered when it is already the one in force)."""
    if policy is current_policy():
        yield
        return
    with core_policy.kernel_policy(policy):
        yield


# -- the routing compiled graphs depend on ------------------------------------------------------------


def routing_token() -> tuple:
    """What graphs compiled here depend on: each op the policy in force steers with the kernel it names
    (or "autotune"), and strictness. Dynamo's guard compares it on every call of a compiled frame."""
    policy = current_policy()
    routed = routed_ops(policy)
    key = (policy.fingerprint, routed)
    token = STATE.tracing.tokens.get(key)
    if token is None:
        prefs = all_preferences(policy)
        default = AUTOTUNE if policy.autotune else ""
        token = (tuple(sorted((op, prefs.get(op, default)) for op in routed)), policy.strict)
        if len(STATE.tracing.tokens) > 1024:
            STATE.tracing.tokens.clear()
        STATE.tracing.tokens[key] = token
    return token


def guard_routing() -> None:
    """Inside Dynamo's compilation of a frame: make the compiled code valid only under today's routing."""
    import torch

    if not torch.compiler.is_compiling():
        return
    try:
        from torch._dynamo.guards import GuardBuilder, install_guard
        from torch._dynamo.source import AttrSource, CallFunctionNoArgsSource, ImportSource
        from torch._guards import TracingContext
    except ImportError:  # a PyTorch without these: graphs are not guarded (see `compiled_decisions`)
        return
    context = TracingContext.try_get()
    if context is None or getattr(context.guards_context, "skip_install", False):
        return
    package, *path = __name__.split(".")  # __import__('xpuruntime') then attributes: xpuruntime.pytorch.router
    source = ImportSource(package)
    for name in (*path, "routing_token"):
        source = AttrSource(source, name)
    source = CallFunctionNoArgsSource(source)
    install_guard(source.make_guard(GuardBuilder.EQUALS_MATCH))


# -- dispatching --------------------------------------------------------------------------------------


def dispatch(
    op: str, inputs: tuple, attrs: tuple = (), warn: bool = True, policy: Any = None, routed: bool = True
) -> Any:
    """Run `op` through the dispatcher under `policy` (None: the one in force); None means 'let PyTorch
    run it' (see the module docstring). warn=False: the caller has another route to try, whose own
    fallback warns. routed=False: a compiled graph's call, which costs none of a route's host time (autotune
    weighs the routing cost for routed calls only, see `tuner.routed_view`) and keeps no workspace past
    its return (`WorkspaceManager.per_call`: inductor's CUDA graph pools must hold the graph's tensors only),
    unless it is a fused op's body run eagerly (`custom_ops.eager`), which lends workspaces as routed calls do."""
    if STATE.threads.inlining:  # a fused op's body traced into a graph (custom_ops.inline)
        return traced_dispatch(op, inputs, attrs, policy or current_policy())
    run = _router.run or get_dispatcher().run
    if STATE.tuner.families:
        tuner.note_call(op)
    policy = policy or current_policy()
    try:
        if routed:
            return run(op, inputs, attrs, None, tuner.routed_view(policy))
        if STATE.threads.eager_bodies:  # a fused op run eagerly (custom_ops.eager): no graph pool to keep clean
            return run(op, inputs, attrs, None, policy)
        with get_dispatcher().workspaces.per_call():  # a graph's scratch lives for the call only (CUDA graph pools)
            return run(op, inputs, attrs, None, policy)
    except NOT_OURS:
        return None
    except UnsupportedByPolicyError:
        raise
    except NoKernelError as exc:
        if warn:
            warn_no_kernel(op, str(exc).splitlines()[0], policy)
        return None


def traced_dispatch(op: str, inputs: tuple, attrs: tuple, policy: KernelPolicy) -> Any:
    """`dispatch` while a fused op's body is traced into a graph: the kernel is chosen now, once for this
    signature, and its launch is traced (its Triton kernels become graph nodes that inductor launches from its
    own code). None: the body traces PyTorch's formula instead, for inductor to fuse: no kernel of ours takes
    the call, or the policy names none for it (`_left_to_inductor`). Raises NotTraceable for symbolic shapes and
    kernels that are not `traceable`; the decision is logged (origin "compile") and kept for
    `compiled_decisions()`. An op under autotune stays opaque and is tuned at run time, as the route decided.
    """
    import torch

    from ..explanation import Explanation

    specs = tensor_specs(inputs)
    if specs is None:
        raise NotTraceable("symbolic shapes: decided at run time per concrete signature")
    dispatcher = get_dispatcher()
    try:
        ctx = build_context(dispatcher.registry.op(op), specs, attrs, None, policy)
        decision = dispatcher.selector.select(ctx, policy)
    except NOT_OURS:
        return _left_to_inductor(op, specs, "fallback")
    except NoKernelError as exc:
        warn_no_kernel(op, str(exc).splitlines()[0], policy, "tracing PyTorch's code for inductor instead")
        return _left_to_inductor(op, specs, "fallback")
    kernel = decision.kernel
    if decision.reason == "fallback":
        warn_no_kernel(op, decision.preferred_refusal(), policy, "tracing PyTorch's code for inductor instead")
    if decision.reason == "auto" and policy.tunes(op):  # the route chose our op by timing it: tuned at run time
        raise NotTraceable("autotune times the candidates per signature at run time")
    if decision.reason != "policy":  # see `_left_to_inductor`
        return _left_to_inductor(op, specs, decision.reason)
    if not kernel.traceable:
        raise NotTraceable(f"{kernel.qualified_name} cannot be traced into a graph")
    plan = dispatcher.make_plan(decision, policy)
    remember_compiled(Explanation(ctx, policy, list(decision.candidates), decision, None, origin="compile"))
    log.log_decision(plan, "compile")
    out = None
    if not plan.returns_output:
        out = torch.empty(ctx.out_shape, dtype=getattr(torch, ctx.out_dtype), device=ctx.device)
    workspace = None
    if plan.workspace_bytes:
        workspace = torch.empty(plan.workspace_bytes, dtype=torch.uint8, device=ctx.device)
    with recording():
        returned = plan.launch(ArgPack(inputs, out, plan.attrs, plan.config, workspace, None))
    return returned if out is None else out


def _left_to_inductor(op: str, specs: tuple, reason: str) -> None:
    """None, logged as kernel "inductor": the traced body falls back to PyTorch's formula, which inductor fuses
    with its neighbours. Also where the policy names no kernel for the op ("auto"): on a Llama training step,
    inductor's code for the norms, SwiGLU and the rotary embedding measured faster than our kernels traced in
    their place (BENCHMARKS.md, patched_auto+compile against patched+compile)."""
    if log.OBSERVERS:
        tensors = [s for s in specs if isinstance(s, TensorSpec)]
        shapes = tuple(t.shape for t in tensors)
        log.log_record(op, "inductor", "torch", reason, shapes, tensors[0].dtype if tensors else "", "compile")
    return None


def tensor_specs(args: tuple) -> tuple | None:
    """TensorSpecs of traced tensors (other arguments as they are), or None when a shape or stride is symbolic
    (never made concrete here: that would specialize the graph on it)."""
    import torch

    specs = []
    for t in args:
        if not isinstance(t, torch.Tensor):
            specs.append(t)
            continue
        dims = (*t.shape, *t.stride())
        if any(isinstance(n, torch.SymInt) for n in dims):
            return None
        specs.append(TensorSpec(tuple(t.shape), str(t.dtype).removeprefix("torch."), tuple(t.stride()), str(t.device)))
    return tuple(specs)


def remember_compiled(explanation: Any) -> None:
    """Keep a compile-time decision (an Explanation, origin "compile") for `tracing.compiled_decisions()`."""
    found = STATE.tracing.explanations
    if len(found) >= MAX_COMPILED_DECISIONS:
        del found[0]
    found.append(explanation)


MAX_COMPILED_DECISIONS = 256


def fell_back(op: str, inputs: tuple, attrs: tuple, policy: KernelPolicy) -> bool:
    """Whether the cached plan of an earlier call chose a fallback (its preferred kernel could not run).
    No plan key is built unless some plan of `op` under `policy` fell back (rare)."""
    dispatcher = get_dispatcher()
    policy = tuner.routed_view(policy)  # the policy the forward was dispatched under
    if (op, policy.fingerprint) not in dispatcher.fallbacks:
        return False
    try:
        plan = dispatcher.plans.get(arguments.plan_key(op, policy.fingerprint, attrs, inputs, None))
    except Exception:  # an argument the fast key cannot describe: no cached plan to ask
        return False
    return plan is not None and plan.reason == "fallback"


# kernels whose launch for the routes' calls (mm, bmm; addmm as linear with a bias and no activation)
# is exactly the aten op's own kernel
PYTORCH_OWN_KERNELS = {"matmul": "torch", "linear": "torch"}


def torch_kernel_ran(op: str, inputs: tuple, policy: Any = None, **attrs: Any) -> str | None:
    """The name of the torch-backend kernel that the plan which just ran `op` on `inputs` (under `policy`,
    None: the one in force) launches and nothing else (no sync, no workspace); "" for any other plan,
    None when there is no plan to ask."""
    try:
        policy = tuner.routed_view(policy or current_policy())
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


def warn_no_kernel(op: str, why: str, policy: Any, where: str = "running PyTorch's kernel instead") -> None:
    """One warning per op and preferred kernel when PyTorch's kernel runs instead of the policy's."""
    preferred = policy.preferences.get(op)
    if preferred is not None:  # an op the policy does not name (e.g. a backward op) just keeps PyTorch's kernel
        warn_once(_router.warned, (op, preferred), f"{why}; {where}", stacklevel=4)


def warn_once(warned: set, key: Hashable, message: str, stacklevel: int = 1) -> None:
    """A KernelFallbackWarning once per key of `warned` (a set that is emptied past _MAX_CACHED keys);
    `stacklevel` counts from the caller, as for warnings.warn."""
    if key in warned:
        return
    if len(warned) > _MAX_CACHED:
        warned.clear()
    warned.add(key)
    warnings.warn(message, KernelFallbackWarning, stacklevel=stacklevel + 1)


# -- values fixed by the op schemas ---------------------------------------------------------------------

_MAX_MEMO = 4096
_MISSING = object()


def memoized(key: Hashable, make: Callable[[], Any]) -> Any:
    """`make()`, made once per dispatcher and `key`: for values fixed by the op schemas (a registered op's
    schema never changes), such as attribute tuples and input orders."""
    value = _router.memo.get(key, _MISSING)
    if value is _MISSING:
        value = make()
        if len(_router.memo) >= _MAX_MEMO:
            _router.memo.clear()
        _router.memo[key] = value  # _router.memo: `make` may have chosen the dispatcher (a new memo)
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
    """(name as the routes supply it, required?) for each of the op's inputs, in schema order."""
    schema = get_dispatcher().registry.op(op)
    return tuple((aliases.get(name, name), name not in schema.optional) for name in schema.inputs)
