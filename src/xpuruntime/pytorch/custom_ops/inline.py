"""Fused ops whose kernels torch.compile sees: each op's body is traced into the graph where it can be.

A fused op's custom op (`fused_custom_op`) is opaque to Dynamo, as every custom op is: Dynamo's graph holds
one `xpuruntime::...` node and learns its outputs from the fake kernel. When AOTAutograd then functionalizes
that graph (before inductor), the op is *decomposed*: its body runs on the tracer's tensors with
`STATE.threads.inlining` set, so `router.dispatch` chooses the kernel right there, once for the signature
(`router.traced_dispatch`: logged with origin "compile"), and traces it instead of running it. A Triton
kernel's launch becomes a `triton_kernel_wrapper` node (`torch.library.wrap_triton`, as `triton_op` does),
which inductor compiles and launches from the code it generates, with no Python of ours per call; a kernel
made of PyTorch operations, or PyTorch's formula where no kernel of ours takes the call, becomes those
operations, which inductor fuses with their neighbours. Where the policy names no kernel for the op, the body
traces PyTorch's formula (measured faster under inductor than our kernels traced in place, `router`).

A body stays one opaque node, dispatched at run time as before, where tracing it cannot be faithful
(`runtime.traced.NotTraceable`): symbolic shapes, an autotuned op, a kernel that is not `traceable` (one calling
a library or reading tensor data on the host), a backward fallback that differentiates a formula; also, with one
warning, a kernel whose tracing fails. Export keeps every custom op opaque (as PyTorch does for `triton_op`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.functional_tensor import FunctionalTensorMode

from ...errors import XpuRuntimeError
from ...runtime.traced import NotTraceable
from ..router import guard_routing, warn_once
from ..state import STATE


def fused_custom_op(name: str) -> Callable[[Callable[..., Any]], Any]:
    """`torch.library.custom_op(name, mutates_args=())` whose body is traced into graphs where it can be."""

    def define(body: Callable[..., Any]) -> Any:
        op = torch.library.custom_op(name, mutates_args=())(body)

        def decompose(mode: Any, overload: Any, types: Any, args: tuple, kwargs: dict) -> Any:
            if _export_in_progress() or not _tracer_tensors_only(types):
                return mode.__torch_dispatch__(overload, types, args, kwargs)
            traced = _trace(name, mode, body, args, kwargs)
            return mode.__torch_dispatch__(overload, types, args, kwargs) if traced is None else traced

        op.register_torch_dispatch(FunctionalTensorMode, decompose)
        return op

    return define


def _trace(name: str, mode: Any, body: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """The body traced under `mode`, or None where it must stay opaque. A kernel whose tracing fails for a reason
    of its own (not the policy's: those errors stand) leaves the op opaque with one warning, never a failed
    compilation: the op still runs, dispatched at run time."""
    guard_routing()  # the graph holds the kernel chosen now: a policy change must recompile it
    threads = STATE.threads
    threads.inlining += 1
    try:
        with mode:
            return body(*args, **kwargs)
    except NotTraceable:
        return None
    except XpuRuntimeError:
        raise
    except Exception as exc:
        why = f"{type(exc).__name__}: {str(exc)[:200]}"
        message = (f"{name}: its kernel could not be traced into the compiled graph ({why}); it runs as one op, "
                   "dispatched when the graph runs")  # fmt: skip
        warn_once(STATE.tracing.warned, (f"inline {name}", why), message)
        return None
    finally:
        threads.inlining -= 1


def _tracer_tensors_only(types: Any) -> bool:
    """As `triton_op`: decompose for plain, fake and functional tensors only (a subclass keeps the op)."""
    known = (torch.Tensor, torch._subclasses.functional_tensor.FunctionalTensor)
    return all(t in known or issubclass(t, torch._subclasses.FakeTensor) for t in types)


def _export_in_progress() -> bool:
    try:
        from torch.export._trace import custom_triton_ops_decomposition_disabled
    except ImportError:  # a PyTorch without it: export is not told apart
        return False
    return bool(custom_triton_ops_decomposition_disabled())


def inlining() -> bool:
    """Whether this thread is tracing a fused op's body into a graph."""
    return bool(STATE.threads.inlining)
