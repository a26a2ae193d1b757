#!/usr/bin/env bash
# The PyTorch front end on the H100, in one command from the repository root, in under 5 minutes:
#   bash benchmarks/pytorch_front_end_h100.sh
# the GPU tests of tests/pytorch/ (eager routes; torch.compile with our kernels, forward and backward;
# reduce-overhead and CUDAGraphWrapper captures), then the front end's host-cost rows of the bench (policy
# scope entry; F.layer_norm / F.rms_norm forward+backward routed to Triton against PyTorch at 8192x4096 and
# 16384x1024 bf16, wall time) into one result file in benchmarks/results/, then attention with the policy
# scope opened around each call (a probe). Logs go to $OUT (default /tmp/xrt-front-end).
set -uo pipefail
OUT=${OUT:-/tmp/xrt-front-end}
mkdir -p "$OUT"
source "$(dirname "$0")/device_env.sh"
python3 -c "from xpuruntime.pytorch import native as n; n.load(); print('aten routes:', n.status())" | tee "$OUT/build.txt"
timeout 200 python3 -m pytest -q -p no:cacheprovider -rs -m gpu tests/pytorch/ 2>&1 | tee "$OUT/gpu_tests.txt" | tail -25
timeout 120 python3 -m xpuruntime.bench --only scope --only routed --out benchmarks/results 2>&1 | tee "$OUT/bench.txt" | tail -20
timeout 60 python3 benchmarks/probes/attention_scope_per_call.py 2>&1 | tee "$OUT/attention_scope.txt"
