"""Helpers shared by the overrides that carry their own autograd Function (attention, norms)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from .. import policy as _core_policy
from ..policy import KernelPolicy, current_policy

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
    """Real tensors outside any tracing mode: FakeTensors and subclasses keep PyTorch's path."""
    if torch._C._len_torch_dispatch_stack():
        return False
    return all(t is None or type(t) in PLAIN_TENSORS for t in tensors)


def any_requires_grad(*tensors: Any) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


@contextlib.contextmanager
def policy_of_forward(policy: KernelPolicy) -> Iterator[None]:
    """Run a backward under the policy its forward saw (autograd may run it on another thread, after
    a scoped policy has ended)."""
    if policy is current_policy():
        yield
        return
    with _core_policy.kernel_policy(policy):
        yield


def as_tuple(result: Any) -> tuple:
    return tuple(result) if isinstance(result, list | tuple) else (result,)


def unpack_norm_grads(result: Any, x: torch.Tensor, normalized_shape: tuple, params: int) -> list:
    """[dx, dweight, (dbias)] from a norm backward op: a tuple, or rows packed as [dx rows; dweight; dbias]."""
    if isinstance(result, list | tuple):
        return [*result, None, None][: 1 + params]
    n = 1
    for d in normalized_shape:
        n *= d
    rows = x.numel() // n if n else 0
    if result.dim() == 2 and result.shape[0] == rows + params:
        return [result[:rows].view(x.shape), *(result[rows + i].view(normalized_shape) for i in range(params))]
    return [result, *([None] * params)]
