#!/usr/bin/env bash
# The whole project on a GPU machine, in one command from the repository root:
#   bash benchmarks/h100_validate.sh
# every test (GPU ones included), then every benchmark row into ONE result file in benchmarks/results/
# (with its .md and .png), then BENCHMARKS.md regenerated from the result files. ROWS="norm gemv" runs only
# the rows whose subject, group or name contains one of the words; SKIP_TESTS=1 / SKIP_BENCH=1 skip a part.
# Logs go to $OUT (default /tmp/xrt-validate). A command limited to 10 minutes runs the parts apart, e.g.
#   SKIP_BENCH=1 bash benchmarks/h100_validate.sh
#   SKIP_TESTS=1 ROWS=attention bash benchmarks/h100_validate.sh
#   SKIP_TESTS=1 ROWS="gemm norm elementwise host inference training" bash benchmarks/h100_validate.sh
# each bench part writes its own result file; the report keeps every row's newest figure.
set -uo pipefail
OUT=${OUT:-/tmp/xrt-validate}
mkdir -p "$OUT"
source "$(dirname "$0")/device_env.sh"
nvidia-smi -L
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
    jobs=()
    python3 -c "import xdist" 2>/dev/null && jobs=(-n "${JOBS:-8}")  # pytest-xdist, where installed
    python3 -m pytest -q -p no:cacheprovider -rs "${jobs[@]}" 2>&1 | tee "$OUT/pytest.txt" | tail -30
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
    only=()
    for word in ${ROWS:-}; do only+=(--only "$word"); done
    python3 -m xpuruntime.bench "${only[@]}" --out benchmarks/results 2>&1 | tee "$OUT/bench.txt" | tail -120
    python3 -m xpuruntime bench report benchmarks/results/*.json --output BENCHMARKS.md
fi
