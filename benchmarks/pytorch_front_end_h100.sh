#!/usr/bin/env bash
# The PyTorch front end on the H100, from the repo root, in under 5 minutes: the GPU tests of tests/pytorch/
# (eager routes, torch.compile with our kernels, reduce-overhead and CUDAGraphWrapper captures) and the
# host-cost microbenchmarks (scope entry, routed norm forward+backward against PyTorch, attention with the
# scope opened per call). Results go to benchmarks/results/pytorch_front_end_h100/.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/results/pytorch_front_end_h100
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
python3 -c "from xpuruntime.pytorch import native as n; n.load(); print('aten routes:', n.status())" | tee "$OUT/build.txt"
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/pytorch/ 2>&1 | tail -25 | tee "$OUT/gpu_tests.txt"
timeout 120 python3 benchmarks/pytorch_front_end.py --json "$OUT/microbench.json" 2>&1 | tee "$OUT/microbench.txt"
