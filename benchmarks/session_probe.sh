#!/usr/bin/env bash
# One device call that profiles the GPT training step per policy (top GPU kernels of the last steps)
# and times the InferenceSession on the GPU. Usage (device tool, carry .whl): bash benchmarks/session_probe.sh
set -uo pipefail
OUT=${OUT:-/tmp/xrt-probe}
mkdir -p "$OUT"
source "$(dirname "$0")/device_env.sh"
for policy in "" "matmul=cublasLt" "attention=flash_v2" "matmul=cublasLt,attention=flash_v2" "AUTOTUNE"; do
    extra=(--policy "$policy")
    [ "$policy" = AUTOTUNE ] && extra=(--autotune)
    echo "=== policy '$policy'"
    timeout 120 python3 examples/train_gpt.py --steps 14 --profile-steps 3 "${extra[@]}" 2>&1 | grep -v '^ *aten::\|^ *cuda\|^ *Memcpy\|^ *Memset' | tail -40
done 2>&1 | tee "$OUT/train_profile.txt" | grep -E "===|median step"
[ "${SKIP_INFERENCE:-0}" = 1 ] || timeout 330 python3 benchmarks/inference_gpu.py "$OUT" 2>&1 | tail -40
