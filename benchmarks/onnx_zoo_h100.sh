#!/usr/bin/env bash
# The ONNX model zoo on the H100, from the repository root, one part per call (each well under 10 minutes):
#   bash benchmarks/onnx_zoo_h100.sh tests     # GPU tests: zoo fp32 vs onnxruntime (1e-3), fp16 fused, IOBinding,
#                                              # channels-last convolutions with the residual FusedConv
#   bash benchmarks/onnx_zoo_h100.sh bert      # bench rows: BERT-base fp16/fp32 B1 S128, B32 S128, B8 S512
#   bash benchmarks/onnx_zoo_h100.sh gpt2      # GPT-2 B1 S128, B8 S512 (then: llama, resnet50, mobilenet_v3, vit_b16)
#   bash benchmarks/onnx_zoo_h100.sh session   # first session's creation and a new signature's planning vs onnxruntime
# Each bench row times our InferenceSession on CUDA (CUDA graphs), torch.compile(mode="reduce-overhead") (the
# anchor) and eager PyTorch, interleaved in one process, after checking ours against eager; the ratio column is
# compile's time over ours (target >= 1.0). Results: benchmarks/results/zoo_h100_<part>.{json,md}; logs in $OUT.
# The zoo exports with the dynamo exporter, which needs onnxscript (carry its wheel and onnx_ir's in .whl/ if the
# machine lacks them); without it the rows fall back to the TorchScript exporter and say so in their note.
set -uo pipefail
PART=${1:-tests}
OUT=${OUT:-/tmp/xrt-onnx-zoo}
mkdir -p "$OUT"
source "$(dirname "$0")/device_env.sh"
python3 -c "import torch, transformers, onnxruntime; print('torch', torch.__version__, 'transformers', transformers.__version__)"
python3 -c "import onnxscript; print('onnxscript', onnxscript.__version__)" || echo "no onnxscript: TorchScript exports"
if [ "$PART" = tests ]; then
    timeout 550 python3 -m pytest -q -p no:cacheprovider -rs -m gpu tests/onnx/test_onnx_zoo.py \
        tests/onnx/test_onnx_conv_pool.py tests/onnx/test_onnx_runtime_contract.py tests/onnx/test_inference_gpu.py \
        2>&1 | tee "$OUT/gpu_tests.txt" | tail -30
else
    case "$PART" in
        cpu|session) ONLY="zoo $PART" ;;  # CPU rows beside onnxruntime at 1 thread; session creation cost
        *) ONLY="zoo $PART fp" ;;         # one model's GPU rows, fp16 and fp32
    esac
    timeout 580 python3 -m xpuruntime.bench --only "$ONLY" --out benchmarks/results --name "zoo_h100_$PART" 2>&1 \
        | tee "$OUT/bench_$PART.txt" | tail -30
fi
