#!/usr/bin/env bash
# Session 14 on the GPU machine: the C plan-cache hit. Builds the extension, runs the hot-path and dispatch
# tests, then the CUDA dispatch-overhead bench in RUNS pairs of processes (C hits, then the Python-hits control).
#   OUT=dir RUNS=3 bash benchmarks/hot_path_h100.sh
set -u
source benchmarks/device_env.sh
export XPURUNTIME_CACHE_DIR=${XPURUNTIME_CACHE_DIR:-/tmp/xrt_hot_path}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv | tee "$OUT/gpu.txt"
python3 -c "
import time; t = time.time()
from xpuruntime.runtime import extension
print('extension:', extension.load() is not None, extension.status(), f'{time.time() - t:.1f} s')" 2>&1 | tee "$OUT/extension.txt"
python3 -m pytest -q -p no:cacheprovider tests/core/test_native_hot_path.py tests/core/test_cuda_dispatch.py \
    tests/core/test_dispatch_hot_path.py tests/core/test_plan_cache.py tests/core/test_returns_output.py 2>&1 | tail -15 | tee "$OUT/pytest_hot_path.txt"
for i in $(seq 1 "${RUNS:-3}"); do
    python3 benchmarks/dispatch_overhead.py --cuda-only --json "$OUT/c_$i.json" 2>&1 | tee "$OUT/c_$i.txt"
    python3 benchmarks/dispatch_overhead.py --cuda-only --python-hits --json "$OUT/py_$i.json" 2>&1 | tee "$OUT/py_$i.txt"
done
