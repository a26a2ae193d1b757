"""Matrix ONNX ops: MatMul (through the selector's matmul kernels), Gemm, Einsum, Trilu, Det.

On the CPU, an fp32 MatMul or Gemm by a constant 2-D weight (a read-only array: the model's initializers) of 2 to
512 rows runs through oneDNN's inner product where PyTorch is installed (`PackedLinear`): the weight is reordered
once per node into oneDNN's blocked layout (`torch.ops.mkldnn._reorder_linear_weight`, as inductor's CPU code does),
so that a call does not pack it again as NumPy's OpenBLAS does on every call, a cost that grows with K * N, not with
the rows: at GPT-2's batch 1 (128 rows) ~15-20% of the GEMM, at ViT-B/16's batch 1 (197 rows) ~7% (one core: 768 x
3072 weights, 93-99 GFLOP/s through NumPy and 102-107 packed from 208 to 768 rows; the model 1.044x faster with 512
than with 128 rows at most in an in-process A/B, within this machine's run-to-run noise in the bench). oneDNN keeps a
primitive, with memory of its own (~0.6 MiB for a 768 x 3072 weight), for every distinct row count it sees, so
after the first EXACT_ROW_COUNTS row counts a node runs as they are (the few signatures a model usually serves:
ViT-B/16's 197 rows padded to 208 cost 4-6% of each GEMM), the rows are padded to a multiple of `ROW_STEP` (fewer to
a power of two): at most EXACT_ROW_COUNTS + 3 + MAX_ROWS / ROW_STEP row counts per weight shape, whatever the input
signatures. More rows run on NumPy (the packing is spread over them; in 128-row chunks through oneDNN GPT-2 at batch
8 was no faster), as does everything without PyTorch (or with `ONEDNN_GEMM` off). The packed weights are a second
copy of those weights.
"""

from __future__ import annotations

import importlib.util
import weakref
from typing import Any

import numpy as np

from ...errors import ShapeError
from ...graph.ir import Node
from .record import Fn, Lowered, host_tensor, ints, is_float, itemsize, op, torch

ONEDNN_GEMM = importlib.util.find_spec("torch") is not None  # the CPU path's packed GEMM (tests turn it off)
ROW_STEP = 16  # rows are padded up to a multiple of this (a bounded set of row counts for oneDNN)...
EXACT_ROW_COUNTS = 4  # ...but for the first few row counts a node sees
MIN_ROWS = 2  # fewer rows (a matrix-vector product): NumPy, whose GEMV packs nothing; from 2 rows up oneDNN's packed
# weight wins (one core, 960 x 1280 at 2 / 4 / 8 rows: 91 / 119 / 245 us against NumPy's 290 / 305 / 430)
MAX_ROWS = 512  # more rows: NumPy (OpenBLAS's packing of the weight is spread over them)
MIN_WEIGHT = 512 * 512  # a weight of fewer elements: NumPy (oneDNN's per-call cost outweighs the packing: the built-in
# encoder's 128 x 512 FFN weights at 64 rows ran 23% slower packed; the zoo's weights are 768 x 768 and up)


def _constant_weight(b: Any) -> bool:
    """A weight the packed path takes: a read-only fp32 matrix (initializers and what is folded from them are
    read-only; buffers the plan reuses, and the outputs of its steps, are writeable) of at least MIN_WEIGHT."""
    return (
        isinstance(b, np.ndarray) and b.ndim == 2 and b.dtype == np.float32 and not b.flags.writeable
        and b.size >= MIN_WEIGHT
    )  # fmt: skip


def _packable(a: Any, b: Any) -> bool:
    """Whether `a @ b` runs on the packed path: fp32 activations (..., K) of MIN_ROWS to MAX_ROWS rows."""
    return (
        ONEDNN_GEMM and isinstance(a, np.ndarray) and a.dtype == np.float32 and a.ndim >= 2
        and a.shape[-1] == (b.shape[0] if isinstance(b, np.ndarray) and b.ndim == 2 else -1)
        and _constant_weight(b) and MIN_ROWS <= a.size // max(a.shape[-1], 1) <= MAX_ROWS
    )  # fmt: skip


class PackedLinear:
    """`x @ W (+ bias)` for (M, K) fp32 rows through oneDNN, one node's constant weight reordered once.

    The weight is taken by identity: it is packed on the second call that passes the same array object (the
    first, usually the plan's first run, goes through NumPy), and packed again only if another array comes. A
    weight that cannot be packed (an error from PyTorch) leaves the node on NumPy for good."""

    def __init__(self, transposed: bool) -> None:
        self.transposed = transposed  # the weight is given as (N, K) (Gemm's transB)
        self.seen: Any = None  # a weak reference to the last weight given
        self.packed: Any = None  # oneDNN's copy of that weight, once it has come twice
        self.failed = False
        self.exact: set[int] = set()  # the row counts this node runs unpadded (EXACT_ROW_COUNTS at most)

    def weight(self, b: np.ndarray) -> Any:
        """oneDNN's copy of `b`, or None while it is new (or where packing failed)."""
        if self.failed:
            return None
        if self.seen is not None and self.seen() is b:
            if self.packed is None:
                try:
                    w = b if self.transposed else b.T  # (N, K), as nn.Linear holds it
                    self.packed = torch.ops.mkldnn._reorder_linear_weight(host_tensor(w))
                except Exception:
                    self.failed = True
                    return None
            return self.packed
        self.seen, self.packed = weakref.ref(b), None
        return None

    def __call__(self, x: np.ndarray, b: np.ndarray, bias: np.ndarray | None) -> np.ndarray | None:
        """x (M, K) @ the weight + bias (N,), or None where the packed path does not run it (then NumPy)."""
        packed = self.weight(b)
        if packed is None:
            return None
        try:
            m = x.shape[0]
            if m not in self.exact and len(self.exact) < EXACT_ROW_COUNTS:
                self.exact.add(m)
            return self._run(x, packed, bias, pad=m not in self.exact)
        except Exception:  # a PyTorch without oneDNN's linear, or one that refuses these arguments: NumPy
            self.failed, self.packed = True, None
            return None

    @staticmethod
    def _run(x: np.ndarray, packed: Any, bias: np.ndarray | None, pad: bool = True) -> np.ndarray:
        m, k = x.shape
        if pad and m % ROW_STEP:  # padded with zero rows: oneDNN sees a row count of the bounded set
            rows = 1 << (m - 1).bit_length() if m < ROW_STEP else -(-m // ROW_STEP) * ROW_STEP  # 2, 4, 8, 16, 32, ...
            padded = np.zeros((rows, k), np.float32)
            padded[:m] = x
            x = padded
        tb = None if bias is None else host_tensor(bias)
        y = torch.ops.mkldnn._linear_pointwise(host_tensor(x), packed, tb, "none", [], "").numpy()
        return y if y.shape[0] == m else y[:m]


def _steered() -> bool:
    """Whether the policy in force (planning runs under the session's) picks or tunes the matmul kernel."""
    from ...policy import current_policy

    policy = current_policy()
    return "matmul" in policy.preferences or policy.tunes("matmul")


def lower_matmul(node: Node, args: list, opset: int) -> Lowered | None:
    a, b = args
    if _packable(a, b) and not _steered():
        return None  # the op map's function: the packed path (see PackedLinear), unless a policy picks a kernel
    if is_float(a) and a.dtype == b.dtype and a.ndim >= 1 and b.ndim >= 1:
        return "matmul", (0, 1), {}
    return None


def matmul(node: Node, opset: int) -> Fn:
    """np.matmul; by a constant fp32 weight, the packed path (one GEMM over the rows of every batch)."""
    if not ONEDNN_GEMM:
        return np.matmul
    packed = PackedLinear(transposed=False)

    def run(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        if _packable(a, b):
            y = packed(a.reshape(-1, a.shape[-1]), b, None)
            if y is not None:
                return y.reshape(*a.shape[:-1], b.shape[1])
        return np.matmul(a, b)

    return run


def matmul_size(node: Node, args: list, opset: int) -> tuple[tuple[int, ...], int]:
    """MatMul's output: the batch dims broadcast, then (M, N) (1-D operands as NumPy promotes them)."""
    a, b = (tuple(x.shape) for x in args)
    if not a or not b:
        return (), itemsize(args[0])
    a2, b2 = (a if len(a) > 1 else (1, *a)), (b if len(b) > 1 else (*b, 1))
    try:
        batch = tuple(np.broadcast_shapes(a2[:-2], b2[:-2]))
    except ValueError:
        batch = ()
    return (*batch, a2[-2], b2[-1]), itemsize(args[0])


op("MatMul", matmul, lambda node, opset: torch.matmul, lower=lower_matmul, size=matmul_size)


def gemm(node: Node, opset: int) -> Fn:
    alpha, beta = node.attrs.get("alpha", 1.0), node.attrs.get("beta", 1.0)
    trans_a, trans_b = node.attrs.get("transA", 0), node.attrs.get("transB", 0)

    packed = PackedLinear(transposed=bool(trans_b)) if ONEDNN_GEMM and alpha == 1.0 and not trans_a else None

    def run(a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None) -> np.ndarray:
        if packed is not None and _packable(a, b.T if trans_b else b) and (c is None or _bias(c, b, trans_b, beta)):
            y = packed(a, b, None if c is None else c.reshape(-1))
            if y is not None:
                return y
        y = np.matmul(a.T if trans_a else a, b.T if trans_b else b)  # a new array: scaled and summed in place
        if alpha != 1.0:
            y *= y.dtype.type(alpha)
        if c is not None:  # C broadcasts to (M, N), never beyond: Gemm's unidirectional broadcasting
            y += c if beta == 1.0 else c * y.dtype.type(beta)
        return y.astype(a.dtype, copy=False)

    return run


def _bias(c: Any, b: np.ndarray, trans_b: int, beta: float) -> bool:
    """Whether Gemm's C is a bias oneDNN adds: fp32, one value per output column, beta 1."""
    n = b.shape[0] if trans_b else b.shape[1]
    return beta == 1.0 and isinstance(c, np.ndarray) and c.dtype == np.float32 and c.shape in ((n,), (1, n))


def gemm_torch(node: Node, opset: int) -> Fn:
    alpha, beta = node.attrs.get("alpha", 1.0), node.attrs.get("beta", 1.0)
    trans_a, trans_b = node.attrs.get("transA", 0), node.attrs.get("transB", 0)

    def run(a: Any, b: Any, c: Any = None) -> Any:
        y = torch.matmul(a.T if trans_a else a, b.T if trans_b else b) * alpha
        return y if c is None else y + beta * c

    return run


op("Gemm", gemm, gemm_torch)


def einsum(node: Node, opset: int) -> Fn:
    equation = node.attrs["equation"].replace(" ", "")
    return lambda *xs: np.asarray(np.einsum(equation, *xs)).astype(xs[0].dtype, copy=False)


def einsum_torch(node: Node, opset: int) -> Fn:
    equation = node.attrs["equation"].replace(" ", "")
    return lambda *xs: torch.einsum(equation, *xs)


op("Einsum", einsum, einsum_torch)


def _diagonal(k: Any) -> int:
    return 0 if k is None else ints(k)[0]


def trilu(node: Node, opset: int) -> Fn:
    upper = bool(node.attrs.get("upper", 1))
    return lambda x, k=None: np.triu(x, _diagonal(k)) if upper else np.tril(x, _diagonal(k))


def trilu_torch(node: Node, opset: int) -> Fn:
    upper = bool(node.attrs.get("upper", 1))
    return lambda x, k=None: torch.triu(x, _diagonal(k)) if upper else torch.tril(x, _diagonal(k))


op("Trilu", trilu, trilu_torch, host_inputs=(1,))


def det(node: Node, opset: int) -> Fn:
    def run(x: np.ndarray) -> np.ndarray:
        if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
            raise ShapeError(f"Det: expected square matrices in the last two dims, got shape {x.shape}")
        return np.linalg.det(x).astype(x.dtype, copy=False)

    return run


def det_torch(node: Node, opset: int) -> Fn:
    def run(x: Any) -> Any:
        if x.dim() < 2 or x.shape[-1] != x.shape[-2]:
            raise ShapeError(f"Det: expected square matrices in the last two dims, got shape {tuple(x.shape)}")
        compute = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype  # no half LU
        return torch.linalg.det(x.to(compute)).to(x.dtype)

    return run


op("Det", det, det_torch)
