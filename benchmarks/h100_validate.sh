#!/usr/bin/env bash
# The whole-project check on the H100 (device tool, `carry: [".whl"]`): every test, GPU ones included,
# then the benchmark rows named in $ROWS (all rows when empty). Logs go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/xrt-validate}
mkdir -p "$OUT"
source "$(dirname "$0")/device_env.sh"
nvidia-smi -L
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
python3 -c "from xpuruntime.pytorch import native as n; n.load(); print('aten routes:', n.status())"
python3 -m pytest -q -p no:cacheprovider -n 8 -rs 2>&1 | tee "$OUT/pytest_h100.txt" | tail -30
if [ "${SKIP_BENCH:-0}" != 1 ]; then
    python3 -m xpuruntime.bench ${ROWS:+--only "$ROWS"} --out "$OUT/bench" 2>&1 | tail -90
fi
