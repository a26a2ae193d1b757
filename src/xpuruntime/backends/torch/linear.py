"""linear and its backward ops through PyTorch: cuBLAS GEMMs, bias and activation by PyTorch's kernels.

With a bias and an activation it uses `torch._addmm_activation` on CUDA tensors (cuBLASLt's
RELU/GELU bias epilogue inside PyTorch where PyTorch supports it, else addmm + tanh GELU). Also
`autocast_linear` (F.linear under autocast): autocast's own casts, or `fused_cast`'s single node.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ...abi import ArgPack
from ...context import DispatchContext
from ...registry import kernel
from ...runtime import extension
from .common import GPU_FLOAT_DTYPES, autocast_linear, returned, rows

_ADDMM_ACTIVATION = getattr(torch, "_addmm_activation", None)


def _activate_(z: torch.Tensor, activation: str | None) -> torch.Tensor:
    if activation == "relu":
        return z.relu_()
    if activation == "gelu":
        return z.copy_(F.gelu(z, approximate="tanh"))
    return z


@kernel("linear", "torch", backend="torch", dtypes=GPU_FLOAT_DTYPES, priority=20, tensor_cores=True)
def linear_torch(args: ArgPack) -> None:
    """addmm / _addmm_activation into the output; F.linear then the activation otherwise."""
    x, weight, bias = args.inputs
    out, activation = args.out, args.attrs["activation"]
    at = args.attrs
    if out.is_contiguous() and bias is not None and min(at["m"], at["n"], at["k"]) > 0:
        out2 = out.view(at["m"], at["n"])
        if activation is None:
            torch.addmm(bias, rows(x), weight.t(), out=out2)
            return
        if _ADDMM_ACTIVATION is not None and x.is_cuda:  # CUDA's is tanh-GELU (cuBLASLt epilogue); CPU's is erf
            _ADDMM_ACTIVATION(bias, rows(x), weight.t(), use_gelu=activation == "gelu", out=out2)
            return
    out.copy_(_activate_(F.linear(x, weight, bias), activation))


def _activation_backward(grad: torch.Tensor, preact: torch.Tensor, activation: str | None) -> torch.Tensor:
    if activation == "relu":
        return torch.ops.aten.threshold_backward(grad, preact, 0)
    if activation == "gelu":
        return torch.ops.aten.gelu_backward(grad, preact, approximate="tanh")
    return grad


@kernel("linear_grad_input", "torch", backend="torch", dtypes=GPU_FLOAT_DTYPES, priority=20, tensor_cores=True)
def linear_grad_input_torch(args: ArgPack) -> None:
    """dy @ W (cuBLAS), then PyTorch's activation backward against preact; a 1-D dy through a copy (PyTorch
    resizes `out` of a vector @ matrix product instead of writing it)."""
    dy, weight, preact = args.inputs
    activation = args.attrs["activation"]
    if activation is None and dy.dim() > 1:
        torch.matmul(dy, weight, out=args.out)
    else:
        args.out.copy_(_activation_backward(torch.matmul(dy, weight), preact, activation))


@kernel("linear_grad_weight", "torch", backend="torch", dtypes=GPU_FLOAT_DTYPES, priority=20, tensor_cores=True)
def linear_grad_weight_torch(args: ArgPack) -> None:
    """dy^T @ x (cuBLAS) and, for bias=True, the column sums of dy packed after it."""
    dy, x = args.inputs
    dy2, n, k = rows(dy), args.attrs["n"], args.attrs["k"]
    if not args.attrs["bias"]:
        torch.mm(dy2.t(), rows(x), out=args.out)
        return
    torch.mm(dy2.t(), rows(x), out=args.out[: n * k].view(n, k))
    torch.sum(dy2, dim=0, out=args.out[n * k :])


# -- autocast_linear: nn.Linear under autocast ---------------------------------------------------------


@kernel(
    "autocast_linear", "torch", backend="torch", dtypes=GPU_FLOAT_DTYPES, priority=20, tensor_cores=True,
    returns_output=True,
)  # fmt: skip
def autocast_linear_torch(args: ArgPack) -> Any:
    """What autocast itself does: each input cast to `dtype`, then F.linear (autograd records each cast)."""
    return returned(args, autocast_linear(*args.inputs, getattr(torch, args.attrs["dtype"])))


def _check_fused_cast(ctx: DispatchContext) -> list[str]:
    if any(t.dtype == "float64" for t in ctx.tensors):
        return ["autocast leaves float64 inputs as they are; fused_cast casts every input to the autocast dtype"]
    if extension.load() is None:
        return [f"needs xpuruntime's C++ extension, which is not available ({extension.status()})"]
    return []


@kernel(
    "autocast_linear", "fused_cast", backend="torch", dtypes=GPU_FLOAT_DTYPES, priority=25, tensor_cores=True,
    returns_output=True, conditions=(_check_fused_cast,),
)  # fmt: skip
def autocast_linear_fused_cast(args: ArgPack) -> Any:
    """One autograd node (C++): the forward casts as autocast does; the backward writes each gradient in
    its input's dtype straight from the GEMM, with no cast kernels (3 backward kernels instead of 5-6)."""
    x, weight, bias = args.inputs
    dtype = getattr(torch, args.attrs["dtype"])
    return returned(args, torch.ops.xpuruntime_native.fused_cast_linear(x, weight, bias, dtype))
