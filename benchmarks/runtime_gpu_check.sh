#!/usr/bin/env bash
# The runtime engineer's GPU run: runtime/dispatch/bench/CLI tests on the GPU, the dispatch-overhead rows
# (CPU and CUDA), `xpuruntime info` and `xpuruntime demo`. Logs and JSON go to $OUT (default ./gpu-out);
# a short summary is printed last. Usage: bash benchmarks/runtime_gpu_check.sh
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())'
timeout 240 python3 -m pytest -q -p no:cacheprovider -rs tests/core/test_cuda_dispatch.py tests/runtime/test_runtime_allocator.py \
    tests/runtime/test_runtime_streams.py tests/runtime/test_runtime_tuning_cache.py tests/cli/test_bench.py tests/cli/test_cli.py tests/cli/test_demo.py \
    > "$OUT/pytest_runtime_gpu.txt" 2>&1
timeout 240 python3 benchmarks/dispatch_overhead.py --fast-stream --json "$OUT/dispatch_overhead_gpu.json" > "$OUT/dispatch_overhead_gpu.txt" 2>&1
timeout 60 python3 -m xpuruntime info > "$OUT/info_gpu.txt" 2>&1
timeout 120 python3 -m xpuruntime demo --iterations 1 > "$OUT/demo_gpu.txt" 2>&1
echo "demo exit code: $?"
echo "== info (tail)"; tail -22 "$OUT/info_gpu.txt"
echo "== demo (tail)"; tail -30 "$OUT/demo_gpu.txt"
echo "== pytest"; grep -E "FAILED|ERROR|SKIPPED|passed|failed" "$OUT/pytest_runtime_gpu.txt" | tail -30
echo "== dispatch overhead"; cat "$OUT/dispatch_overhead_gpu.txt"
