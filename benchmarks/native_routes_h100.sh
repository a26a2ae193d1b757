#!/usr/bin/env bash
# The native aten routes on the H100 (device tool, `carry: [".whl"]`): build time, the override cost of a
# tiny matmul with and without them (three interleaved process pairs), the example's step per policy,
# and the dispatcher's overhead. Logs go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/xrt-native}
mkdir -p "$OUT"
source "$(dirname "$0")/device_env.sh"
python3 -c "import time; t = time.time(); from xpuruntime.pytorch import native as n; n.load(); print(n.status(), f'(first load {time.time() - t:.1f} s)')" 2>&1 | tee "$OUT/build.txt"
cost='from xpuruntime.bench.training import override_cost; import json, os; print(os.environ.get("XPURUNTIME_NATIVE", "1"), json.dumps(override_cost()))'
for i in 1 2 3; do
    python3 -c "$cost"
    XPURUNTIME_NATIVE=0 python3 -c "$cost"
done 2>&1 | tee "$OUT/override_cost.txt"
timeout 300 python3 benchmarks/step_diagnose.py --rounds 15 ${POLICIES:-none matmul=torch matmul=cublasLt autotune} 2>&1 | tail -30 | tee "$OUT/step.txt"
timeout 200 python3 benchmarks/dispatch_overhead.py --cuda-only 2>&1 | tail -30 | tee "$OUT/dispatch_overhead.txt"
