"""RotaryEmbedding (opset 23): rotary position embeddings (RoPE) on (B, H, S, D) or (B, S, H * D) inputs,
the rotated pairs taken as halves of the head or interleaved, on all of the head or on its first
rotary_embedding_dim values; cos / sin caches indexed by position_ids, or already (B, S, D / 2).
One algorithm serves both paths (see arrays.py)."""

from __future__ import annotations

from typing import Any

from ...errors import ShapeError
from ...graph.ir import Node
from .arrays import NUMPY, builders
from .record import check_indices, op


def _rotary(xp: Any, node: Node, opset: int, x: Any, cos: Any, sin: Any, positions: Any = None) -> Any:
    """Each rotated pair (x1, x2) becomes (cos x1 - sin x2, sin x1 + cos x2)."""
    heads, interleaved = node.attrs.get("num_heads", 0), bool(node.attrs.get("interleaved", 0))
    shape = tuple(x.shape)
    if x.ndim == 4:
        x = xp.permute(x, (0, 2, 1, 3))  # (B, S, H, D)
    elif x.ndim == 3 and heads > 0 and shape[2] % heads == 0:
        x = x.reshape(shape[0], shape[1], heads, shape[2] // heads)
    else:
        raise ShapeError(f"RotaryEmbedding: input {shape} must be (B, H, S, D), or (B, S, H * D) with num_heads set")
    width = node.attrs.get("rotary_embedding_dim", 0) or x.shape[3]
    if positions is not None:
        if xp is NUMPY:
            check_indices("RotaryEmbedding", positions, cos.shape[0], 0, cos.shape)
        cos, sin = xp.take(cos, positions), xp.take(sin, positions)
    batch, seq = x.shape[:2]
    fits = cos.ndim == 3 and cos.shape[0] in (1, batch) and tuple(cos.shape[1:]) == (seq, width // 2)
    if width % 2 or width > x.shape[3] or not fits or cos.shape != sin.shape:  # a batch of 1 broadcasts, as in PyTorch
        raise ShapeError(f"RotaryEmbedding: cos / sin {tuple(cos.shape)} must be (B or 1, S, {width // 2}) for a "
                         f"rotary dim of {width} (input {shape})")  # fmt: skip
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    rotated, kept = x[..., :width], x[..., width:]
    half = width // 2
    x1, x2 = (rotated[..., 0::2], rotated[..., 1::2]) if interleaved else (rotated[..., :half], rotated[..., half:])
    real, imag = cos * x1 - sin * x2, sin * x1 + cos * x2
    if interleaved:
        rotated = xp.stack([real, imag], -1).reshape(rotated.shape)
    else:
        rotated = xp.concat([real, imag], -1)
    out = xp.cast(xp.concat([rotated, kept], -1), x.dtype)
    return out.reshape(shape) if len(shape) == 3 else xp.permute(out, (0, 2, 1, 3))


op("RotaryEmbedding", *builders(_rotary))
