#!/usr/bin/env bash
# Issue 8's 2-GPU check (device kind nvidia-h200-x2, carry .whl): the GPT example with the policy on one
# GPU, then under torchrun with DDP on two (same global batch); per-step losses compared, kernels per rank.
set -uo pipefail
OUT=${OUT:-/tmp/xrt-ddp}
mkdir -p "$OUT"
source "$(dirname "$0")/device_env.sh"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # the machine's rule
POLICY=${POLICY:-matmul=cublasLt,attention=flash_v2}
STEPS=${STEPS:-30}
nvidia-smi -L
python3 examples/train_gpt.py --steps "$STEPS" --policy "$POLICY" --json "$OUT/one_gpu.json" 2>&1 | tail -8
torchrun --standalone --nproc_per_node 2 examples/train_gpt.py --steps "$STEPS" --policy "$POLICY" \
    --json "$OUT/ddp.json" 2>&1 | grep -v "^W1\|OMP_NUM_THREADS\|^\*" | tail -16
python3 -m xpuruntime.bench.training --ddp-compare "$OUT/one_gpu.json" "$OUT/ddp.rank0.json" "$OUT/ddp.rank1.json" \
    --out "$OUT" --name ddp_compare
