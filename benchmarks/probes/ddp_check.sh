#!/usr/bin/env bash
# The 2-GPU check (on a machine with two GPUs, nvmath-python's wheel in .whl/): the GPT example with the policy on one
# GPU, then under torchrun with DDP on two (same global batch); per-step losses compared, kernels per rank.
set -uo pipefail
OUT=${OUT:-/tmp/xrt-ddp}
mkdir -p "$OUT"
source "$(dirname "$0")/../device_env.sh"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # the machine's rule
POLICY=${POLICY:-matmul=cublasLt,attention=flash_v2}
STEPS=${STEPS:-30}
nvidia-smi -L
python3 examples/train_gpt.py --steps "$STEPS" --policy "$POLICY" --json "$OUT/one_gpu.json" 2>&1 | tail -8
torchrun --standalone --nproc_per_node 2 examples/train_gpt.py --steps "$STEPS" --policy "$POLICY" \
    --json "$OUT/ddp.json" 2>&1 | grep -v "^W1\|OMP_NUM_THREADS\|^\*" | tail -16
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
one = json.load(open(f"{out}/one_gpu.json"))
ranks = [json.load(open(f"{out}/ddp.rank{r}.json")) for r in (0, 1)]
mean = [sum(r["losses"][i] for r in ranks) / len(ranks) for i in range(len(one["losses"]))]
rel = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(mean, one["losses"]))
print(f"max relative loss difference, DDP mean vs one GPU: {rel:.2e} over {len(mean)} steps")
for r in ranks:
    print(f"rank {r['rank']}: median step {r['median_step_ms']:.2f} ms;",
          "kernels:", sorted({f"{d['op']}/{d['kernel']}" for d in r["dispatch"]}))
PY
