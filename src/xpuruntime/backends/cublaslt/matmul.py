"""matmul through cuBLASLt: 2-D, batched (equal batch dims) and a batch of rows times one matrix."""

from __future__ import annotations

from typing import Any

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
    folded_stride,
    gemm_launch_config,
    launch_cached,
)


def _batch_stride(spec: TensorSpec, nbatch: int) -> int | None:
    """The single stride of a tensor's leading `nbatch` dims when they collapse into one, else None."""
    return folded_stride(spec.shape[:nbatch], spec.strides[:nbatch])


def _flattens_batch(ctx: DispatchContext) -> bool:
    """True when b is one matrix for every batch entry: then a's leading dims fold into M."""
    b = ctx.tensor("b")
    return ctx.attrs["b_vector"] or all(n == 1 for n in b.shape[:-2])


def _check_operands(ctx: DispatchContext) -> list[str]:
    at = ctx.attrs
    a, b = ctx.tensor("a"), ctx.tensor("b")
    if at["a_vector"] and at["b_vector"]:
        return ["vector @ vector (a dot product) is not a GEMM"]
    reasons = check_common(ctx)
    if ctx.out is not None and ctx.out.layout != "contiguous":
        reasons.append("'out' must be contiguous (cuBLASLt writes it in place)")
    if not at["batch"] or _flattens_batch(ctx):
        rows = collapsed_rows(a) if not at["a_vector"] else ((1, a.shape[0]), (a.shape[0], a.strides[0]))
        if rows is None:
            return [*reasons, f"the leading dims of 'a' {a.shape} (strides {a.strides}) do not fold into rows"]
        reasons += check_matrix("a", a, *rows)
        b_shape = (b.shape[0], 1) if at["b_vector"] else b.shape[-2:]
        b_strides = (b.strides[0], 1) if at["b_vector"] else b.strides[-2:]
        reasons += check_matrix("b", b, b_shape, b_strides)
        return reasons
    nbatch = len(at["batch"])
    for name, spec in (("a", a), ("b", b)):
        if spec.ndim - 2 != nbatch or spec.shape[:-2] != at["batch"]:
            reasons.append(f"'{name}' {spec.shape} would broadcast over the batch {at['batch']} (not supported)")
        elif _batch_stride(spec, nbatch) is None:
            reasons.append(f"the batch dims of '{name}' {spec.shape} (strides {spec.strides}) do not fold into one")
        else:
            reasons += check_matrix(name, spec, spec.shape[-2:], spec.strides[-2:])
    return reasons


def _check_size(ctx: DispatchContext) -> list[str]:
    at = ctx.attrs
    batch = 1
    for n in at["batch"]:
        batch *= n
    return check_size(ctx, at["m"] * batch, at["n"], at["k"])


def _operands(a: Any, b: Any, out: Any, at: Any) -> tuple[Any, Any, Any]:
    """2-D (or 3-D batched) views of a, b and out for cuBLASLt."""
    m, n, k = at["m"], at["n"], at["k"]
    if at["batch"] and not (at["b_vector"] or all(d == 1 for d in b.shape[:-2])):
        return a.reshape(-1, m, k), b.reshape(-1, k, n), out.view(-1, m, n)
    a2 = a.reshape(1, k) if at["a_vector"] else a.reshape(-1, k)
    b2 = b.reshape(k, 1) if at["b_vector"] else b.reshape(k, n)
    return a2, b2, out.view(a2.shape[0], n)


@kernel(
    "matmul", "cublasLt", backend="cublaslt", dtypes=DTYPES, priority=20, tensor_cores=True,
    conditions=(_check_operands, _check_size), launch_config=gemm_launch_config,
    workspace_bytes=lambda ctx: WORKSPACE_BYTES,
)  # fmt: skip
def matmul_cublaslt(args: ArgPack) -> None:
    """cuBLASLt GEMM from a cached nvmath plan, written in place into the output."""
    a, b = args.inputs
    ptrs = (a.data_ptr(), b.data_ptr(), args.out.data_ptr())
    key, done = launch_cached(args, ptrs)
    if done:
        return
    a2, b2, c2 = _operands(a, b, args.out, args.attrs)
    if (a2.data_ptr(), b2.data_ptr(), c2.data_ptr()) != ptrs:  # a copy, not a view: never on the hot path
        key = (*key, "copied")
    ctype = args.config.params["compute_type"]
    plan = PLANS.get(key, lambda: GemmPlan(a2, b2, c2, None, None, ctype, args.stream))
    plan.run(a2, b2, c2, workspace=args.workspace, stream=args.stream)
