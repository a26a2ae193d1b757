#!/usr/bin/env bash
# patch(model) and the fused training ops on one GPU, from the repository root, one part per command (each under
# 10 minutes):
#   PART=verify bash benchmarks/patch_h100.sh  # every fused-kernel test at GPU sizes, the GPU-marked PyTorch tests
#                                              # (compiled graphs with traced kernels included) and the GPU zoo (~6 min)
#   PART=tests bash benchmarks/patch_h100.sh   # the patch and fused-op tests, GPU ones included (patched Llama and
#                                              # GPT-2: eager, inductor, reduce-overhead), on this machine's
#                                              # torch and transformers (~3 min)
#   PART=llama bash benchmarks/patch_h100.sh   # HF Llama step: eager, compile, patched variants, Liger (~5 min)
#   PART=gpt2  bash benchmarks/patch_h100.sh   # HF GPT-2 step, the same variants but Liger (~6 min)
#   PART=rest MODEL=llama bash benchmarks/patch_h100.sh   # the other variants (autotune, seeds policy, reduce-overhead)
# Results: $OUT/hf_training_<model>.json and the table on stdout (wall and GPU ms per step, ratios to eager and
# to compile, peak GiB, loss difference against eager beside the noise floor of a second eager run, the first
# step's seconds). Set XPURUNTIME_COMMIT=<commit> in the command: the copy on the GPU machine has no reliable .git. Liger-Kernel's
# variant needs liger_kernel importable (its wheel in .whl/); without it the variant says skipped.
# The 2-GPU FSDP2 check is benchmarks/probes/fsdp2_patch_check.sh.
set -uo pipefail
OUT=${OUT:-/tmp/xrt-patch}
PART=${PART:-tests}
mkdir -p "$OUT"
source "$(dirname "$0")/device_env.sh"
nvidia-smi -L
python3 -c "import torch, triton, transformers as t; print(torch.__version__, triton.__version__, t.__version__)"
MAIN=eager,eager2,eager3,compile,patched,patched+compile,patched_auto+compile,patched_head+compile,patched+graph,liger
REST=eager,compile,autotune,compile+seeds_policy,compile+autotune,reduce-overhead,reduce-overhead+patched_auto,graph
case "$PART" in
verify)
    timeout 560 python3 -m pytest -q -p no:cacheprovider -rfE --show-capture=no --tb=short \
        tests/backends/triton/test_fused_kernels.py tests/pytorch/test_pytorch_compiled_kernels.py \
        tests/pytorch/test_pytorch_patch_gpu.py tests/pytorch/test_pytorch_compile_gpu.py \
        tests/onnx/test_onnx_zoo.py -m "gpu or not gpu" > "$OUT/verify.txt" 2>&1
    grep -E "^(FAILED|ERROR|E  )|passed|failed" "$OUT/verify.txt" | head -60
    ;;
tests)
    timeout 540 python3 -m pytest -q -p no:cacheprovider -rs tests/pytorch/test_pytorch_patch_gpu.py \
        tests/pytorch/test_pytorch_training_ops.py tests/pytorch/test_pytorch_patch.py \
        tests/pytorch/test_pytorch_patch_distributed.py 2>&1 | tee "$OUT/tests.txt" | tail -25
    ;;
llama | gpt2)
    timeout 570 python3 -m xpuruntime.bench.hf_training --model "$PART" --variants "$MAIN" --out "$OUT" \
        --loss-steps 30 --rounds 6 2>&1 | tee "$OUT/$PART.txt" | grep -v "^W1\|^\[" | tail -30
    ;;
rest)
    timeout 570 python3 -m xpuruntime.bench.hf_training --model "${MODEL:-llama}" --variants "$REST" \
        --out "$OUT/rest" --loss-steps 30 --rounds 6 2>&1 | tee "$OUT/rest.txt" | grep -v "^W1\|^\[" | tail -30
    ;;
*)
    echo "PART must be verify, tests, llama, gpt2 or rest" >&2
    exit 2
    ;;
esac
