"""Whether float32 convolutional graphs gain from the GPU path's channels-last convolutions too (they are made
for half precision only: `ops.conv.CHANNELS_LAST_DTYPES`, `conv_activation_fusion.RESIDUAL_DTYPES`). Runs the zoo's
fp32 GPU rows of the named models with float32 added to both, beside torch.compile as the bench does:

    python benchmarks/probes/zoo_fp32_channels_last.py resnet50 mobilenet_v3
"""

from __future__ import annotations

import os
import sys

from xpuruntime.bench.cli import main
from xpuruntime.graph.passes import conv_activation_fusion
from xpuruntime.onnx.ops import conv

conv.CHANNELS_LAST_DTYPES = (*conv.CHANNELS_LAST_DTYPES, "float32")
conv_activation_fusion.RESIDUAL_DTYPES = (*conv_activation_fusion.RESIDUAL_DTYPES, "float32")
for model in sys.argv[1:]:
    out = os.environ.get("OUT", "bench-results")
    main(["--only", f"zoo {model} fp32", "--out", out, "--name", f"zoo_fp32_channels_last_{model}"])
