#!/usr/bin/env bash
# The 2-GPU FSDP2 check of patch(model): the bench's Llama patched (policy pinned), on one GPU twice (the second run
# is the noise floor: bf16 with nondeterministic kernels differs run to run) and under torchrun with fully_shard on
# two GPUs with the same global batch; per-step losses compared, the policy's kernels listed per rank.
#   bash benchmarks/probes/fsdp2_patch_check.sh        (STEPS=20 LAYERS=8 by default; OUT=/tmp/xrt-fsdp2)
set -uo pipefail
OUT=${OUT:-/tmp/xrt-fsdp2}
STEPS=${STEPS:-20}
LAYERS=${LAYERS:-8}
mkdir -p "$OUT"
source "$(dirname "$0")/../device_env.sh"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # the machine's rule
PROBE="$(dirname "$0")/fsdp2_patch_check.py"
nvidia-smi -L
python3 "$PROBE" --steps "$STEPS" --layers "$LAYERS" --json "$OUT/one_gpu.json" 2>&1 | tail -3
python3 "$PROBE" --steps "$STEPS" --layers "$LAYERS" --json "$OUT/one_gpu_again.json" 2>&1 | tail -3
torchrun --standalone --nproc-per-node 2 "$PROBE" --steps "$STEPS" --layers "$LAYERS" --json "$OUT/fsdp.json" 2>&1 \
    | grep -v "^W1\|OMP_NUM_THREADS\|^\*" | tail -8
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
one, again = (json.load(open(f"{out}/{name}.json")) for name in ("one_gpu", "one_gpu_again"))
ranks = [json.load(open(f"{out}/fsdp.rank{r}.json")) for r in (0, 1)]
def rel(a, b):
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))
floor, fsdp = rel(again["losses"], one["losses"]), rel(ranks[0]["losses"], one["losses"])
print(f"losses one GPU: {one['losses'][0]:.4f} -> {one['losses'][-1]:.4f}; FSDP2: {ranks[0]['losses'][-1]:.4f}")
print(f"max relative loss difference over {len(one['losses'])} steps: FSDP2 vs one GPU {fsdp:.2e}; "
      f"noise floor (one GPU twice) {floor:.2e}; {'OK' if fsdp <= max(4 * floor, 2e-2) else 'CHECK'}")
print(f"median step: one GPU {one['median_step_ms']:.1f} ms ({one['peak_gib']:.2f} GiB); "
      + "; ".join(f"rank {r['rank']} {r['median_step_ms']:.1f} ms ({r['peak_gib']:.2f} GiB)" for r in ranks))
for r in ranks:
    print(f"rank {r['rank']}: {r['swapped']} modules patched; kernels:", ", ".join("/".join(k) for k in r["kernels"]))
PY
