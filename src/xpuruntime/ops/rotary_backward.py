"""rotary_embedding_backward: the gradients of q and k through rotary_embedding (ops/rotary.py).

`rotary_embedding_backward(dq, dk, cos, sin, position_ids=None, unsqueeze_dim=1, interleaved=False)` takes
the upstream gradients of q_embed and k_embed (shaped like q and k) and returns `(grad_q, grad_k)`: the
rotation is linear, so grad_x = dy * cos + rotate^T(dy * sin) with rotate^T = -rotate, and the dims past
rotary_dim pass through. No forward tensor is needed: only cos, sin and position_ids are saved. Rounding
as the forward (each eager step in q's dtype when q and cos share a half dtype). The output packs
[grad_q | grad_k] flat, as the forward packs its results.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..dispatch import run
from ..schema import OpSchema
from .checks import stored_as
from .rotary import eager_rounding, effective, normalize_rotary, rotary_dtype, rotated, split


def _gradient(dy: Any, cos: np.ndarray, sin: np.ndarray, interleaved: bool, rounds: Any) -> np.ndarray:
    dy64 = np.asarray(dy, np.float64)
    r = cos.shape[-1]
    part = dy64[..., :r]
    with np.errstate(invalid="ignore"):
        dx = stored_as(stored_as(part * cos, rounds) - rotated(stored_as(part * sin, rounds), interleaved), rounds)
    return np.concatenate([dx, dy64[..., r:]], axis=-1)


def reference(
    dq: Any, dk: Any, cos: Any, sin: Any, position_ids: Any = None, unsqueeze_dim: int = 1, interleaved: bool = False
) -> np.ndarray:
    """float64 reference of the packed output [grad_q | grad_k]."""
    c, s = (effective(t, position_ids, unsqueeze_dim) for t in (cos, sin))
    rounds = eager_rounding(dq, cos)
    return np.concatenate([_gradient(d, c, s, interleaved, rounds).reshape(-1) for d in (dq, dk)])


ROTARY_EMBEDDING_BACKWARD = OpSchema(
    name="rotary_embedding_backward",
    inputs=("dq", "dk", "cos", "sin", "position_ids"),
    optional=frozenset({"position_ids"}),
    attrs=("unsqueeze_dim", "interleaved"),
    defaults={"unsqueeze_dim": 1, "interleaved": False},
    normalize_attrs=lambda ctx: normalize_rotary(ctx, "dq", "dk"),
    infer_dtype=lambda ctx: rotary_dtype(ctx, "dq", "dk"),
    infer_shape=lambda ctx: (sum(ctx.attrs["sizes"]),),
    reference=reference,
    flops=lambda ctx: 3 * sum(ctx.attrs["sizes"]) * ctx.attrs["rotary_dim"] // ctx.attrs["head_dim"],
    doc="Gradients of rotary_embedding for q and k, packed flat as [grad_q | grad_k].",
)


def rotary_embedding_backward(
    dq: Any, dk: Any, cos: Any, sin: Any, position_ids: Any = None, unsqueeze_dim: int = 1,
    interleaved: bool = False, *, out: Any = None,
) -> tuple[Any, Any]:  # fmt: skip
    """(grad_q, grad_k) of rotary_embedding for the upstream gradients dq (of q_embed) and dk (of k_embed)."""
    packed = run("rotary_embedding_backward", (dq, dk, cos, sin, position_ids), (unsqueeze_dim, interleaved), out)
    return split(packed, tuple(np.shape(dq)), tuple(np.shape(dk)))
