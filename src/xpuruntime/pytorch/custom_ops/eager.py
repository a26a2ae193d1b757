"""How the fused training ops run: as their custom op inside torch.compile, through one autograd.Function
otherwise.

A fused op (swiglu, rotary_embedding, linear_cross_entropy, ...: one file each beside this one) has a forward
and a backward custom op, each a thin wrapper around a *body* that dispatches the op through the selector
(or runs PyTorch's formula where no kernel of ours can take the call). The op is described once by an `OpGlue`:
its forward custom op and body, and the `setup_context` / `backward` functions it registers with
`register_autograd`. `run(glue, args, pinned)` then

- calls the custom op while a graph is traced (torch.compile, export, a tracing mode), so the graph holds it
  and its registered autograd puts the backward op into the backward graph;
- otherwise applies `EagerFunction`, which calls the same bodies directly: the custom-op machinery costs about
  four times an autograd.Function's host time per call, and an eager training step makes dozens of calls. A
  body that only launches Triton kernels is replayed from its recorded launches from a signature's third
  call on (`replay`): the step is host-bound, and a replay costs a fraction of the body's Python.

Both paths compute alike: the `backward` functions learn from `ctx.eager` whether to call the backward body
(eager) or the backward custom op (compiled), and bodies run with grad mode and autocast off either way
(inside a custom op PyTorch switches them off; `EagerFunction` does so itself). The last input of every
custom op is the pinned policy's key (`router.Pinned`); eager calls carry the policy itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from ...policy import current_policy
from ..router import IN_FORCE, Pinned, pinned_policy
from ..state import STATE
from .common import autograd_enabled, eager_origin, graph_origin, plain
from .replay import call as run_body


class OpGlue(NamedTuple):
    """One fused op as the two paths run it (see the module docstring)."""

    custom_op: Callable[..., Any]  # the forward custom op: (*args, policy key)
    forward: Callable[..., Any]  # its body: (*args, policy) -> the op's output(s)
    setup: Callable[[Any, tuple, Any], None]  # setup_context(ctx, (*args, policy or key), output)
    backward: Callable[..., tuple]  # backward(ctx, *output grads) -> a gradient or None per input, key included
    no_grad_outputs: tuple[int, ...] = ()  # outputs that carry no gradient (their grads arrive as None)


def run(glue: OpGlue, args: tuple, pinned: Pinned = IN_FORCE) -> Any:
    """The op's output(s) for `args` under the pinned policy, by the path that fits (module docstring)."""
    if torch.compiler.is_compiling() or not plain(*(a for a in args if isinstance(a, torch.Tensor))):
        return glue.custom_op(*args, pinned.key)
    return _apply(glue, pinned, *args)


class EagerFunction(torch.autograd.Function):
    """A fused op's forward and backward bodies under autograd, without the custom-op machinery."""

    @staticmethod
    def forward(ctx: Any, glue: OpGlue, pinned: Pinned, *args: Any) -> Any:
        policy = pinned.policy or current_policy()  # the backward dispatches under the forward's policy
        with eager_origin(), torch._C._DisableAutocast(), EAGER_BODY:  # autocast off as inside a custom op
            out = run_body(glue.forward, args, pinned_policy(policy))
        ctx.eager, ctx.glue = True, glue
        glue.setup(ctx, (*args, policy), out)
        if glue.no_grad_outputs:
            ctx.mark_non_differentiable(*(out[i] for i in glue.no_grad_outputs if out[i] is not None))
        return out

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> tuple:
        if torch.is_grad_enabled():
            raise RuntimeError("xpuruntime's fused ops are differentiable once: create_graph=True is not supported")
        with eager_origin(), torch._C._DisableAutocast(), EAGER_BODY:
            return (None, None, *ctx.glue.backward(ctx, *grads)[:-1])


# autograd.Function.apply without its Python wrapper, which binds default arguments and unwraps dead functorch
# wrappers per argument (4-5 us a call): `plain` above has made sure that no functorch transform is active.
_apply = super(torch.autograd.Function, EagerFunction).apply


class _EagerBody:
    """Marks this thread as running a fused op's body eagerly (`router.dispatch` then lends workspaces as for
    any eager call, instead of a compiled graph's fresh ones); a class, not a generator: 0.2 us per use."""

    def __enter__(self) -> None:
        STATE.threads.eager_bodies += 1

    def __exit__(self, *exc: Any) -> None:
        STATE.threads.eager_bodies -= 1


EAGER_BODY = _EagerBody()


def backward_call(ctx: Any, body: Callable[..., Any], custom_op: Callable[..., Any], *args: Any) -> Any:
    """In a `backward`: the backward body (eager) or the backward custom op (compiled) on `args`."""
    if getattr(ctx, "eager", False):
        return run_body(body, args, pinned_policy(ctx.policy))
    return custom_op(*args, ctx.policy)


@contextlib.contextmanager
def custom_op_body() -> Any:
    """Around a custom op's body: its dispatches logged as a compiled graph's (unless the caller said where
    they come from), grad mode off and autograd available to fallbacks (see `common.autograd_enabled`)."""
    with graph_origin(), torch.no_grad(), autograd_enabled():
        yield
