#!/usr/bin/env bash
# One device call (carry .whl): issue 8's example checks and step timings after the example's loop
# became PyTorch's recommended one (gradients set to None, fused AdamW). Key lines go to stdout.
set -uo pipefail
OUT=${OUT:-/tmp/xrt-loop}
mkdir -p "$OUT"
source "$(dirname "$0")/device_env.sh"
export XPURUNTIME_CACHE_DIR=${XPURUNTIME_CACHE_DIR:-/tmp/xrt-loop-cache}
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/pytorch/test_pytorch_gpu.py tests/pytorch/test_pytorch_example.py 2>&1 | tail -3
echo "=== step per policy, the example's loop (interleaved)"
timeout 240 python3 benchmarks/step_diagnose.py --rounds ${ROUNDS:-20} none autotune layer_norm=triton matmul=cublasLt \
    attention=flash_v2 2>&1 | grep -v Warning | tee "$OUT/step_loop.txt" | grep -v "handed\|^  "
echo "=== the loop up to session 14"
timeout 120 python3 benchmarks/step_diagnose.py --old-loop --rounds 10 none 2>&1 | tail -2 | tee "$OUT/step_old_loop.txt"
echo "=== captured step per policy"
[ "${SKIP_CAPTURED:-0}" = 1 ] || timeout 400 python3 benchmarks/captured_policies.py --steps 40 --out "$OUT/captured" 2>&1 | tee "$OUT/captured.txt"
