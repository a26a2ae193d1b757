"""Triton matmul: a tiled tensor-core kernel with an autotuner, a split-K variant and a GEMV kernel.

- `triton`: tiles BM x BN with a BK-deep K loop, grouped tile order for L2 reuse, fp32 accumulation
  (fp16/bf16 inputs), TF32 only under math_mode "tf32". The tile configuration is tuned once per
  problem bucket on the first call (timed on the call's own arguments) and kept in the on-disk tuning
  cache. One program owns each output tile, so results are bitwise reproducible run to run.
- `triton_splitk`: for few output tiles and a long K, programs also split K and add their fp32 partial
  tiles with atomics: faster there, but the order of those additions varies, so not deterministic.
- `gemv`: y = W v for M == 1 or N == 1; streams W once with wide loads, splits the reduction across
  programs when the output is short, and sums the fp32 partials in a second pass (deterministic).
"""

from __future__ import annotations

import functools
import math
import threading
from typing import Any

import torch
import triton
import triton.language as tl

from ...abi import ArgPack, LaunchConfig, MathMode
from ...autotune import report
from ...context import DispatchContext
from ...registry import kernel
from .common import FLOAT_DTYPES, INTERPRET, MAX_GRID_Y, as_torch, launch, no_negative_strides, sm_count, workspace_f32
from .reduction import Problem, launch_sum, tiles

# (BM, BN, BK, warps, stages): the tuner's search space for tensor-core tiles on sm80+.
CONFIGS = (
    (128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 256, 64, 8, 4), (128, 128, 64, 8, 4), (128, 128, 64, 4, 4),
    (64, 256, 64, 4, 4), (128, 64, 64, 4, 4), (64, 64, 64, 4, 4), (64, 64, 32, 4, 3), (32, 64, 32, 4, 3),
)  # fmt: skip
SMEM_LIMIT = 220 * 1024
TUNE_MIN_FLOPS = 2 * 256**3  # smaller problems take the heuristic tile at once
GROUP_M = 8


@triton.jit
def _matmul_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K, k_per_split,
    sab, sam, sak, sbb, sbk, sbn, scb, scm, scn,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr,
    PRECISION: tl.constexpr, FP32_INPUTS: tl.constexpr, ATOMIC: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    batch = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
    tiles_m = tl.cdiv(M, BM)
    tiles_n = tl.cdiv(N, BN)
    per_group = GROUP * tiles_n
    first_m = (pid // per_group) * GROUP
    group_rows = tl.minimum(tiles_m - first_m, GROUP)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    rm = (pid_m * BM + tl.arange(0, BM)) % M  # wrapped rows/cols stay in bounds; their results are masked
    rn = (pid_n * BN + tl.arange(0, BN)) % N
    rm = tl.max_contiguous(tl.multiple_of(rm, BM), BM)
    rn = tl.max_contiguous(tl.multiple_of(rn, BN), BN)
    k_start = split * k_per_split
    k_end = tl.minimum(K, k_start + k_per_split)
    rk = k_start + tl.arange(0, BK)
    a_ptrs = a_ptr + batch * sab + rm[:, None].to(tl.int64) * sam + rk[None, :].to(tl.int64) * sak
    b_ptrs = b_ptr + batch * sbb + rk[:, None].to(tl.int64) * sbk + rn[None, :].to(tl.int64) * sbn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(k_start, k_end, BK):
        k_left = k_end - k0
        a = tl.load(a_ptrs, mask=tl.arange(0, BK)[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=tl.arange(0, BK)[:, None] < k_left, other=0.0)
        if FP32_INPUTS:
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BK * sak
        b_ptrs += BK * sbk
    cm = pid_m * BM + tl.arange(0, BM)
    cn = pid_n * BN + tl.arange(0, BN)
    c_ptrs = c_ptr + batch * scb + cm[:, None].to(tl.int64) * scm + cn[None, :].to(tl.int64) * scn
    mask = (cm < M)[:, None] & (cn < N)[None, :]
    if ATOMIC:
        tl.atomic_add(c_ptrs, acc, mask=mask)
    else:
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gemv_kernel(
    w_ptr, v_ptr, y_ptr, I, J, j_per_split, swi, swj, sv, sy, sys_,
    BLOCK_I: tl.constexpr, BLOCK_J: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    split = tl.program_id(1)
    i = pid * BLOCK_I + tl.arange(0, BLOCK_I)
    i_mask = i < I
    j_start = split * j_per_split
    j_end = tl.minimum(J, j_start + j_per_split)
    w_rows = w_ptr + i[:, None].to(tl.int64) * swi
    acc = tl.zeros([BLOCK_I, BLOCK_J], dtype=tl.float32)
    for j0 in range(j_start, j_end, BLOCK_J):
        j = j0 + tl.arange(0, BLOCK_J)
        j_mask = j < j_end
        w = tl.load(w_rows + j[None, :].to(tl.int64) * swj, mask=i_mask[:, None] & j_mask[None, :], other=0.0)
        v = tl.load(v_ptr + j.to(tl.int64) * sv, mask=j_mask, other=0.0)
        acc += w.to(tl.float32) * v.to(tl.float32)[None, :]
    y = tl.sum(acc, axis=1)
    tl.store(y_ptr + split * sys_ + i.to(tl.int64) * sy, y.to(y_ptr.dtype.element_ty), mask=i_mask)


# -- problem shape ----------------------------------------------------------------------------------


def _batch_fits(ctx: DispatchContext) -> str | None:
    b = math.prod(ctx.attrs["batch"])
    return f"batch of {b} matrices (kernel grid holds at most {MAX_GRID_Y})" if b > MAX_GRID_Y else None


def _precision(ctx: DispatchContext) -> str:
    return "tf32" if ctx.math_mode is MathMode.TF32 else "ieee"


def _as_batched(args: ArgPack) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(a[B, M, K], b[B, K, N], c[B, M, N] to write, the out to copy c into or None) as torch views;
    copies only where broadcast batch dims cannot be expressed with strides."""
    at = args.attrs
    a, b = (as_torch(v) for v in args.inputs)
    out = as_torch(args.out)
    if at["a_vector"]:
        a = a.unsqueeze(0)
    if at["b_vector"]:
        b = b.unsqueeze(-1)
    batch, m, n, k = at["batch"], at["m"], at["n"], at["k"]
    count = math.prod(batch)
    a = a.expand(*batch, m, k).reshape(count, m, k)
    b = b.expand(*batch, k, n).reshape(count, k, n)
    try:
        return a, b, out.view(count, m, n), None
    except RuntimeError:  # an out= whose strides admit no such view: write a buffer, copy afterwards
        return a, b, torch.empty((count, m, n), dtype=out.dtype, device=out.device), out


def _fits(config: tuple, itemsize: int) -> bool:
    bm, bn, bk, _, stages = config
    return (bm * bk + bk * bn) * itemsize * stages <= SMEM_LIMIT


def heuristic_config(m: int, n: int, k: int, itemsize: int) -> tuple[int, int, int, int, int]:
    """A reasonable tile without tuning: the largest square-ish tile the problem fills."""
    if INTERPRET:
        return (max(16, min(32, triton.next_power_of_2(m))), max(16, min(32, triton.next_power_of_2(n))), 16, 4, 1)
    if m >= 128 and n >= 128:
        return (128, 128, 64 if itemsize <= 2 else 32, 8 if itemsize <= 2 else 4, 3)
    return (64, 64, 32, 4, 3)


def candidates(m: int, n: int, itemsize: int) -> list[tuple]:
    """Configs worth timing: tiles not much larger than the problem, within shared memory."""
    keep = [c for c in CONFIGS if _fits(c, itemsize) and c[0] <= 2 * max(m, 16) and c[1] <= 2 * max(n, 16)]
    if itemsize > 2:  # fp32 operands: halve BK to keep the same bytes in flight
        keep = sorted({(bm, bn, max(16, bk // 2), w, s) for bm, bn, bk, w, s in keep})
    return keep or [heuristic_config(m, n, 0, itemsize)]


def matmul_launch_config(ctx: DispatchContext) -> LaunchConfig:
    at = ctx.attrs
    itemsize = ctx.tensor("a").itemsize
    cfg = heuristic_config(at["m"], at["n"], at["k"], itemsize)
    params = {
        "precision": _precision(ctx), "fp32": ctx.dtype == "float32", "default": cfg,
        "tune": not INTERPRET and 2 * at["m"] * at["n"] * at["k"] >= TUNE_MIN_FLOPS,
        "key": (ctx.dtype, at["m"], at["n"], at["k"], math.prod(at["batch"]), _precision(ctx), ctx.device),
        "cc": ctx.compute_capability,
    }  # fmt: skip
    return LaunchConfig(grid=(triton.cdiv(at["m"], cfg[0]) * triton.cdiv(at["n"], cfg[1]),), params=params)


# -- tuning -----------------------------------------------------------------------------------------

_WINNERS: dict[tuple, tuple] = {}  # in-process: plan key -> config (the disk cache backs it)
_TUNE_LOCK = threading.Lock()


def _disk_key(p: dict, a: torch.Tensor, b: torch.Tensor, splitk: bool) -> Any:
    from ...runtime import tuning_cache

    dtype, m, n, k, count, precision, _ = p["key"]
    layout = ("n" if a.stride(2) == 1 else "t") + ("n" if b.stride(2) == 1 else "t")
    return tuning_cache.key("matmul", dtypes=dtype, layout=layout, shape=(count, m, n, k), arch=p["cc"],
                            source=_matmul_kernel, precision=precision, splitk=splitk)  # fmt: skip


def _tuned(p: dict, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, splitk: bool) -> tuple:
    """The winning config for this plan: memory, then disk, else time every candidate on these arguments."""
    mem_key = (*p["key"], a.stride(), b.stride(), splitk)
    found = _WINNERS.get(mem_key)
    if found is not None:
        return found
    with _TUNE_LOCK:
        from ...runtime import tuning_cache

        disk_key = _disk_key(p, a, b, splitk)
        found, source = _stored_winner(tuning_cache.get(disk_key), a, b, splitk), "from the tuning cache"
        if found is None:
            found, source = _search(p, a, b, c, splitk), "timed"
            tuning_cache.put(disk_key, {"config": list(found)})
        _WINNERS[mem_key] = found
        what = f"triton matmul tiles {p['key'][0]} {a.shape[0]}x{a.shape[1]}x{b.shape[2]}x{a.shape[2]}"
        report(f"{what}{' split-K' if splitk else ''}", f"BM,BN,BK,warps,stages,split = {found}", None, source)
    return found


def _stored_winner(stored: dict | None, a: torch.Tensor, b: torch.Tensor, splitk: bool) -> tuple | None:
    """A cached winner that is one of today's candidates (a hand-edited or foreign entry is re-tuned)."""
    config = tuple(stored.get("config") or ()) if isinstance(stored, dict) else ()
    if len(config) != 6 or config[:5] not in candidates(a.shape[1], b.shape[2], a.element_size()):
        return None
    return config if config[5] == 1 or (splitk and config[5] in _splits(a, b, config[:5])) else None


def _search(p: dict, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, splitk: bool) -> tuple:
    """Time every candidate briefly, then the best three again for longer (clock drift and noise)."""
    m, n = a.shape[1], b.shape[2]
    timed = []
    for cfg in candidates(m, n, a.element_size()):
        for split in _splits(a, b, cfg) if splitk else (1,):
            call = functools.partial(_run, p, a, b, c, (*cfg, split))
            try:
                timed.append((triton.testing.do_bench(call, warmup=5, rep=20), (*cfg, split)))
            except Exception:  # out of resources for this config: skip it
                continue
    if not timed:
        return (*p["default"], 1)
    finalists = [cfg for _, cfg in sorted(timed)[:3]]
    rerun = [(triton.testing.do_bench(functools.partial(_run, p, a, b, c, cfg), warmup=10, rep=100), cfg)
             for cfg in finalists]  # fmt: skip
    return min(rerun)[1]


def _splits(a: torch.Tensor, b: torch.Tensor, cfg: tuple) -> tuple[int, ...]:
    m, k, n = a.shape[1], a.shape[2], b.shape[2]
    tiles_ = a.shape[0] * triton.cdiv(m, cfg[0]) * triton.cdiv(n, cfg[1])
    most = max(1, min(16, k // (4 * cfg[2]), triton.cdiv(2 * sm_count(str(a.device)), tiles_)))
    return tuple(s for s in (1, 2, 4, 8, 16) if s <= most)


# -- launch -----------------------------------------------------------------------------------------


def _run(p: dict, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, cfg: tuple) -> None:
    bm, bn, bk, warps, stages, split = cfg
    count, m, k = a.shape
    n = b.shape[2]
    target = c
    if split > 1:
        target = c if c.dtype == torch.float32 else torch.empty(c.shape, dtype=torch.float32, device=c.device)
        target.zero_()
    k_per = triton.cdiv(triton.cdiv(k, split), bk) * bk if k else bk
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn), count, split)
    launch(
        _matmul_kernel, grid,
        a, b, target, m, n, k, k_per, *a.stride(), *b.stride(), *target.stride(),
        BM=bm, BN=bn, BK=bk, GROUP=GROUP_M, PRECISION=p["precision"], FP32_INPUTS=p["fp32"], ATOMIC=split > 1,
        num_warps=warps, num_stages=stages,
    )  # fmt: skip
    if target is not c:
        c.copy_(target)


def _launch(args: ArgPack, splitk: bool) -> None:
    p = args.config.params
    at = args.attrs
    a, b, c, copy_to = _as_batched(args)
    if at["m"] * at["n"] * math.prod(at["batch"]) == 0:
        return
    cfg = _tuned(p, a, b, c, splitk) if p["tune"] else (*p["default"], 1)
    _run(p, a, b, c, cfg)
    if copy_to is not None:
        copy_to.copy_(c.view(copy_to.shape))


_HINTS = dict(backend="triton", dtypes=FLOAT_DTYPES, launch_config=matmul_launch_config, tensor_cores=True)


@kernel("matmul", "triton", priority=0, conditions=(_batch_fits, no_negative_strides), **_HINTS)
def matmul_triton(args: ArgPack) -> None:
    """Tuned tiles, one program per output tile (reproducible); fp32 accumulation."""
    _launch(args, splitk=False)


def _long_k(ctx: DispatchContext) -> str | None:
    at = ctx.attrs
    if at["k"] < 4 * max(at["m"], at["n"]):
        return f"K={at['k']} is not long next to M={at['m']}, N={at['n']} (split-K pays only for long K)"
    return None


@kernel(
    "matmul", "triton_splitk", priority=-5, deterministic=False, conditions=(_batch_fits, _long_k, no_negative_strides),
    **_HINTS,
)  # fmt: skip
def matmul_triton_splitk(args: ArgPack) -> None:
    """Tuned tiles and K splits; fp32 partial tiles added with atomics (order varies: not deterministic)."""
    _launch(args, splitk=True)


# -- GEMV -------------------------------------------------------------------------------------------


def _matrix_vector(ctx: DispatchContext) -> str | None:
    at = ctx.attrs
    if at["batch"]:
        return "batched call (the GEMV kernel takes one matrix and one vector)"
    if at["n"] != 1:
        return f"not a matrix-vector product (N={at['n']}; the vector-matrix case M == 1 is triton_gemv_t)"
    return None


def _vector_matrix(ctx: DispatchContext) -> str | None:
    at = ctx.attrs
    if at["batch"]:
        return "batched call (the GEMV kernel takes one vector and one matrix)"
    if at["m"] != 1 or at["n"] == 1:
        return f"not a vector-matrix product (M={at['m']}, N={at['n']}; N == 1 is triton_gemv)"
    return None


def _gemv_operands(args: ArgPack) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int, int, int, int, int]:
    """(W, v, y, I, J, swi, swj, sv, sy): y[i] = sum_j W[i, j] v[j] for either orientation."""
    at = args.attrs
    a, b = (as_torch(x) for x in args.inputs)
    y = as_torch(args.out).reshape(-1)  # a view: the output has at most one dim longer than 1
    m, n, k = at["m"], at["n"], at["k"]
    a2 = a.unsqueeze(0) if at["a_vector"] else a  # (M, K)
    b2 = b.unsqueeze(-1) if at["b_vector"] else b  # (K, N)
    if n == 1:  # y[m] = sum_k a[m, k] b[k]
        return a2, b2, y, m, k, a2.stride(0), a2.stride(1), b2.stride(0), y.stride(0)
    return b2, a2, y, n, k, b2.stride(1), b2.stride(0), a2.stride(1), y.stride(0)


def gemv_launch_config(ctx: DispatchContext) -> LaunchConfig:
    at = ctx.attrs
    n_is_one = at["n"] == 1
    rows, j = (at["m"], at["k"]) if n_is_one else (at["n"], at["k"])
    a, b = ctx.tensor("a"), ctx.tensor("b")
    if n_is_one:  # W = a (rows m, reduce over k): contiguous along k for a row-major a
        j_contiguous = at["a_vector"] or a.strides[-1] == 1
    else:  # W = b^T (rows n, reduce over k): contiguous along k only for a column-major b
        j_contiguous = b.strides[0] == 1
    if j_contiguous:  # rows of W along memory: few rows, long contiguous row segments
        block_i, block_j, warps = 8, 1024, 8
    else:  # W's columns along memory: wide contiguous runs of rows, a short reduction step
        block_i, block_j, warps = 128, 32, 4
    if INTERPRET:
        block_i, block_j = min(block_i, 16), min(block_j, 32)
    programs = triton.cdiv(max(rows, 1), block_i)
    target = 8 * sm_count(ctx.device)
    split = max(1, min(triton.cdiv(target, programs), triton.cdiv(j, 4 * block_j), MAX_GRID_Y))
    j_per = triton.cdiv(triton.cdiv(max(j, 1), split), block_j) * block_j
    split = triton.cdiv(max(j, 1), j_per)
    params = {"BLOCK_I": block_i, "BLOCK_J": block_j, "split": split, "j_per": j_per, "num_warps": warps,
              "finish": tiles(Problem(1, split, rows, (0, rows, 1), (0, 1)), 0)}  # fmt: skip
    return LaunchConfig(grid=(programs, split), block=(32 * warps,), params=params)


def gemv_workspace_bytes(ctx: DispatchContext) -> int:
    p = gemv_launch_config(ctx).params
    rows = ctx.attrs["m"] if ctx.attrs["n"] == 1 else ctx.attrs["n"]
    return 4 * p["split"] * rows if p["split"] > 1 else 0


_GEMV_HINTS = dict(
    backend="triton", dtypes=FLOAT_DTYPES, launch_config=gemv_launch_config, workspace_bytes=gemv_workspace_bytes
)


def _gemv(args: ArgPack) -> None:
    """Streams the matrix once (bandwidth-bound); split reductions finish in a second, deterministic pass."""
    p = args.config.params
    w, v, y, rows, j, swi, swj, sv, sy = _gemv_operands(args)
    if rows == 0:
        return
    split = p["split"]
    target, t_stride, s_stride = y, sy, 0
    if split > 1:
        target = workspace_f32(args, split * rows, y.device)
        t_stride, s_stride = 1, rows
    launch(
        _gemv_kernel, args.config.grid,
        w, v, target, rows, j, p["j_per"], swi, swj, sv, t_stride, s_stride,
        BLOCK_I=p["BLOCK_I"], BLOCK_J=p["BLOCK_J"], num_warps=p["num_warps"],
    )  # fmt: skip
    if split > 1:
        finish = dict(p["finish"])
        finish["out"] = (0, sy)
        launch_sum(target, y, finish)


@kernel("matmul", "triton_gemv", priority=60, conditions=(_matrix_vector, no_negative_strides), **_GEMV_HINTS)
def matmul_gemv_triton(args: ArgPack) -> None:
    """y = A x: streams A once (bandwidth-bound); beats cuBLAS's GEMV at 16384^2 bf16 on an H100."""
    _gemv(args)


@kernel("matmul", "triton_gemv_t", priority=10, conditions=(_vector_matrix, no_negative_strides), **_GEMV_HINTS)
def matmul_gemv_t_triton(args: ArgPack) -> None:
    """y = x B: split reduction (deterministic second pass); measured slower than cuBLAS on an H100, so auto
    prefers PyTorch's kernel."""
    _gemv(args)
