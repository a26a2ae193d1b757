"""Helpers shared by the custom ops and the routes that carry their own autograd (attention, norms)."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from ... import log
from ...abi import TensorSpec
from ...arguments import freeze
from ...context import build_context
from ...policy import current_policy
from ...runtime.traced import NotTraceable
from ..state import STATE

PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)

# names a backward op may give its inputs, mapped to the ones the overrides supply
GRAD_ALIASES = {
    "do": "dout", "dy": "dout", "dO": "dout", "grad": "dout", "grad_out": "dout", "grad_output": "dout",
    "o": "out", "output": "out", "y": "out",
    "logsumexp": "lse", "softmax_lse": "lse", "m": "lse",
    "input": "x", "query": "q", "key": "k", "value": "v", "mask": "attn_mask",
    "invstd": "rstd", "inv_std": "rstd",
}  # fmt: skip


def plain(*tensors: Any) -> bool:
    """Real tensors outside any tracing mode or torch.func transform: FakeTensors, subclasses and
    functorch-wrapped tensors keep PyTorch's path."""
    if torch._C._len_torch_dispatch_stack() or torch._C._functorch.peek_interpreter_stack() is not None:
        return False
    return all(t is None or type(t) in PLAIN_TENSORS for t in tensors)


def traced(*tensors: Any) -> bool:
    """Being traced into a graph (torch.compile's fake tensors, AOTAutograd's functional tensors, a tracing
    dispatch mode), outside any torch.func transform: where a route emits our custom op."""
    if torch._C._functorch.peek_interpreter_stack() is not None:
        return False
    if torch._C._len_torch_dispatch_stack():
        return True
    return any(t is not None and type(t) not in PLAIN_TENSORS and isinstance(t, torch.Tensor) for t in tensors)


def detached(args: tuple) -> tuple:
    """The tensors of `args` detached (as a custom op's body sees them: kernels may view them as arrays)."""
    return tuple(a.detach() if isinstance(a, torch.Tensor) and a.requires_grad else a for a in args)


def accumulation_dtype(x: torch.Tensor) -> torch.dtype:
    """float64 for float64 inputs, else float32: the dtype of attention's logsumexp and of the fallback math
    (as `ops.attention_forward.lse_dtype`), so float64 gradients keep float64 precision."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def lse_buffer(q: torch.Tensor) -> torch.Tensor:
    """attention_forward's logsumexp buffer for query `q`: shape (*batch, L)."""
    return q.new_empty((*q.shape[:-2], q.shape[-2]), dtype=accumulation_dtype(q))


def any_requires_grad(*tensors: Any) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def grad_leaves(*tensors: Any) -> list:
    """Tensors to differentiate a PyTorch recomputation by in a backward: detached copies, or under
    create_graph (grad mode on in the backward) the inputs themselves, so the gradients stay differentiable."""
    create = torch.is_grad_enabled()
    return [None if t is None else t if create and t.requires_grad else t.detach().requires_grad_() for t in tensors]


def native_layer_norm_stats(x: Any, normalized_shape: tuple, weight: Any, bias: Any, eps: float) -> tuple:
    """(mean, rstd) as native_layer_norm makes them, whose dtype its backward requires (it depends on
    the device and the dtypes: bfloat16 on CPU, float32 on CUDA, float64 for float64 inputs)."""
    with torch.no_grad():
        return tuple(torch.ops.aten.native_layer_norm.default(x, list(normalized_shape), weight, bias, eps)[1:])


def unpack_norm_grads(result: Any, x: torch.Tensor, normalized_shape: tuple, params: int) -> list:
    """[dx, dweight, (dbias)] from a norm backward op: a tuple, or rows packed as [dx rows; dweight; dbias]."""
    if isinstance(result, list | tuple):
        return [*result, None, None][: 1 + params]
    n = 1
    for d in normalized_shape:
        n *= d
    rows = x.numel() // n if n else 0
    if result.dim() == 2 and result.shape[0] == rows + params:
        tail = result[rows:]  # the parameter rows: one unbind (plus a view for a multi-dim normalized_shape)
        if len(normalized_shape) != 1:
            tail = tail.view(params, *normalized_shape)
        return [result[:rows].view(x.shape), *tail.unbind(0)]
    return [result, *([None] * params)]


def unaliased(tensors: tuple) -> tuple:
    """Custom-op outputs must not share memory: gradients packed in one buffer (views of it, or tensors over
    parts of one NumPy array) are copied apart; a tensor that owns all of its memory is passed on. In a body
    traced into a graph (`inline`), functionalization keeps views apart: outputs only need the fake's layout."""
    if STATE.threads.inlining:
        return tuple(t.contiguous() for t in tensors)
    return tuple(t if _owns_its_memory(t) else t.clone(memory_format=torch.contiguous_format) for t in tensors)


def compact(t: torch.Tensor | None) -> torch.Tensor | None:
    """A parameter's gradient as a tensor of its own memory. A norm backward op packs its gradients as rows
    [dx; dweight; dbias] of one buffer: a dweight row handed to autograd as it is becomes the parameter's .grad
    and keeps the whole (rows x N) buffer alive between steps (17 x 32 MiB in the bench's Llama step)."""
    if t is None or _owns_its_memory(t):
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _owns_its_memory(t: torch.Tensor) -> bool:
    if t._base is not None or t.storage_offset() != 0 or not t.is_contiguous():
        return False
    return t.untyped_storage().nbytes() == t.numel() * t.element_size()


def by_autograd(formula: Any, inputs: tuple, grad_outputs: Any) -> tuple:
    """Gradients of `formula(*inputs)` (an output or a tuple of them) for `grad_outputs` (one per output, None
    for an output without one) by autograd: a fallback's backward where no kernel of ours runs. One gradient
    per input, None for an input that is not a floating tensor. Inside a custom op's body, call it under
    `autograd_enabled()`. Not in a body traced into a graph: that body stays opaque (`inline`)."""
    if STATE.threads.inlining:
        raise NotTraceable("a backward that differentiates PyTorch's formula")
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_() if _floating(t) else t for t in inputs]
        outputs = formula(*leaves)
        if not isinstance(outputs, tuple):
            outputs, grad_outputs = (outputs,), (grad_outputs,)
        pairs = [(o, g) for o, g in zip(outputs, grad_outputs) if g is not None]
        wanted = [t for t in leaves if _floating(t)]
        found = torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True)
        grads = iter(found)
        return tuple(next(grads) if _floating(t) else None for t in leaves)


def _floating(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point()


def pytorch_ran(op: str, *tensors: Any) -> None:
    """Log that PyTorch's code ran `op` because no kernel of ours could take the call (kernel "torch", reason
    "fallback"), if the dispatch log is on; in a body traced into a graph, `router.traced_dispatch` logged it."""
    if log.OBSERVERS and not STATE.threads.inlining:
        present = [t for t in tensors if isinstance(t, torch.Tensor)]
        dtype = str(present[0].dtype).removeprefix("torch.") if present else ""
        shapes = tuple(tuple(t.shape) for t in present)
        log.log_record(op, "torch", "torch", "fallback", shapes, dtype, log.current_origin() or "eager")


def or_empty(t: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """Custom ops return tensors only: an absent gradient travels as an empty tensor."""
    return like.new_empty((0,)) if t is None else t


def autocast_cast(*tensors: Any, device_type: str) -> tuple:
    """As PyTorch's autocast casts an op's inputs to the lower precision: floating tensors other than
    float64 take the autocast dtype (a no-op outside autocast)."""
    if not torch.is_autocast_enabled(device_type):
        return tensors
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(
        t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64 else t
        for t in tensors
    )


def autograd_enabled() -> contextlib.AbstractContextManager:
    """Inside a custom op's body PyTorch excludes the autograd dispatch keys, so operations there record no
    graph even under torch.enable_grad(). This block includes them again, for kernels and fallbacks that
    differentiate a PyTorch formula with torch.autograd.grad (on detached leaves, under enable_grad)."""
    exclude = torch._C._dispatch_tls_local_exclude_set()
    if not exclude.has(torch._C.DispatchKey.AutogradFunctionality):
        return contextlib.nullcontext()
    include = torch._C._dispatch_tls_local_include_set()
    return torch._C._ForceDispatchKeyGuard(include, exclude.remove(torch._C.DispatchKey.AutogradFunctionality))


def autocast_float32(*tensors: Any) -> tuple:
    """As PyTorch's CUDA autocast runs its float32 ops (layer_norm among them): float16 / bfloat16 tensors cast
    to float32 (a no-op outside CUDA autocast; CPU autocast runs these ops in their inputs' dtypes)."""
    device = next((t.device.type for t in tensors if isinstance(t, torch.Tensor)), "cpu")
    if device != "cuda" or not torch.is_autocast_enabled(device):
        return tensors
    half = (torch.float16, torch.bfloat16)
    return tuple(t.float() if isinstance(t, torch.Tensor) and t.dtype in half else t for t in tensors)


def graph_origin() -> contextlib.AbstractContextManager:
    """Inside a custom op's body: record its dispatches as made by a compiled graph ("graph"), unless the
    caller said where they come from (an eager public function sets "eager"). Free while nobody logs."""
    if log.OBSERVERS and log.current_origin() is None:
        return log.dispatch_origin("graph")
    return contextlib.nullcontext()


def eager_origin() -> contextlib.AbstractContextManager:
    """Around an eager public function's call of a custom op: its dispatches are "eager"."""
    return log.dispatch_origin("eager") if log.OBSERVERS else contextlib.nullcontext()


def check_call(op: str, inputs: tuple, attrs: tuple) -> None:
    """Raise the op's own error (an XpuRuntimeError naming the argument and what was expected) for a call its
    schema rejects, without running it: the check of a public function's arguments."""
    from ..router import get_dispatcher

    schema = get_dispatcher().registry.op(op)
    specs = tuple(_spec(t) if isinstance(t, torch.Tensor) else t for t in inputs)
    build_context(schema, specs, freeze(attrs), None, current_policy())


def _spec(t: torch.Tensor) -> TensorSpec:
    return TensorSpec(tuple(t.shape), str(t.dtype).removeprefix("torch."), tuple(t.stride()), str(t.device))
