"""flash_v2: Triton flash attention, forward and backward, on [B, H, S, D] views of any strides.

Forward: one program per (query block, batch*head); the softmax runs online over key blocks in the
log2 domain (exp2 with scale*log2(e) folded into one multiply-add). Causal calls (top-left aligned)
split the key range into blocks strictly left of the diagonal, which need no mask, and the blocks on
it, which do. The logsumexp (natural log) is written for backward; a row that sees no key gets out =
NaN (as the op's reference) and logsumexp = +inf, so backward gives it no gradient.

Backward: a preprocess computes delta = rowsum(dO * O); one kernel owns a key/value block and loops
over query blocks (and over the query heads of its GQA group, so the group's reduction is
deterministic) for dK and dV; another owns a query block and loops over key blocks for dQ.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .common import launch

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
MASK_NONE, MASK_BOOL, MASK_ADD = 0, 1, 2


@dataclass(frozen=True)
class FwdConfig:
    block_m: int
    block_n: int
    warps: int
    stages: int
    ws: bool = False  # warp specialization of the unmasked key loop (forward only)
    tma: bool = False  # tensor-descriptor (TMA) loads where the device and strides allow (forward only)

    def __str__(self) -> str:
        extra = (" ws" if self.ws else "") + (" tma" if self.tma else "")
        return f"{self.block_m}x{self.block_n}/w{self.warps}/s{self.stages}{extra}"


@dataclass(frozen=True)
class BwdConfig:
    dkdv: FwdConfig  # block_m: query block (inner loop), block_n: key block (owned); block_n % block_m == 0
    dq: FwdConfig  # block_m: query block (owned), block_n: key block (inner loop); block_m % block_n == 0

    def __str__(self) -> str:
        return f"dkdv {self.dkdv} dq {self.dq}"


# ------------------------------------------------------------------------------------------------
# forward
# ------------------------------------------------------------------------------------------------


@triton.jit
def _fwd_step(
    acc, l_i, m_i, q, start_n, k_base, v_base, m_base, stride_kn, stride_kd, stride_vn, stride_vd, stride_mm,
    stride_mn, rows, L, S, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, BOUNDS: tl.constexpr, MASK_KIND: tl.constexpr,
):  # fmt: skip
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    cols = start_n + offs_n
    k_ptrs = k_base + cols[None, :] * stride_kn + offs_d[:, None] * stride_kd
    v_ptrs = v_base + cols[:, None] * stride_vn + offs_d[None, :] * stride_vd
    if BOUNDS:
        k = tl.load(k_ptrs, mask=(cols[None, :] < S) & d_ok[:, None], other=0.0)
    elif HEAD_DIM != BLOCK_D:
        k = tl.load(k_ptrs, mask=d_ok[:, None], other=0.0)
    else:
        k = tl.load(k_ptrs)
    qk = tl.dot(q, k)
    if CAUSAL or BOUNDS or MASK_KIND != 0:
        qk = qk * qk_scale
        if MASK_KIND != 0:
            m_ptrs = m_base + rows[:, None] * stride_mm + cols[None, :] * stride_mn
            inside = (rows[:, None] < L) & (cols[None, :] < S)
            if MASK_KIND == 1:
                keep = tl.load(m_ptrs, mask=inside, other=0) != 0
                qk = tl.where(keep, qk, float("-inf"))
            else:
                bias = tl.load(m_ptrs, mask=inside, other=0.0).to(tl.float32)
                qk = qk + bias * 1.4426950408889634
        if CAUSAL:
            qk = tl.where(rows[:, None] >= cols[None, :], qk, float("-inf"))
        if BOUNDS:
            qk = tl.where(cols[None, :] < S, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))  # masked calls: >= FLOAT32_LOWEST, see _fwd_kernel
        p = tl.exp2(qk - m_new[:, None])
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.exp2(qk * qk_scale - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    if BOUNDS:
        v = tl.load(v_ptrs, mask=(cols[:, None] < S) & d_ok[None, :], other=0.0)
    elif HEAD_DIM != BLOCK_D:
        v = tl.load(v_ptrs, mask=d_ok[None, :], other=0.0)
    else:
        v = tl.load(v_ptrs)
    acc = tl.dot(p.to(v.dtype), v, acc)
    m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _fwd_block(
    acc, l_i, m_i, q, k_base, v_base, m_base, stride_kn, stride_kd, stride_vn, stride_vd, stride_mm, stride_mn,
    rows, lo, hi, L, S, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, BOUNDS: tl.constexpr, MASK_KIND: tl.constexpr, WS: tl.constexpr = False,
):  # fmt: skip
    if WS:  # warp-specialized pipeline (producer warps load K/V while consumers compute)
        for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=True):
            acc, l_i, m_i = _fwd_step(
                acc, l_i, m_i, q, start_n, k_base, v_base, m_base, stride_kn, stride_kd, stride_vn, stride_vd,
                stride_mm, stride_mn, rows, L, S, qk_scale, HEAD_DIM, BLOCK_D, BLOCK_N, CAUSAL, BOUNDS, MASK_KIND,
            )  # fmt: skip
    else:
        for start_n in range(lo, hi, BLOCK_N):
            acc, l_i, m_i = _fwd_step(
                acc, l_i, m_i, q, start_n, k_base, v_base, m_base, stride_kn, stride_kd, stride_vn, stride_vd,
                stride_mm, stride_mn, rows, L, S, qk_scale, HEAD_DIM, BLOCK_D, BLOCK_N, CAUSAL, BOUNDS, MASK_KIND,
            )  # fmt: skip
    return acc, l_i, m_i


@triton.jit
def _fwd_kernel(
    Q, K, V, M, O, LSE,
    sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
    smb, smh, smm, smn, sob, soh, som, sod,
    H, GROUP, L, S, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr, STORE_LSE: tl.constexpr, WS: tl.constexpr,
):  # fmt: skip
    n_m = tl.cdiv(L, BLOCK_M)
    start_m = (n_m - 1 - tl.program_id(0)) * BLOCK_M  # longest (causal) rows first
    off_bh = tl.program_id(1)
    b = (off_bh // H).to(tl.int64)
    h = off_bh % H
    hk = (h // GROUP).to(tl.int64)
    h = h.to(tl.int64)
    rows = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = rows < L
    d_ok = offs_d < HEAD_DIM
    q_ptrs = Q + b * sqb + h * sqh + rows[:, None] * sqm + offs_d[None, :] * sqd
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh
    m_base = M + b * smb + h * smh
    if MASK_KIND == 0:  # every row sees key 0 in its first key block: the running max is finite from there on
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    else:
        # A user mask may hide every key of a row for one or more key blocks (or all of them). The running max
        # starts at the lowest finite float32 instead of -inf: it is below every finite score, so it is the true
        # row max as soon as the row sees a key (a later block of very negative scores is shifted by its own
        # max), and exp2(qk - m) and exp2(m_i - m_new) never meet (-inf) - (-inf) while a row has seen nothing
        # (p = exp2(-inf) = 0, alpha = 1 with l_i = acc = 0). No per-block select; a row that never sees a key
        # keeps l_i = 0: out = 0/0 = NaN and lse = +inf.
        m_i = tl.full([BLOCK_M], -3.4028234663852886e38, tl.float32)  # FLOAT32_LOWEST
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if CAUSAL:
        end = tl.minimum(start_m + BLOCK_M, S)
        full = tl.minimum(start_m, (S // BLOCK_N) * BLOCK_N)  # blocks left of the diagonal: no mask
    else:
        end = S
        full = (S // BLOCK_N) * BLOCK_N
    if MASK_KIND == 0:
        acc, l_i, m_i = _fwd_block(
            acc, l_i, m_i, q, k_base, v_base, m_base, skn, skd, svn, svd, smm, smn, rows, 0, full, L, S, qk_scale,
            HEAD_DIM, BLOCK_D, BLOCK_N, False, False, MASK_KIND, WS,
        )  # fmt: skip
        acc, l_i, m_i = _fwd_block(
            acc, l_i, m_i, q, k_base, v_base, m_base, skn, skd, svn, svd, smm, smn, rows, full, end, L, S, qk_scale,
            HEAD_DIM, BLOCK_D, BLOCK_N, CAUSAL, True, MASK_KIND,
        )  # fmt: skip
    else:
        acc, l_i, m_i = _fwd_block(
            acc, l_i, m_i, q, k_base, v_base, m_base, skn, skd, svn, svd, smm, smn, rows, 0, end, L, S, qk_scale,
            HEAD_DIM, BLOCK_D, BLOCK_N, CAUSAL, True, MASK_KIND,
        )  # fmt: skip
    out = acc / l_i[:, None]  # 0/0 = NaN for a row that saw no key, as PyTorch's math backend
    o_ptrs = O + b * sob + h * soh + rows[:, None] * som + offs_d[None, :] * sod
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    if STORE_LSE:
        lse = tl.where(l_i > 0, (m_i + tl.log2(l_i)) * 0.6931471805599453, float("inf"))
        tl.store(LSE + off_bh.to(tl.int64) * L + rows, lse, mask=row_ok)


@triton.jit
def _fwd_tma_step(
    acc, l_i, m_i, q, desc_k, desc_v, b, hk, start_n, rows, S, qk_scale,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, BOUNDS: tl.constexpr,
):  # fmt: skip
    k = desc_k.load([b, hk, start_n, 0]).reshape(BLOCK_N, BLOCK_D)
    qk = tl.dot(q, tl.trans(k))
    if CAUSAL or BOUNDS:
        cols = start_n + tl.arange(0, BLOCK_N)
        qk = qk * qk_scale
        if CAUSAL:
            qk = tl.where(rows[:, None] >= cols[None, :], qk, float("-inf"))
        if BOUNDS:
            qk = tl.where(cols[None, :] < S, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_new[:, None])
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.exp2(qk * qk_scale - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    v = desc_v.load([b, hk, start_n, 0]).reshape(BLOCK_N, BLOCK_D)
    acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, l_i, m_new


@triton.jit
def _fwd_tma_kernel(
    desc_q, desc_k, desc_v, O, LSE, sob, soh, som, sod, H, GROUP, L, S, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, STORE_LSE: tl.constexpr, WS: tl.constexpr,
):  # fmt: skip
    """The forward without a user mask, loading tiles with the tensor-memory accelerator (sm90+)."""
    n_m = tl.cdiv(L, BLOCK_M)
    start_m = (n_m - 1 - tl.program_id(0)) * BLOCK_M
    off_bh = tl.program_id(1)
    b = off_bh // H
    h = off_bh % H
    hk = h // GROUP
    rows = start_m + tl.arange(0, BLOCK_M)
    q = desc_q.load([b, h, start_m, 0]).reshape(BLOCK_M, BLOCK_D)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if CAUSAL:
        end = tl.minimum(start_m + BLOCK_M, S)
        full = tl.minimum(start_m, (S // BLOCK_N) * BLOCK_N)
    else:
        end = S
        full = (S // BLOCK_N) * BLOCK_N
    if WS:
        for start_n in tl.range(0, full, BLOCK_N, warp_specialize=True):
            acc, l_i, m_i = _fwd_tma_step(acc, l_i, m_i, q, desc_k, desc_v, b, hk, start_n, rows, S, qk_scale,
                                          BLOCK_D, BLOCK_N, False, False)  # fmt: skip
    else:
        for start_n in range(0, full, BLOCK_N):
            acc, l_i, m_i = _fwd_tma_step(acc, l_i, m_i, q, desc_k, desc_v, b, hk, start_n, rows, S, qk_scale,
                                          BLOCK_D, BLOCK_N, False, False)  # fmt: skip
    for start_n in range(full, end, BLOCK_N):
        acc, l_i, m_i = _fwd_tma_step(acc, l_i, m_i, q, desc_k, desc_v, b, hk, start_n, rows, S, qk_scale,
                                      BLOCK_D, BLOCK_N, CAUSAL, True)  # fmt: skip
    out = acc / l_i[:, None]
    offs_d = tl.arange(0, BLOCK_D)
    ok = (rows[:, None] < L) & (offs_d[None, :] < HEAD_DIM)
    b64, h64 = b.to(tl.int64), h.to(tl.int64)
    o_ptrs = O + b64 * sob + h64 * soh + rows[:, None] * som + offs_d[None, :] * sod
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=ok)
    if STORE_LSE:
        lse = (m_i + tl.log2(l_i)) * 0.6931471805599453
        tl.store(LSE + off_bh.to(tl.int64) * L + rows, lse, mask=rows < L)


def tma_ready(*tensors: torch.Tensor) -> bool:
    """Tensor descriptors need a CUDA sm90+ device, 16-byte aligned bases and strides, unit last stride."""
    for t in tensors:
        if not t.is_cuda or t.stride(-1) != 1 or t.data_ptr() % 16:
            return False
        if any((s * t.element_size()) % 16 for s in t.stride()[:-1]):
            return False
    return torch.cuda.get_device_capability(tensors[0].device) >= (9, 0)


def _descriptor(t: torch.Tensor, rows: int, bd: int) -> object:
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, bd])


def _strides4(t: torch.Tensor | None) -> tuple[int, int, int, int]:
    return (0, 0, 0, 0) if t is None else tuple(t.stride())  # type: ignore[return-value]


def block_d(head_dim: int) -> int:
    return max(16, triton.next_power_of_2(head_dim))


def mask_kind(mask: torch.Tensor | None) -> int:
    if mask is None:
        return MASK_NONE
    return MASK_BOOL if mask.dtype == torch.bool else MASK_ADD


def forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor | None,
    mask: torch.Tensor | None, causal: bool, scale: float, cfg: FwdConfig,
) -> object:  # fmt: skip
    """q, out [B, H, L, D]; k, v [B, Hk, S, D]; mask broadcast (expanded) to [B, H, L, S]; lse [B*H*L] fp32."""
    B, H, L, D = q.shape
    Hk, S = k.shape[1], k.shape[2]
    grid = (triton.cdiv(L, cfg.block_m), B * H)
    if cfg.tma and mask is None and tma_ready(q, k, v):
        bd = block_d(D)
        return _fwd_tma_kernel[grid](  # descriptors: Triton's own launch path
            _descriptor(q, cfg.block_m, bd), _descriptor(k, cfg.block_n, bd), _descriptor(v, cfg.block_n, bd),
            out, out if lse is None else lse, *out.stride(), H, H // Hk, L, S, scale * LOG2E,
            HEAD_DIM=D, BLOCK_D=bd, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, CAUSAL=causal,
            STORE_LSE=lse is not None, WS=cfg.ws, num_warps=cfg.warps, num_stages=cfg.stages,
        )  # fmt: skip
    return launch(
        _fwd_kernel, grid, q, k, v, q if mask is None else mask, out, out if lse is None else lse,
        *q.stride(), *k.stride(), *v.stride(), *_strides4(mask), *out.stride(),
        H, H // Hk, L, S, scale * LOG2E,
        HEAD_DIM=D, BLOCK_D=block_d(D), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        CAUSAL=causal, MASK_KIND=mask_kind(mask), STORE_LSE=lse is not None, WS=cfg.ws,
        num_warps=cfg.warps, num_stages=cfg.stages,
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------
# backward
# ------------------------------------------------------------------------------------------------


@triton.jit
def _delta_kernel(O, DO, DELTA, sob, soh, som, sod, sdb, sdh, sdm, sdd, H, L,
                  HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr):  # fmt: skip
    off_bh = tl.program_id(1)
    b = (off_bh // H).to(tl.int64)
    h = (off_bh % H).to(tl.int64)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    ok = (rows[:, None] < L) & (offs_d[None, :] < HEAD_DIM)
    o = tl.load(O + b * sob + h * soh + rows[:, None] * som + offs_d[None, :] * sod, mask=ok, other=0.0)
    do = tl.load(DO + b * sdb + h * sdh + rows[:, None] * sdm + offs_d[None, :] * sdd, mask=ok, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    delta = tl.where(delta == delta, delta, 0.0)  # out is NaN on rows that saw no key: no gradient there
    tl.store(DELTA + off_bh.to(tl.int64) * L + rows, delta, mask=rows < L)


@triton.jit
def _dkdv_block(
    dk, dv, k, v, q_base, do_base, m_base, lse_base, delta_base,
    sqm, sqd, sdm, sdd, smm, smn, cols, lo, hi, L, S, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    CAUSAL: tl.constexpr, BOUNDS: tl.constexpr, MASK_KIND: tl.constexpr,
):  # fmt: skip
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    for start_m in range(lo, hi, BLOCK_M):
        rows = start_m + offs_m
        qt_ptrs = q_base + rows[None, :] * sqm + offs_d[:, None] * sqd
        do_ptrs = do_base + rows[:, None] * sdm + offs_d[None, :] * sdd
        if BOUNDS:
            qt = tl.load(qt_ptrs, mask=(rows[None, :] < L) & d_ok[:, None], other=0.0)
            lse = tl.load(lse_base + rows, mask=rows < L, other=float("inf"))
        elif HEAD_DIM != BLOCK_D:
            qt = tl.load(qt_ptrs, mask=d_ok[:, None], other=0.0)
            lse = tl.load(lse_base + rows)
        else:
            qt = tl.load(qt_ptrs)
            lse = tl.load(lse_base + rows)
        qkt = tl.dot(k, qt)  # [BLOCK_N, BLOCK_M]: scores transposed
        if MASK_KIND == 0:
            pt = tl.exp2(qkt * qk_scale - lse[None, :] * 1.4426950408889634)
        else:
            m_ptrs = m_base + rows[None, :] * smm + cols[:, None] * smn
            inside = (rows[None, :] < L) & (cols[:, None] < S)
            st = qkt * qk_scale
            if MASK_KIND == 1:
                st = tl.where(tl.load(m_ptrs, mask=inside, other=0) != 0, st, float("-inf"))
            else:
                st = st + tl.load(m_ptrs, mask=inside, other=0.0).to(tl.float32) * 1.4426950408889634
            pt = tl.exp2(st - lse[None, :] * 1.4426950408889634)
        if CAUSAL:
            pt = tl.where(rows[None, :] >= cols[:, None], pt, 0.0)
        if BOUNDS:
            do = tl.load(do_ptrs, mask=(rows[:, None] < L) & d_ok[None, :], other=0.0)
            delta = tl.load(delta_base + rows, mask=rows < L, other=0.0)
        elif HEAD_DIM != BLOCK_D:
            do = tl.load(do_ptrs, mask=d_ok[None, :], other=0.0)
            delta = tl.load(delta_base + rows)
        else:
            do = tl.load(do_ptrs)
            delta = tl.load(delta_base + rows)
        dv = tl.dot(pt.to(do.dtype), do, dv)
        dpt = tl.dot(v, tl.trans(do))
        dst = pt * (dpt - delta[None, :])
        dk = tl.dot(dst.to(qt.dtype), tl.trans(qt), dk)
    return dk, dv


@triton.jit
def _dkdv_kernel(
    Q, K, V, M, DO, LSE, DELTA, DK, DV,
    sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, smb, smh, smm, smn,
    sdb, sdh, sdm, sdd, skb2, skh2, skn2, skd2, svb2, svh2, svn2, svd2,
    H, HK, GROUP, L, S, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr,
):  # fmt: skip
    start_n = tl.program_id(0) * BLOCK_N
    off_bhk = tl.program_id(1)
    b = (off_bhk // HK).to(tl.int64)
    hk = (off_bhk % HK).to(tl.int64)
    cols = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    ok = (cols[:, None] < S) & (offs_d[None, :] < HEAD_DIM)
    k = tl.load(K + b * skb + hk * skh + cols[:, None] * skn + offs_d[None, :] * skd, mask=ok, other=0.0)
    v = tl.load(V + b * svb + hk * svh + cols[:, None] * svn + offs_d[None, :] * svd, mask=ok, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    if CAUSAL:
        diag_end = start_n + BLOCK_N  # rows below this see the whole key block
        body_end = diag_end + tl.maximum(L - diag_end, 0) // BLOCK_M * BLOCK_M
    else:
        diag_end = 0
        body_end = (L // BLOCK_M) * BLOCK_M
    for g in range(GROUP):
        h = hk * GROUP + g
        q_base = Q + b * sqb + h * sqh
        do_base = DO + b * sdb + h * sdh
        m_base = M + b * smb + h * smh
        lse_base = LSE + (b * H + h) * L
        delta_base = DELTA + (b * H + h) * L
        if CAUSAL:
            dk, dv = _dkdv_block(
                dk, dv, k, v, q_base, do_base, m_base, lse_base, delta_base, sqm, sqd, sdm, sdd, smm, smn, cols,
                start_n, diag_end, L, S, qk_scale, HEAD_DIM, BLOCK_D, BLOCK_M, True, True, MASK_KIND,
            )  # fmt: skip
        if MASK_KIND == 0:
            dk, dv = _dkdv_block(
                dk, dv, k, v, q_base, do_base, m_base, lse_base, delta_base, sqm, sqd, sdm, sdd, smm, smn, cols,
                diag_end, body_end, L, S, qk_scale, HEAD_DIM, BLOCK_D, BLOCK_M, False, False, MASK_KIND,
            )  # fmt: skip
            dk, dv = _dkdv_block(
                dk, dv, k, v, q_base, do_base, m_base, lse_base, delta_base, sqm, sqd, sdm, sdd, smm, smn, cols,
                body_end, L, L, S, qk_scale, HEAD_DIM, BLOCK_D, BLOCK_M, False, True, MASK_KIND,
            )  # fmt: skip
        else:
            dk, dv = _dkdv_block(
                dk, dv, k, v, q_base, do_base, m_base, lse_base, delta_base, sqm, sqd, sdm, sdd, smm, smn, cols,
                diag_end, L, L, S, qk_scale, HEAD_DIM, BLOCK_D, BLOCK_M, False, True, MASK_KIND,
            )  # fmt: skip
    dk = dk * sm_scale
    tl.store(DK + b * skb2 + hk * skh2 + cols[:, None] * skn2 + offs_d[None, :] * skd2, dk.to(DK.dtype.element_ty),
             mask=ok)  # fmt: skip
    tl.store(DV + b * svb2 + hk * svh2 + cols[:, None] * svn2 + offs_d[None, :] * svd2, dv.to(DV.dtype.element_ty),
             mask=ok)  # fmt: skip


@triton.jit
def _dq_block(
    dq, q, do, lse, delta, k_base, v_base, m_base, skn, skd, svn, svd, smm, smn, rows, lo, hi, L, S, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, BOUNDS: tl.constexpr, MASK_KIND: tl.constexpr,
):  # fmt: skip
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        kt_ptrs = k_base + cols[None, :] * skn + offs_d[:, None] * skd
        vt_ptrs = v_base + cols[None, :] * svn + offs_d[:, None] * svd
        if BOUNDS:
            kt = tl.load(kt_ptrs, mask=(cols[None, :] < S) & d_ok[:, None], other=0.0)
            vt = tl.load(vt_ptrs, mask=(cols[None, :] < S) & d_ok[:, None], other=0.0)
        elif HEAD_DIM != BLOCK_D:
            kt = tl.load(kt_ptrs, mask=d_ok[:, None], other=0.0)
            vt = tl.load(vt_ptrs, mask=d_ok[:, None], other=0.0)
        else:
            kt = tl.load(kt_ptrs)
            vt = tl.load(vt_ptrs)
        qk = tl.dot(q, kt)
        if MASK_KIND == 0:
            p = tl.exp2(qk * qk_scale - lse[:, None])
        else:
            m_ptrs = m_base + rows[:, None] * smm + cols[None, :] * smn
            inside = (rows[:, None] < L) & (cols[None, :] < S)
            s = qk * qk_scale
            if MASK_KIND == 1:
                s = tl.where(tl.load(m_ptrs, mask=inside, other=0) != 0, s, float("-inf"))
            else:
                s = s + tl.load(m_ptrs, mask=inside, other=0.0).to(tl.float32) * 1.4426950408889634
            p = tl.exp2(s - lse[:, None])
        if CAUSAL:
            p = tl.where(rows[:, None] >= cols[None, :], p, 0.0)
        if BOUNDS:
            p = tl.where(cols[None, :] < S, p, 0.0)
        dp = tl.dot(do, vt)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(kt.dtype), tl.trans(kt), dq)
    return dq


@triton.jit
def _dq_kernel(
    Q, K, V, M, DO, LSE, DELTA, DQ,
    sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, smb, smh, smm, smn,
    sdb, sdh, sdm, sdd, sqb2, sqh2, sqm2, sqd2,
    H, GROUP, L, S, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, MASK_KIND: tl.constexpr,
):  # fmt: skip
    n_m = tl.cdiv(L, BLOCK_M)
    start_m = (n_m - 1 - tl.program_id(0)) * BLOCK_M
    off_bh = tl.program_id(1)
    b = (off_bh // H).to(tl.int64)
    h = off_bh % H
    hk = (h // GROUP).to(tl.int64)
    h = h.to(tl.int64)
    rows = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = rows < L
    ok = row_ok[:, None] & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqm + offs_d[None, :] * sqd, mask=ok, other=0.0)
    do = tl.load(DO + b * sdb + h * sdh + rows[:, None] * sdm + offs_d[None, :] * sdd, mask=ok, other=0.0)
    lse = tl.load(LSE + off_bh.to(tl.int64) * L + rows, mask=row_ok, other=float("inf")) * 1.4426950408889634
    delta = tl.load(DELTA + off_bh.to(tl.int64) * L + rows, mask=row_ok, other=0.0)
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh
    m_base = M + b * smb + h * smh
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if CAUSAL:
        end = tl.minimum(start_m + BLOCK_M, S)
        full = tl.minimum(start_m, (S // BLOCK_N) * BLOCK_N)
    else:
        end = S
        full = (S // BLOCK_N) * BLOCK_N
    if MASK_KIND == 0:
        dq = _dq_block(
            dq, q, do, lse, delta, k_base, v_base, m_base, skn, skd, svn, svd, smm, smn, rows, 0, full, L, S,
            qk_scale, HEAD_DIM, BLOCK_D, BLOCK_N, False, False, MASK_KIND,
        )  # fmt: skip
        dq = _dq_block(
            dq, q, do, lse, delta, k_base, v_base, m_base, skn, skd, svn, svd, smm, smn, rows, full, end, L, S,
            qk_scale, HEAD_DIM, BLOCK_D, BLOCK_N, CAUSAL, True, MASK_KIND,
        )  # fmt: skip
    else:
        dq = _dq_block(
            dq, q, do, lse, delta, k_base, v_base, m_base, skn, skd, svn, svd, smm, smn, rows, 0, end, L, S,
            qk_scale, HEAD_DIM, BLOCK_D, BLOCK_N, CAUSAL, True, MASK_KIND,
        )  # fmt: skip
    dq = dq * sm_scale
    tl.store(DQ + b * sqb2 + h * sqh2 + rows[:, None] * sqm2 + offs_d[None, :] * sqd2, dq.to(DQ.dtype.element_ty),
             mask=ok)  # fmt: skip


def backward(
    do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
    mask: torch.Tensor | None, causal: bool, scale: float, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor,
    cfg: BwdConfig, delta: torch.Tensor | None = None,
) -> None:  # fmt: skip
    """Gradients into dq [B, H, L, D], dk/dv [B, Hk, S, D]; lse [B*H*L] natural-log fp32 from forward."""
    B, H, L, _ = q.shape
    if delta is None:
        delta = torch.empty(B * H * L, dtype=torch.float32, device=q.device)
    launch_delta(out, do, delta)
    launch_dkdv(do, q, k, v, lse, delta, mask, causal, scale, dk, dv, cfg.dkdv)
    launch_dq(do, q, k, v, lse, delta, mask, causal, scale, dq, cfg.dq)


def launch_delta(out: torch.Tensor, do: torch.Tensor, delta: torch.Tensor) -> None:
    B, H, L, D = out.shape
    launch(
        _delta_kernel, (triton.cdiv(L, 64), B * H), out, do, delta, *out.stride(), *do.stride(), H, L,
        HEAD_DIM=D, BLOCK_D=block_d(D), BLOCK_M=64,
    )  # fmt: skip


def launch_dkdv(
    do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lse: torch.Tensor, delta: torch.Tensor,
    mask: torch.Tensor | None, causal: bool, scale: float, dk: torch.Tensor, dv: torch.Tensor, cfg: FwdConfig,
) -> object:  # fmt: skip
    B, H, L, D = q.shape
    Hk, S = k.shape[1], k.shape[2]
    return launch(
        _dkdv_kernel, (triton.cdiv(S, cfg.block_n), B * Hk),
        q, k, v, q if mask is None else mask, do, lse, delta, dk, dv,
        *q.stride(), *k.stride(), *v.stride(), *_strides4(mask), *do.stride(), *dk.stride(), *dv.stride(),
        H, Hk, H // Hk, L, S, scale * LOG2E, scale,
        HEAD_DIM=D, BLOCK_D=block_d(D), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, CAUSAL=causal,
        MASK_KIND=mask_kind(mask), num_warps=cfg.warps, num_stages=cfg.stages,
    )  # fmt: skip


def launch_dq(
    do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lse: torch.Tensor, delta: torch.Tensor,
    mask: torch.Tensor | None, causal: bool, scale: float, dq: torch.Tensor, cfg: FwdConfig,
) -> object:  # fmt: skip
    B, H, L, D = q.shape
    Hk, S = k.shape[1], k.shape[2]
    return launch(
        _dq_kernel, (triton.cdiv(L, cfg.block_m), B * H),
        q, k, v, q if mask is None else mask, do, lse, delta, dq,
        *q.stride(), *k.stride(), *v.stride(), *_strides4(mask), *do.stride(), *dq.stride(),
        H, H // Hk, L, S, scale * LOG2E, scale,
        HEAD_DIM=D, BLOCK_D=block_d(D), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, CAUSAL=causal,
        MASK_KIND=mask_kind(mask), num_warps=cfg.warps, num_stages=cfg.stages,
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------
# launch configurations
# ------------------------------------------------------------------------------------------------

# Tuned on an H100 (bf16 B4 H16 S2048), per (head-dim bucket, causal): block sizes, warps, stages.
FWD_CONFIGS: dict[tuple[int, bool], FwdConfig] = {
    (32, False): FwdConfig(64, 64, 4, 3),
    (32, True): FwdConfig(64, 64, 4, 3),
    (64, False): FwdConfig(64, 64, 4, 3),
    (64, True): FwdConfig(64, 64, 4, 3),
    (128, False): FwdConfig(128, 128, 8, 3),
    (128, True): FwdConfig(64, 64, 4, 3),
    (256, False): FwdConfig(64, 32, 4, 2),
    (256, True): FwdConfig(64, 32, 4, 2),
}
_BWD_SMALL_D = BwdConfig(FwdConfig(64, 64, 4, 2), FwdConfig(128, 64, 8, 3))
BWD_CONFIGS: dict[tuple[int, bool], BwdConfig] = {
    (32, False): _BWD_SMALL_D,
    (32, True): _BWD_SMALL_D,
    (64, False): _BWD_SMALL_D,
    (64, True): _BWD_SMALL_D,
    (128, False): BwdConfig(FwdConfig(64, 64, 4, 2), FwdConfig(128, 64, 8, 3)),
    (128, True): BwdConfig(FwdConfig(64, 64, 4, 2), FwdConfig(128, 64, 8, 3)),
    (256, False): BwdConfig(FwdConfig(16, 32, 8, 1), FwdConfig(32, 16, 8, 1)),
    (256, True): BwdConfig(FwdConfig(16, 32, 8, 1), FwdConfig(32, 16, 8, 1)),
}
# Forward candidates timed once per shape bucket on first use (the table's entry first), by device time from a
# cold L2 (benchmarks/probes/flash_fwd_sweep.py): on the H100 at D128 non-causal, 64x64/w4/s3 with TMA loads wins at
# S1024-S2048 (491 TFLOP/s at S2048, 1.45x PyTorch's flash; 2 CTAs per SM at 138 registers) and
# 128x128/w8/s3 at S4096-S8192. Warp specialization changed nothing there with Triton 3.6.
_TMA_64 = FwdConfig(64, 64, 4, 3, tma=True)
FWD_CANDIDATES: dict[tuple[int, bool], tuple[FwdConfig, ...]] = {
    (64, False): (FwdConfig(64, 64, 4, 3), FwdConfig(128, 64, 8, 3), _TMA_64),
    (64, True): (FwdConfig(64, 64, 4, 3), FwdConfig(128, 64, 8, 3), _TMA_64),
    (128, False): (FwdConfig(128, 128, 8, 3), FwdConfig(128, 64, 8, 3), FwdConfig(64, 64, 4, 3), _TMA_64),
    (128, True): (FwdConfig(64, 64, 4, 3), FwdConfig(128, 64, 8, 3), _TMA_64),
}
SMALL_FWD = FwdConfig(16, 16, 1, 1)  # the interpreter: few, tiny programs
SMALL_BWD = BwdConfig(SMALL_FWD, SMALL_FWD)


def _bucket(head_dim: int) -> int:
    """The tables' head-dim bucket: head dims up to 16 (BLOCK_D 16) take the 32 row."""
    return max(32, block_d(head_dim))


def fwd_config(head_dim: int, causal: bool = False, interpreted: bool = False) -> FwdConfig:
    return SMALL_FWD if interpreted else FWD_CONFIGS[(_bucket(head_dim), causal)]


def bwd_config(head_dim: int, causal: bool = False, interpreted: bool = False) -> BwdConfig:
    return SMALL_BWD if interpreted else BWD_CONFIGS[(_bucket(head_dim), causal)]


def fwd_flops(B: int, H: int, L: int, S: int, D: int, causal: bool) -> float:
    f = 4.0 * B * H * L * S * D
    return f / 2 if causal else f
