"""linear_cross_entropy and its backward as unfused PyTorch: the whole (rows, V) logits in the inputs'
dtype, upcast to fp32 (as Hugging Face's ForCausalLMLoss), the loss formula of ops/linear_cross_entropy.py
and autograd for the gradients. The baseline the fused kernels are weighed against (memory: the full logits
several times over). Targets outside [0, V) give NaN rows, as the op defines (gathering them would fault)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ...abi import ArgPack
from ...registry import kernel
from .common import GPU_FLOAT_DTYPES


def _row_losses(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: Any, at: Any) -> tuple:
    """(each row's loss in fp32, rows not ignored)."""
    z = F.linear(hidden, weight, bias).reshape(-1, at["vocab"])
    z = z.float() if z.dtype != torch.float64 else z
    t = target.reshape(-1)
    valid, in_range = t != at["ignore_index"], (t >= 0) & (t < at["vocab"])
    lse = torch.logsumexp(z, dim=-1)
    z_t = z.gather(1, torch.where(in_range, t, 0).long()[:, None])[:, 0]
    eps = at["label_smoothing"]
    loss = (1 - eps) * (lse - z_t) + eps * (lse - z.mean(dim=-1)) + at["z_loss_scale"] * lse * lse
    nan = torch.full((), float("nan"), dtype=loss.dtype, device=loss.device)
    return torch.where(valid, torch.where(in_range, loss, nan), torch.zeros_like(loss)), valid


def _loss(rows: torch.Tensor, valid: torch.Tensor, target: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "none":
        return rows.reshape(target.shape)
    return rows.sum() / valid.sum() if reduction == "mean" else rows.sum()


def loss_and_gradients(attrs: Any, hidden: Any, weight: Any, target: Any, bias: Any, grad_loss: Any,
                       buffers: tuple) -> torch.Tensor:  # fmt: skip
    """The loss (`attrs`: the op's, with `vocab`), and autograd's gradients (for grad_loss, 1 when None) into
    the buffers (grad_hidden, grad_weight, grad_bias) that are not None."""
    wanted = [t for t, b in zip((hidden, weight, bias), buffers) if b is not None]
    with torch.enable_grad():
        leaves = {id(t): t.detach().requires_grad_() for t in wanted}
        h, w, b = (leaves.get(id(t), t) if t is not None else None for t in (hidden, weight, bias))
        loss = _loss(*_row_losses(h, w, target, b, attrs), target, attrs["reduction"])
        if wanted:
            g = torch.ones_like(loss) if grad_loss is None else grad_loss.to(loss.dtype)
            grads = torch.autograd.grad(loss, [leaves[id(t)] for t in wanted], g)
            for buffer, grad in zip([b for b in buffers if b is not None], grads):
                buffer.copy_(grad)
    return loss.detach()


@kernel("linear_cross_entropy", "torch", backend="torch", dtypes=GPU_FLOAT_DTYPES, priority=20)
def linear_cross_entropy_torch(args: ArgPack) -> None:
    """F.linear, fp32 logits, the loss formula; autograd for the gradient buffers."""
    hidden, weight, target, bias, *buffers = args.inputs
    args.out.copy_(loss_and_gradients(args.attrs, hidden, weight, target, bias, None, tuple(buffers)))


@kernel("linear_cross_entropy_backward", "torch", backend="torch", dtypes=GPU_FLOAT_DTYPES, priority=20)
def linear_cross_entropy_backward_torch(args: ArgPack) -> None:
    """Autograd through the unfused forward for grad_loss."""
    grad_loss, hidden, weight, target, bias, grad_weight, grad_bias = args.inputs
    loss_and_gradients(args.attrs, hidden, weight, target, bias, grad_loss, (args.out, grad_weight, grad_bias))
