"""linear and its backward ops through cuBLASLt epilogues.

cuBLASLt applies a bias along the rows (M) of its column-major result, so every product here is
computed transposed, in place into the transposed view of the row-major output:
- forward   y^T  = W   x^T  (+ b, then ReLU/GELU): epilogues BIAS, RELU_BIAS, GELU_BIAS (RELU, GELU)
- grad in   dx^T = W^T dy^T (* gelu'(preact^T)):    epilogue DGELU, aux = preact^T
- grad W    dW^T = x^T dy   (+ column sums of dy):  epilogue BGRADB writes db right after dW
"""

from __future__ import annotations

import math

import torch

from ...abi import ArgPack, TensorSpec
from ...context import DispatchContext
from ...registry import kernel
from .common import (
    DTYPES,
    PLANS,
    WORKSPACE_BYTES,
    GemmPlan,
    check_common,
    check_matrix,
    check_size,
    collapsed_rows,
    gemm_launch_config,
    launch_cached,
)

FORWARD_EPILOGS = {
    (False, None): None, (True, None): "BIAS", (True, "relu"): "RELU_BIAS", (True, "gelu"): "GELU_BIAS",
    (False, "relu"): "RELU", (False, "gelu"): "GELU",
}  # fmt: skip


def _rows_reasons(name: str, spec: TensorSpec, dense: bool = False) -> list[str]:
    """A (..., C) tensor must fold into a row-major (M, C) matrix cuBLASLt can read."""
    folded = collapsed_rows(spec)
    if folded is None:
        return [f"the leading dims of '{name}' {spec.shape} (strides {spec.strides}) do not fold into rows"]
    shape, strides = folded
    if strides[1] != 1 and shape[1] > 1:
        return [f"'{name}' needs unit stride in its last dim, has strides {spec.strides}"]
    if dense and shape[0] > 1 and strides[0] != shape[1]:
        return [f"'{name}' rows must be dense (row stride {shape[1]}), have {strides[0]}"]
    return check_matrix(name, spec, shape, strides)


def _out_reasons(ctx: DispatchContext) -> list[str]:
    if ctx.out is not None and ctx.out.layout != "contiguous":
        return ["'out' must be contiguous (cuBLASLt writes its transposed view in place)"]
    return []


def _check_linear(ctx: DispatchContext) -> list[str]:
    reasons = check_common(ctx) + _out_reasons(ctx) + _rows_reasons("x", ctx.tensor("x"))
    w = ctx.tensor("weight")
    reasons += check_matrix("weight", w, w.shape, w.strides)
    if ctx.has_tensor("bias"):
        bias = ctx.tensor("bias")
        if bias.strides[0] != 1 and bias.shape[0] > 1:
            reasons.append("'bias' must be contiguous")
        if bias.ptr % 16:
            reasons.append("'bias' data pointer is not 16-byte aligned")
    return reasons


def _check_grad_input(ctx: DispatchContext) -> list[str]:
    reasons = check_common(ctx) + _out_reasons(ctx) + _rows_reasons("dy", ctx.tensor("dy"))
    w = ctx.tensor("weight")
    reasons += check_matrix("weight", w, w.shape, w.strides)
    activation = ctx.attrs["activation"]
    if activation == "relu":
        reasons.append("cuBLASLt's DRELU needs the RELU_AUX bit-mask of the forward pass, not preact")
    elif activation == "gelu":
        if ctx.attrs["k"] % 8:
            reasons.append(f"DGELU needs K % 8 == 0 (its aux matrix is padded to 8 rows), K={ctx.attrs['k']}")
        reasons += _rows_reasons("preact", ctx.tensor("preact"), dense=True)
    return reasons


def _check_grad_weight(ctx: DispatchContext) -> list[str]:
    reasons = check_common(ctx) + _out_reasons(ctx)
    reasons += _rows_reasons("dy", ctx.tensor("dy")) + _rows_reasons("x", ctx.tensor("x"))
    n, k, itemsize = ctx.attrs["n"], ctx.attrs["k"], ctx.tensor("dy").itemsize
    if ctx.attrs["bias"] and (n * k * itemsize) % 16:
        reasons.append(f"bias=True packs db after dW at byte offset N*K*{itemsize}, not a multiple of 16")
    return reasons


def _size(ctx: DispatchContext) -> list[str]:
    at = ctx.attrs
    return check_size(ctx, at["m"], at["n"], at["k"])


def _plan(args: ArgPack, key: tuple, epilog: str | None, views: tuple, extra: dict, ptrs: tuple) -> GemmPlan:
    """The cached plan for these views; keyed so that the pointer-only hot path never finds a plan made
    on copies (views that could not alias the caller's tensors)."""
    if tuple(t.data_ptr() for t in (*views, *extra.values())) != ptrs[: 3 + len(extra)]:
        key = (*key, "copied")
    ctype = args.config.params["compute_type"]
    return PLANS.get(key, lambda: GemmPlan(*views, epilog, extra or None, ctype, args.stream))


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(math.prod(t.shape[:-1]), t.shape[-1])


@kernel(
    "linear", "cublasLt", backend="cublaslt", dtypes=DTYPES, priority=20, fused=True, tensor_cores=True,
    conditions=(_check_linear, _size), launch_config=gemm_launch_config,
    workspace_bytes=lambda ctx: WORKSPACE_BYTES,
)  # fmt: skip
def linear_cublaslt(args: ArgPack) -> None:
    """y^T = W x^T with the bias/ReLU/GELU epilogue fused into the GEMM."""
    x, weight, bias = args.inputs
    ptrs = (weight.data_ptr(), x.data_ptr(), args.out.data_ptr(), 0 if bias is None else bias.data_ptr())
    key, done = launch_cached(args, ptrs)
    if done:
        return
    epilog = FORWARD_EPILOGS[bias is not None, args.attrs["activation"]]
    views = (weight, _rows(x).t(), args.out.view(-1, weight.shape[0]).t())
    extra = {} if bias is None else {"bias": bias}
    _plan(args, key, epilog, views, extra, ptrs).run(*views, bias=bias, workspace=args.workspace,
                                                      stream=args.stream)  # fmt: skip


@kernel(
    "linear_grad_input", "cublasLt", backend="cublaslt", dtypes=DTYPES, priority=20, fused=True,
    tensor_cores=True, conditions=(_check_grad_input, _size), launch_config=gemm_launch_config,
    workspace_bytes=lambda ctx: WORKSPACE_BYTES,
)  # fmt: skip
def linear_grad_input_cublaslt(args: ArgPack) -> None:
    """dx^T = W^T dy^T, with the DGELU epilogue multiplying by gelu'(preact) for activation='gelu'."""
    dy, weight, preact = args.inputs
    gelu = args.attrs["activation"] == "gelu"
    ptrs = (weight.data_ptr(), dy.data_ptr(), args.out.data_ptr(), 0, preact.data_ptr() if gelu else 0)
    key, done = launch_cached(args, ptrs)
    if done:
        return
    views = (weight.t(), _rows(dy).t(), args.out.view(-1, weight.shape[1]).t())
    extra = {"gelu_aux": _rows(preact).t()} if gelu else {}
    plan = _plan(args, key, "DGELU" if gelu else None, views, extra, ptrs[:3] + ptrs[4:])
    plan.run(*views, aux=extra.get("gelu_aux"), workspace=args.workspace, stream=args.stream)


@kernel(
    "linear_grad_weight", "cublasLt", backend="cublaslt", dtypes=DTYPES, priority=20, fused=True,
    tensor_cores=True, conditions=(_check_grad_weight, _size), launch_config=gemm_launch_config,
    workspace_bytes=lambda ctx: WORKSPACE_BYTES,
)  # fmt: skip
def linear_grad_weight_cublaslt(args: ArgPack) -> None:
    """dW^T = x^T dy; with bias=True the BGRADB epilogue writes dy's column sums right after dW."""
    dy, x = args.inputs
    n, k, with_bias = args.attrs["n"], args.attrs["k"], args.attrs["bias"]
    out_ptr = args.out.data_ptr()
    bgrad_ptr = out_ptr + n * k * args.out.element_size() if with_bias else 0
    ptrs = (x.data_ptr(), dy.data_ptr(), out_ptr, bgrad_ptr)
    key, done = launch_cached(args, ptrs)
    if done:
        return
    dw = args.out[: n * k].view(n, k) if with_bias else args.out
    views = (_rows(x).t(), _rows(dy), dw.t())
    plan = _plan(args, key, "BGRADB" if with_bias else None, views, {}, ptrs)
    plan.run(*views, bgrad=args.out[n * k :] if with_bias else None, workspace=args.workspace, stream=args.stream)


def weight_and_bias_grad_plan(rows: torch.Tensor, dy: torch.Tensor) -> GemmPlan:
    """A raw plan of dW^T = rows^T dy in fp32 whose BGRADB epilogue writes dy's fp32 column sums (db):
    the fp32-master-weight backward of the fused_cast linear, which C++ launches (pytorch/native_routes.cpp)."""
    dw = torch.empty(dy.shape[1], rows.shape[1], dtype=torch.float32, device=dy.device)
    stream = torch.cuda.current_stream(dy.device)
    return GemmPlan(rows.t(), dy, dw.t(), "BGRADB", None, None, stream, ab_only=False)
