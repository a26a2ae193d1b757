#!/usr/bin/env bash
# One device call (carry .whl): the autocast_linear=fused_cast policy on the example. GPU tests, the eager
# step interleaved against no policy (and against fused_cast with dW and db from a GEMM and a sum),
# 50-step losses against no policy, and the captured step.
set -uo pipefail
OUT=${OUT:-/tmp/xrt-fused-cast}
mkdir -p "$OUT"
source "$(dirname "$0")/device_env.sh"
export XPURUNTIME_CACHE_DIR=${XPURUNTIME_CACHE_DIR:-/tmp/xrt-fused-cast-cache}
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/pytorch/test_pytorch_autocast_linear.py tests/pytorch/test_pytorch_gpu.py \
    tests/pytorch/test_pytorch_example.py tests/pytorch/test_pytorch_native_routes.py 2>&1 | tail -4
echo "=== step per policy, interleaved"
timeout 300 python3 benchmarks/step_diagnose.py --rounds ${ROUNDS:-20} none autocast_linear=fused_cast \
    autocast_linear=fused_cast/unfused-db autotune 2>&1 | grep -v Warning | tee "$OUT/step.txt" | grep -v "handed\|^  "
echo "=== 50 steps: losses with autocast_linear=fused_cast against none"
for policy in none autocast_linear=fused_cast; do
    args=(); [ "$policy" = none ] || args=(--policy "$policy")
    timeout 200 python3 examples/train_gpt.py --steps 50 "${args[@]}" --json "$OUT/losses_${policy%%=*}.json" 2>&1 \
        | grep -v Warning | tail -6
done
python3 - "$OUT" <<'PY'
import json, sys
a, b = (json.load(open(f"{sys.argv[1]}/losses_{n}.json")) for n in ("none", "autocast_linear"))
rel = max(abs(x - y) / abs(x) for x, y in zip(a["losses"], b["losses"]))
print(f"max relative loss difference over {len(a['losses'])} steps: {rel:.2e}; median step {a['median_step_ms']:.2f} vs {b['median_step_ms']:.2f} ms")
PY
echo "=== captured"
timeout 300 python3 benchmarks/captured_policies.py --steps 40 --out "$OUT/captured" --only eager graph \
    "graph autocast_linear=fused_cast" "eager autocast_linear=fused_cast" "eager (again)" 2>&1 | tee "$OUT/captured.txt"
