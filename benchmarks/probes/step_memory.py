"""Peak memory of one HF Llama training step (bench/hf_training's model, batch and step) per variant, in one
process: which swap or policy of `patch` costs or saves memory against eager and Liger-Kernel. Each variant is
built, stepped twice (AdamW's state exists from the first step), and its second step's peak above what was
allocated before it is reported, with what it holds between steps: its parameters, gradients and optimizer state
("training state"), anything else ("other held": caches), and what stays allocated once the variant is dropped.

    python benchmarks/probes/step_memory.py [--only eager,liger,patched]   (exact variant names)
"""

from __future__ import annotations


def main() -> None:
    import argparse
    import gc

    import torch

    from xpuruntime.bench import hf_training as hf

    kinds_all = ("rms_norm", "gated_mlp", "rotary_embedding", "linear_cross_entropy")
    variants = [
        hf.Variant("eager"),
        hf.Variant("fused_cast only", policy=hf.EAGER_POLICY),
        hf.Variant("liger", liger=True),
        hf.Variant("patched", policy=hf.EAGER_POLICY, patch=True, patch_policy=hf.PATCH_POLICY),
        hf.Variant("patched, no fused_cast", patch=True, patch_policy=hf.PATCH_POLICY),
        hf.Variant("patched, no linear=cublasLt", policy=hf.EAGER_POLICY, patch=True,
                   patch_policy=hf.PATCH_POLICY.replace(",linear=cublasLt", "")),
    ]  # fmt: skip
    for swap in ("rope", "rms_norm", "swiglu", "fused_linear_cross_entropy"):
        variants.append(hf.Variant(f"liger only {swap}", liger=True, liger_only=swap))
    for kind in kinds_all:
        variants.append(hf.Variant(f"patched only {kind}", policy=hf.EAGER_POLICY, patch=True,
                                   patch_policy=hf.PATCH_POLICY, kinds=(kind,)))  # fmt: skip
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="", help="comma-separated variant names (default: all)")
    only = [name for name in parser.parse_args().only.split(",") if name]
    variants = [v for v in variants if not only or v.name in only]
    state, ids = hf.initial_state("llama")
    liger = hf.LigerSwitch()
    print(f"{'variant':<40} {'step peak GiB':>13} {'held GiB':>9} {'training state':>14} {'other held':>10} "
          f"{'left after':>10}")  # fmt: skip
    start = torch.cuda.memory_allocated()
    for v in variants:
        try:
            hf.build(v, "llama", state, ids, liger)
            if v.skipped:
                print(f"{v.name:<40} skipped: {v.skipped}")
                continue
            with hf.running(v, liger):
                v.step()
                torch.cuda.synchronize()
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                v.step()
                torch.cuda.synchronize()
                peak = torch.cuda.max_memory_allocated() - base
                state_bytes = _training_state_bytes(v.model, v.opt)
            held_other = (base - start - state_bytes) / 2**30  # held between steps beyond weights, grads, AdamW
            line = (
                f"{v.name:<40} {peak / 2**30:13.3f} {base / 2**30:9.3f} {state_bytes / 2**30:14.3f} {held_other:10.3f}"
            )
        except Exception as exc:  # report and go on
            print(f"{v.name:<40} failed: {type(exc).__name__}: {exc}"[:300])
            line = None
        v.model = v.opt = v.step = None
        gc.collect()
        torch.cuda.empty_cache()
        if line:  # what the variant left allocated once dropped: caches of the runtime or of a library
            print(f"{line} {(torch.cuda.memory_allocated() - start) / 2**30:10.3f}", flush=True)


def _training_state_bytes(model: object, opt: object) -> int:
    """Bytes of the parameters, their gradients and the optimizer's state tensors."""
    import torch

    params = list(model.parameters())
    total = sum(p.numel() * p.element_size() for p in params)
    total += sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
    for values in opt.state.values():
        total += sum(t.numel() * t.element_size() for t in values.values() if isinstance(t, torch.Tensor))
    return total


if __name__ == "__main__":
    main()
