"""layer_norm and rms_norm through PyTorch's fused CUDA kernels; the Hugging Face forms of rms_norm and the
residual-add norms (add_rms_norm / add_layer_norm, forward and backward) as PyTorch's unfused formulas, the
way the modules they replace compute them."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ...abi import ArgPack
from ...registry import kernel
from .common import GPU_FLOAT_DTYPES, returned

# PyTorch operations only: traceable into compiled graphs, where inductor fuses them with their neighbours
_FORWARD: dict[str, Any] = dict(
    backend="torch", dtypes=GPU_FLOAT_DTYPES, priority=20, returns_output=True, traceable=True
)


@kernel("layer_norm", "torch", **_FORWARD)
def layer_norm_torch(args: ArgPack) -> Any:
    """F.layer_norm."""
    x, weight, bias = args.inputs
    at = args.attrs
    return returned(args, F.layer_norm(x, at["normalized_shape"], weight, bias, at["eps"]))


def rms_norm_formula(x: torch.Tensor, weight: torch.Tensor | None, at: Any) -> torch.Tensor:
    """rms_norm in the order ops/norm.py defines: F.rms_norm for the plain case, else the module's formula
    (LlamaRMSNorm's `weight * x_hat.to(dtype)` for casting="llama", Gemma's fp32 `x_hat * (offset + weight)`)."""
    shape, eps, offset = at["normalized_shape"], at["eps"], at["offset"]
    if at["casting"] == "torch" and not offset:
        return F.rms_norm(x, shape, weight, eps)
    dims = tuple(range(x.dim() - len(shape), x.dim()))
    xf = x.float() if x.dtype != torch.float64 else x
    x_hat = xf * torch.rsqrt(xf.square().mean(dims, keepdim=True) + eps)
    if weight is None:
        return x_hat.to(x.dtype)
    if at["casting"] == "llama":
        return (weight + offset) * x_hat.to(x.dtype) if offset else weight * x_hat.to(x.dtype)
    return (x_hat * (weight.to(xf.dtype) + offset)).to(x.dtype)


@kernel("rms_norm", "torch", **_FORWARD)
def rms_norm_torch(args: ArgPack) -> Any:
    """F.rms_norm, or the Hugging Face module's formula (casting="llama", offset)."""
    x, weight = args.inputs
    return returned(args, rms_norm_formula(x, weight, args.attrs))


@kernel("add_rms_norm", "torch", **_FORWARD)
def add_rms_norm_torch(args: ArgPack) -> Any:
    """h = x + residual (into residual_out), then rms_norm_formula(h): two passes over memory."""
    x, residual, weight, h = args.inputs
    torch.add(x, residual, out=h)
    return returned(args, rms_norm_formula(h, weight, args.attrs))


@kernel("add_layer_norm", "torch", **_FORWARD)
def add_layer_norm_torch(args: ArgPack) -> Any:
    """h = x + residual (into residual_out), then F.layer_norm(h)."""
    x, residual, weight, bias, h = args.inputs
    torch.add(x, residual, out=h)
    return returned(args, F.layer_norm(h, args.attrs["normalized_shape"], weight, bias, args.attrs["eps"]))


def write_packed(out: torch.Tensor, parts: list[torch.Tensor]) -> None:
    """torch.cat(parts) into `out` (directly when it is contiguous)."""
    if out.is_contiguous():
        torch.cat(parts, out=out)
    else:
        out.copy_(torch.cat(parts).view(out.shape))


def _autograd_norm_grads(args: ArgPack, forward: Any, with_bias: bool) -> None:
    """[dh + dx; dweight (; dbias)] into the packed output, by autograd through `forward(h, weight[, bias])`
    (a weight of ones and a bias of zeros where the call has none: their gradients are still returned)."""
    dy, dh, h, weight = args.inputs
    n = h.shape[-1]
    params = [weight if weight is not None else torch.ones(n, dtype=h.dtype, device=h.device)]
    if with_bias:
        params.append(torch.zeros(n, dtype=h.dtype, device=h.device))
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in (h, *params)]
        grads = torch.autograd.grad(forward(*leaves), leaves, dy)
    dx = grads[0].reshape(-1, n)
    if dh is not None:
        dx = dx + dh.reshape(-1, n)
    write_packed(args.out, [dx, *(g.reshape(1, n) for g in grads[1:])])


@kernel("add_rms_norm_backward", "torch", backend="torch", dtypes=GPU_FLOAT_DTYPES, priority=20)
def add_rms_norm_backward_torch(args: ArgPack) -> None:
    """Autograd through the forward formula (the residual's gradient dh added after)."""
    at = args.attrs
    _autograd_norm_grads(args, lambda h, w: rms_norm_formula(h, w, at), with_bias=False)


@kernel("add_layer_norm_backward", "torch", backend="torch", dtypes=GPU_FLOAT_DTYPES, priority=20)
def add_layer_norm_backward_torch(args: ArgPack) -> None:
    """Autograd through F.layer_norm (the residual's gradient dh added after)."""
    at = args.attrs
    _autograd_norm_grads(args, lambda h, w, b: F.layer_norm(h, at["normalized_shape"], w, b, at["eps"]), True)
