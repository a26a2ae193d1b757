#!/usr/bin/env bash
# The runtime engineer's GPU run: runtime/dispatch/bench tests on the GPU, then the dispatch-overhead
# rows (CPU and CUDA). Writes logs and JSON into $OUT (or ./gpu-out). Usage: bash benchmarks/runtime_gpu_check.sh
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())'
timeout 240 python3 -m pytest -q -p no:cacheprovider -rs tests/test_cuda_dispatch.py tests/test_runtime_allocator.py \
    tests/test_runtime_streams.py tests/test_runtime_tuning_cache.py tests/test_bench.py 2>&1 | tee "$OUT/pytest_runtime_gpu.txt"
timeout 200 python3 benchmarks/dispatch_overhead.py --json "$OUT/dispatch_overhead_gpu.json" 2>&1 | tee "$OUT/dispatch_overhead_gpu.txt"
