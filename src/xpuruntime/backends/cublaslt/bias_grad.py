"""The planner behind the fused_cast linear's backward: dW and db from one cuBLASLt GEMM (BGRADB epilogue).

With fp32 master weight and bias, dW = dy^T x (fp32 from the accumulator) and db = the column sums of dy
come out of one cuBLASLt matmul whose BGRADB epilogue reduces dy as the GEMM reads it. The C++ node that
launches it (pytorch/native_routes.cpp) asks `plan_weight_and_bias_grad` once per problem for the raw
cuBLASLt launch arguments; every plan handed out stays alive for the process, since C++ holds its pointers.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import torch

from .common import pointer_alignment, probe
from .linear import weight_and_bias_grad_plan

_plans: dict[tuple, tuple[Any, tuple[int, ...]] | None] = {}  # problem -> (plan, its launch arguments) or None
_lock = threading.Lock()


def plan_weight_and_bias_grad(rows: torch.Tensor, dy: torch.Tensor) -> tuple[int, ...] | bool | None:
    """The raw cuBLASLt launch arguments of a BGRADB GEMM for dW and db of this problem (shapes, dtype, device
    and the alignment of rows and dy); None where cuBLASLt cannot, False to be asked again (planning now
    would break a CUDA graph being captured)."""
    alignments = tuple(pointer_alignment(t.data_ptr()) for t in (rows, dy))
    key = (dy.device, dy.dtype, *rows.shape, dy.shape[1], *alignments)
    with _lock:  # one plan per problem: C++ may hold the first one's pointers
        if key not in _plans:
            if torch.cuda.is_current_stream_capturing():
                return False
            _plans[key] = _new_plan(rows, dy)
        found = _plans[key]
    return None if found is None else found[1]


def _new_plan(rows: torch.Tensor, dy: torch.Tensor) -> tuple[Any, tuple[int, ...]] | None:
    if probe() is not None:
        return None
    try:
        plan = weight_and_bias_grad_plan(rows, dy)
    except Exception as exc:  # e.g. no cuBLASLt algorithm for this problem: the unfused backward serves
        logging.getLogger("xpuruntime").info("fused_cast backward: no BGRADB plan for %s (%s)", tuple(dy.shape), exc)
        return None
    args = plan.entry_args()
    if args is None:
        plan.free()
        return None
    return plan, args
