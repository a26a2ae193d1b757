"""linear_cross_entropy_backward: the gradients of linear_cross_entropy, recomputing the logits chunk by chunk.

`linear_cross_entropy_backward(grad_loss, hidden, weight, target, bias=None, ignore_index=-100,
label_smoothing=0.0, reduction="mean", z_loss_scale=0.0)` returns `(grad_hidden, grad_weight, grad_bias)`
for the upstream gradient grad_loss (the loss's shape: a scalar for "mean" / "sum", target's shape for "none").
It makes the logits again (one GEMM more than the forward's in-pass gradients, ops/linear_cross_entropy.py):
the path for reduction="none" and for callers that keep nothing between the passes.

The op's output is grad_hidden (hidden's shape and dtype); grad_weight and grad_bias go into optional input
buffers (weight's / bias's shape, their dtype or float32, contiguous), computed only when given.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from ..arrays import as_array
from ..context import DispatchContext
from ..dispatch import run
from ..errors import ShapeError, argument_error
from ..schema import OpSchema
from .checks import require_float
from .linear_cross_entropy import (
    GRADS,
    check_dtypes,
    check_grad_buffers,
    check_options,
    check_problem,
    gradient_buffers,
    gradients_reference,
)


def _normalize(ctx: DispatchContext) -> dict[str, Any]:
    attrs = {**check_options(ctx), **check_problem(ctx)}
    want = ctx.tensor("target").shape if attrs["reduction"] == "none" else ()
    if ctx.tensor("grad_loss").shape != want:
        raise argument_error(ShapeError, ctx.op, "grad_loss", f"shape {want} (the loss's, reduction="
                             f"{attrs['reduction']!r})", ctx.tensor("grad_loss").shape)  # fmt: skip
    return {**attrs, "grads": check_grad_buffers(ctx, GRADS[1:])}


def _dtype(ctx: DispatchContext) -> str:
    require_float(ctx, "grad_loss")
    return check_dtypes(ctx)


def reference(
    grad_loss: Any, hidden: Any, weight: Any, target: Any, bias: Any = None, grad_weight: Any = None,
    grad_bias: Any = None, ignore_index: int = -100, label_smoothing: float = 0.0, reduction: str = "mean",
    z_loss_scale: float = 0.0,
) -> np.ndarray:  # fmt: skip
    """float64 reference of grad_hidden (see linear_cross_entropy.gradients_reference for all three)."""
    return gradients_reference(grad_loss, hidden, weight, target, bias, ignore_index, label_smoothing, reduction,
                               z_loss_scale)[0]  # fmt: skip


LINEAR_CROSS_ENTROPY_BACKWARD = OpSchema(
    name="linear_cross_entropy_backward",
    inputs=("grad_loss", "hidden", "weight", "target", "bias", "grad_weight", "grad_bias"),
    optional=frozenset({"bias", "grad_weight", "grad_bias"}),
    buffers=frozenset({"grad_weight", "grad_bias"}),
    attrs=("ignore_index", "label_smoothing", "reduction", "z_loss_scale"),
    defaults={"ignore_index": -100, "label_smoothing": 0.0, "reduction": "mean", "z_loss_scale": 0.0},
    normalize_attrs=_normalize,
    infer_dtype=_dtype,
    infer_shape=lambda ctx: ctx.tensor("hidden").shape,
    reference=reference,
    flops=lambda ctx: (4 + 2 * ctx.attrs["grads"][1]) * ctx.attrs["rows"] * ctx.attrs["vocab"] * ctx.attrs["hidden"],
    doc="Gradients of linear_cross_entropy, recomputing the logits: grad_hidden; grad_weight/grad_bias buffers.",
)


def linear_cross_entropy_backward(
    grad_loss: Any, hidden: Any, weight: Any, target: Any, bias: Any = None, ignore_index: int = -100,
    label_smoothing: float = 0.0, reduction: str = "mean", z_loss_scale: float = 0.0, *, weight_grad: bool = True,
    out: Any = None,
) -> tuple[Any, Any, Any]:  # fmt: skip
    """(grad_hidden, grad_weight, grad_bias) for upstream gradient grad_loss; without weight_grad (a frozen
    head) grad_weight and grad_bias are None and cost nothing."""
    with contextlib.suppress(TypeError, ValueError):  # the dispatcher names the bad argument
        hidden, weight, bias = (as_array(t) for t in (hidden, weight, bias))
    _, grad_weight, grad_bias = gradient_buffers(
        hidden, weight, bias, weight_grad, with_hidden=False, op="linear_cross_entropy_backward"
    )
    options = (ignore_index, label_smoothing, reduction, z_loss_scale)
    inputs = (grad_loss, hidden, weight, target, bias, grad_weight, grad_bias)
    grad_hidden = run("linear_cross_entropy_backward", inputs, options, out)
    return grad_hidden, grad_weight, grad_bias
