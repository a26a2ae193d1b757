"""linear_cross_entropy: a language model's head and its loss, without the (rows x vocab) logits in memory.

`linear_cross_entropy(hidden, weight, target, bias=None, ignore_index=-100, label_smoothing=0.0,
reduction="mean", z_loss_scale=0.0)` is `F.cross_entropy(hidden @ weight.T + bias, target, ...)`, plus an
optional z-loss (PaLM's `z_loss_scale * logsumexp(logits)^2` per row), computed over chunks of rows: a chunk's
logits are made, reduced to its rows' losses and dropped. For each row r whose target t is not ignore_index,
with lse = logsumexp(z_r) over the V classes:

    loss_r = (1 - label_smoothing) * (lse - z_rt) + label_smoothing * (lse - mean_j z_rj) + z_loss_scale * lse^2

Ignored rows give 0. "mean" divides the sum by the number of rows not ignored (NaN when every row is ignored,
as PyTorch), "sum" adds, "none" returns each row's loss (target's shape). hidden is (..., H), weight (V, H),
target integers of shape hidden.shape[:-1]. A target outside [0, V) other than ignore_index gives NaN (PyTorch
raises; a GPU kernel cannot, and NaN never passes unnoticed). The logits are computed in the inputs' dtype and
taken in fp32 from there, as Hugging Face's ForCausalLMLoss upcasts them; the loss is float32 (float64 for
float64 inputs).

Gradients. `linear_cross_entropy_forward(...)` returns `(loss, grad_hidden, grad_weight, grad_bias)`: the
gradients of the loss for an upstream gradient of 1, made chunk by chunk while each chunk's logits are live
(the logit gradient overwrites the logits in place, then two GEMMs give the chunk's grad_hidden and its share
of grad_weight). Autograd's backward then only scales them by the upstream gradient. This is the choice for
training (Liger-Kernel makes it too): three GEMMs of rows x V x H in all, as unfused PyTorch does, where a
backward that recomputed the logits would run four (the largest GEMMs of a small LM's step); what it keeps
from forward to backward is grad_hidden (rows x H) and grad_weight (V x H), a small fraction of the logits.
It needs a scalar loss ("mean" or "sum"). `linear_cross_entropy_backward(grad_loss, ...)` (its own op, in
ops/linear_cross_entropy_backward.py) recomputes the logits instead: for reduction="none", whose upstream
gradient is per row, and for callers that keep no gradients between the passes.

The kernel ABI has one output per op: the op's output is the loss; the gradients go into the optional input
buffers grad_hidden (hidden's shape and dtype), grad_weight and grad_bias (weight's / bias's shape, their dtype
or float32), contiguous, which the kernels fill when given (and only then compute those gradients).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import numpy as np

from ..abi import INT_DTYPES
from ..arrays import as_array
from ..context import DispatchContext
from ..dispatch import run
from ..errors import ArgumentError, DTypeError, ShapeError, argument_error, clip
from ..schema import OpSchema
from .attention_forward import empty_like_backend
from .checks import finite_float, int_attribute, numel, require_dtype_like, require_float, require_ndim

REDUCTIONS = ("mean", "sum", "none")
GRADS = ("grad_hidden", "grad_weight", "grad_bias")


def _number(ctx: DispatchContext, name: str, low: float, high: float, expected: str) -> float:
    value = finite_float(ctx.op, name, ctx.attrs[name], expected, minimum=low)
    if value > high:
        raise argument_error(ArgumentError, ctx.op, name, expected, repr(ctx.attrs[name]))
    return value


def check_options(ctx: DispatchContext) -> dict[str, Any]:
    """ignore_index, label_smoothing, reduction and z_loss_scale, checked."""
    ignore_index = int_attribute(ctx, "ignore_index")
    reduction = ctx.attrs["reduction"]
    if reduction not in REDUCTIONS:
        raise argument_error(ArgumentError, ctx.op, "reduction", f"one of {REDUCTIONS}", repr(reduction))
    return {
        "ignore_index": ignore_index,
        "label_smoothing": _number(ctx, "label_smoothing", 0.0, 1.0, "a number in [0, 1]"),
        "reduction": reduction,
        "z_loss_scale": _number(ctx, "z_loss_scale", 0.0, math.inf, "a finite number >= 0"),
    }


def check_problem(ctx: DispatchContext) -> dict[str, int]:
    """Shapes of hidden (..., H), weight (V, H), target (...) and bias (V,): rows, vocab and hidden sizes."""
    require_ndim(ctx, "hidden", 1)
    hidden, weight, target = ctx.tensor("hidden").shape, ctx.tensor("weight").shape, ctx.tensor("target").shape
    if len(weight) != 2 or weight[1] != hidden[-1] or weight[0] == 0:
        raise argument_error(ShapeError, ctx.op, "weight", f"shape (V, {hidden[-1]}) with V >= 1 (hidden's last dim)",
                             f"shape {weight}")  # fmt: skip
    if target != hidden[:-1]:
        raise argument_error(ShapeError, ctx.op, "target", f"shape {hidden[:-1]} (hidden's leading dims)", target)
    if ctx.has_tensor("bias") and ctx.tensor("bias").shape != weight[:1]:
        raise argument_error(ShapeError, ctx.op, "bias", f"shape {weight[:1]}", ctx.tensor("bias").shape)
    return {"rows": numel(target), "vocab": weight[0], "hidden": weight[1]}


def check_grad_buffers(ctx: DispatchContext, names: tuple[str, ...]) -> tuple[bool, bool, bool]:
    """Which of grad_hidden, grad_weight and grad_bias the call asks for (shapes and layout checked)."""
    like = {"grad_hidden": "hidden", "grad_weight": "weight", "grad_bias": "bias"}
    for name in names:
        if not ctx.has_tensor(name):
            continue
        if not ctx.has_tensor(like[name]):
            raise argument_error(ArgumentError, ctx.op, name, f"None (there is no {like[name]})", "an array")
        buffer, want = ctx.tensor(name), ctx.tensor(like[name]).shape
        if buffer.shape != want:
            raise argument_error(ShapeError, ctx.op, name, f"a buffer of shape {want}", f"shape {buffer.shape}")
        if buffer.layout != "contiguous" and buffer.numel:
            raise argument_error(ShapeError, ctx.op, name, "a contiguous buffer", f"strides {buffer.strides}")
    return tuple(name in ctx.arg_names and ctx.has_tensor(name) for name in GRADS)  # type: ignore[return-value]


def _normalize(ctx: DispatchContext) -> dict[str, Any]:
    attrs = {**check_options(ctx), **check_problem(ctx)}
    grads = check_grad_buffers(ctx, GRADS)
    if any(grads) and attrs["reduction"] == "none":
        raise argument_error(ArgumentError, ctx.op, "reduction", "'mean' or 'sum' when gradient buffers are given "
                             "(for 'none', use linear_cross_entropy_backward)", "'none'")  # fmt: skip
    return {**attrs, "grads": grads}


def loss_dtype(dtype: str) -> str:
    """The loss's dtype for inputs of `dtype`: float32, float64 for float64."""
    return "float64" if dtype == "float64" else "float32"


def check_dtypes(ctx: DispatchContext) -> str:
    """hidden a floating dtype, weight and bias the same, target integers, gradient buffers their tensors'
    dtype or float32."""
    dtype = require_float(ctx, "hidden")
    for name in ("weight", "bias"):
        require_dtype_like(ctx, name, "hidden")
    if ctx.tensor("target").dtype not in INT_DTYPES:
        raise argument_error(
            DTypeError, ctx.op, "target", "an integer dtype (class indices)", ctx.tensor("target").dtype
        )
    for name in GRADS:
        if name in ctx.arg_names and ctx.has_tensor(name):
            got, allowed = ctx.tensor(name).dtype, {dtype} if name == "grad_hidden" else {dtype, "float32"}
            if got not in allowed:
                raise argument_error(DTypeError, ctx.op, name, f"dtype {' or '.join(sorted(allowed))}", got)
    return dtype


def logits_reference(hidden: Any, weight: Any, bias: Any) -> np.ndarray:
    """float64 (rows, V) logits."""
    h = np.asarray(hidden, np.float64)
    z = h.reshape(numel(h.shape[:-1]), h.shape[-1]) @ np.asarray(weight, np.float64).T
    return z if bias is None else z + np.asarray(bias, np.float64)


def _row_terms(z: np.ndarray, target: Any, ignore_index: int) -> tuple[np.ndarray, ...]:
    """(lse, targets as int64, valid rows, targets in range) of float64 logits."""
    t = np.asarray(target).reshape(-1).astype(np.int64)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        m = z.max(axis=1, initial=-np.inf) if z.size else np.zeros(z.shape[0])
        lse = m + np.log(np.exp(z - m[:, None]).sum(axis=1))
    valid = t != ignore_index
    return lse, t, valid, (t >= 0) & (t < z.shape[1])


def row_losses_reference(
    hidden: Any, weight: Any, target: Any, bias: Any = None, ignore_index: int = -100, label_smoothing: float = 0.0,
    z_loss_scale: float = 0.0,
) -> np.ndarray:  # fmt: skip
    """float64 loss of each row (0 where ignored, NaN where the target is out of range)."""
    z = logits_reference(hidden, weight, bias)
    lse, t, valid, in_range = _row_terms(z, target, ignore_index)
    z_t = z[np.arange(z.shape[0]), np.where(in_range, t, 0)] if z.shape[0] else np.zeros(0)
    eps = label_smoothing
    with np.errstate(invalid="ignore"):
        loss = (1.0 - eps) * (lse - z_t) + eps * (lse - z.mean(axis=1)) + z_loss_scale * lse * lse
    return np.where(valid, np.where(in_range, loss, np.nan), 0.0)


def reduce_reference(rows: np.ndarray, target: Any, ignore_index: int, reduction: str) -> np.ndarray:
    """The reduction of row losses: mean over rows not ignored, sum, or per row in target's shape."""
    if reduction == "none":
        return rows.reshape(np.shape(target))
    total = rows.sum()
    if reduction == "sum":
        return np.asarray(total)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(total / np.count_nonzero(np.asarray(target).reshape(-1) != ignore_index))


def reference(
    hidden: Any, weight: Any, target: Any, bias: Any = None, grad_hidden: Any = None, grad_weight: Any = None,
    grad_bias: Any = None, ignore_index: int = -100, label_smoothing: float = 0.0, reduction: str = "mean",
    z_loss_scale: float = 0.0,
) -> np.ndarray:  # fmt: skip
    """float64 reference of the loss (the gradient buffers are not read; see gradients_reference)."""
    rows = row_losses_reference(hidden, weight, target, bias, ignore_index, label_smoothing, z_loss_scale)
    return reduce_reference(rows, target, ignore_index, reduction)


def gradients_reference(
    grad_loss: Any, hidden: Any, weight: Any, target: Any, bias: Any = None, ignore_index: int = -100,
    label_smoothing: float = 0.0, reduction: str = "mean", z_loss_scale: float = 0.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """float64 (grad_hidden, grad_weight, grad_bias) for the upstream gradient grad_loss (the loss's shape)."""
    z = logits_reference(hidden, weight, bias)
    lse, t, valid, in_range = _row_terms(z, target, ignore_index)
    vocab = z.shape[1]
    with np.errstate(invalid="ignore", over="ignore"):
        dz = np.exp(z - lse[:, None]) * (1.0 + 2.0 * z_loss_scale * lse)[:, None] - label_smoothing / vocab
    rows = np.arange(z.shape[0])
    dz[rows[valid & in_range], t[valid & in_range]] -= 1.0 - label_smoothing
    g = np.asarray(grad_loss, np.float64)
    if reduction == "none":
        scale = g.reshape(-1)
    else:
        scale = np.full(z.shape[0], float(g))
        if reduction == "mean":
            scale /= max(np.count_nonzero(valid), 1)  # no row counts when none does (their gradient is 0)
    scale = np.where(in_range | ~valid, scale, np.nan)
    with np.errstate(invalid="ignore"):
        dz = np.where(valid[:, None], dz * scale[:, None], 0.0)
    h = np.asarray(hidden, np.float64)
    dh = dz @ np.asarray(weight, np.float64)
    return dh.reshape(h.shape), dz.T @ h.reshape(numel(h.shape[:-1]), h.shape[-1]), dz.sum(axis=0)


LINEAR_CROSS_ENTROPY = OpSchema(
    name="linear_cross_entropy",
    inputs=("hidden", "weight", "target", "bias", *GRADS),
    optional=frozenset({"bias", *GRADS}),
    buffers=frozenset(GRADS),
    attrs=("ignore_index", "label_smoothing", "reduction", "z_loss_scale"),
    defaults={"ignore_index": -100, "label_smoothing": 0.0, "reduction": "mean", "z_loss_scale": 0.0},
    normalize_attrs=_normalize,
    infer_dtype=lambda ctx: loss_dtype(check_dtypes(ctx)),
    infer_shape=lambda ctx: ctx.tensor("target").shape if ctx.attrs["reduction"] == "none" else (),
    reference=reference,
    flops=lambda ctx: (2 + 4 * any(ctx.attrs["grads"])) * ctx.attrs["rows"] * ctx.attrs["vocab"] * ctx.attrs["hidden"],
    doc="cross_entropy(hidden @ weight.T + bias, target) in row chunks; gradients into the optional buffers.",
)


def linear_cross_entropy(
    hidden: Any, weight: Any, target: Any, bias: Any = None, ignore_index: int = -100, label_smoothing: float = 0.0,
    reduction: str = "mean", z_loss_scale: float = 0.0, *, out: Any = None,
) -> Any:  # fmt: skip
    """The loss of F.cross_entropy(hidden @ weight.T + bias, target, ...) (+ z-loss), logits never whole."""
    options = (ignore_index, label_smoothing, reduction, z_loss_scale)
    return run("linear_cross_entropy", (hidden, weight, target, bias, None, None, None), options, out)


def gradient_buffers(
    hidden: Any, weight: Any, bias: Any, weight_grad: bool, with_hidden: bool = True, op: str = "linear_cross_entropy"
) -> tuple[Any, Any, Any]:
    """Fresh grad_hidden (None without with_hidden), grad_weight (None without weight_grad) and grad_bias (None
    without bias or weight_grad) beside hidden, in its tensors' dtypes."""
    if not isinstance(weight_grad, bool | np.bool_):
        raise argument_error(ArgumentError, op, "weight_grad", "a bool", clip(weight_grad))

    def like(t: Any, name: str) -> Any:
        shape, dtype = tuple(getattr(t, "shape", ())), str(getattr(t, "dtype", "")).removeprefix("torch.")
        floating = dtype in ("float16", "bfloat16", "float32", "float64")
        return empty_like_backend(hidden, shape, dtype if floating else "float32", f"{op}: {name}")

    return (
        like(hidden, "grad_hidden") if with_hidden else None,
        like(weight, "grad_weight") if weight_grad else None,
        like(bias, "grad_bias") if weight_grad and bias is not None else None,
    )


def linear_cross_entropy_forward(
    hidden: Any, weight: Any, target: Any, bias: Any = None, ignore_index: int = -100, label_smoothing: float = 0.0,
    reduction: str = "mean", z_loss_scale: float = 0.0, *, weight_grad: bool = True, out: Any = None,
) -> tuple[Any, Any, Any, Any]:  # fmt: skip
    """(loss, grad_hidden, grad_weight, grad_bias) for an upstream gradient of 1 ("mean" or "sum"); without
    weight_grad (a frozen head) grad_weight and grad_bias are None and cost nothing."""
    with contextlib.suppress(TypeError, ValueError):  # the dispatcher names the bad argument
        hidden, weight, bias = (as_array(t) for t in (hidden, weight, bias))
    grads = gradient_buffers(hidden, weight, bias, weight_grad)
    options = (ignore_index, label_smoothing, reduction, z_loss_scale)
    loss = run("linear_cross_entropy", (hidden, weight, target, bias, *grads), options, out)
    return (loss, *grads)
