"""Which of patch()'s swaps pay for themselves in an eager step: the bench's step (bench/hf_training) patched with
subsets of the swap kinds, interleaved in one process beside eager and the full patch. A swap replacing one of
PyTorch's fused kernels (nn.LayerNorm is F.layer_norm) costs host time that a host-bound step pays in full; one
replacing a chain of PyTorch ops (Llama's RMSNorm, GPT-2's gelu_new, the logits + loss) saves device time too.

    python benchmarks/probes/swap_subsets.py --model gpt2 [--subsets "linear_cross_entropy;linear+gelu,..."]
"""

from __future__ import annotations

import argparse

DEFAULT_SUBSETS = {
    "gpt2": "linear_cross_entropy;linear_cross_entropy,linear+gelu;linear_cross_entropy,layer_norm",
    "llama": "linear_cross_entropy;linear_cross_entropy,rms_norm;linear_cross_entropy,rms_norm,gated_mlp",
}


def main() -> None:

    from xpuruntime.bench import hf_training as hf

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="gpt2")
    parser.add_argument("--subsets", default="", help="';'-separated comma lists of swap kinds")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--loss-steps", type=int, default=10)
    args = parser.parse_args()
    state, ids = hf.initial_state(args.model)
    liger = hf.LigerSwitch()
    variants = [hf.Variant("eager"), hf.Variant("eager2"),
                hf.Variant("patched", policy=hf.EAGER_POLICY, patch=True, patch_policy=hf.PATCH_POLICY)]  # fmt: skip
    for subset in (args.subsets or DEFAULT_SUBSETS[args.model]).split(";"):
        kinds = tuple(subset.split(","))
        variants.append(hf.Variant(f"patched only {'+'.join(kinds)}", policy=hf.EAGER_POLICY, patch=True,
                                   patch_policy=hf.PATCH_POLICY, kinds=kinds))  # fmt: skip
    for v in variants:
        hf.build(v, args.model, state, ids, liger)
    hf.loss_phase(variants, args.loss_steps, liger)
    hf.timing_phase(variants, args.rounds, 3, liger)
    print(hf.markdown(hf.report(variants, args.model)))


if __name__ == "__main__":
    main()
