"""Where a patched Hugging Face step spends its time: per variant of bench/hf_training (eager, patched,
patched+compile, ...), the host time to enqueue one step against the step's wall time (a step is host-bound
when the two are close), the GPU's kernel time per step, the kernels and host ops that take most, and under
torch.compile the graph breaks and graphs made.

    python benchmarks/probes/patched_step_profile.py [--model llama] [--variants eager,patched,patched+compile]
        [--cprofile]  (also cProfile over five steps: the Python functions that take the host time)
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings


def main() -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from xpuruntime.bench import hf_training as hf

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="llama")
    parser.add_argument("--variants", default="eager,patched,patched+compile")
    parser.add_argument("--top", type=int, default=14)
    parser.add_argument("--cprofile", action="store_true", help="also the Python functions that take the host time")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    state, ids = hf.initial_state(args.model)
    wanted = args.variants.split(",")
    liger = hf.LigerSwitch()
    for v in [v for v in hf.default_variants(args.model) if v.name in wanted]:
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        hf.build(v, args.model, state, ids, liger)
        with hf.running(v, liger):
            for _ in range(4):
                v.step()
            host, wall = [], []
            for _ in range(7):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                v.step()
                t1 = time.perf_counter()
                torch.cuda.synchronize()
                host.append((t1 - t0) * 1e3)
                wall.append((time.perf_counter() - t0) * 1e3)
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(2):
                    v.step()
                torch.cuda.synchronize()
        if args.cprofile:
            python_profile(v.step, args.top * 3)
        events = prof.key_averages()
        kernel_ms = sum(e.self_device_time_total for e in events) / 2e3
        print(
            f"\n=== {v.name}: wall {statistics.median(wall):.2f} ms, host enqueue {statistics.median(host):.2f} ms, "
            f"GPU kernels {kernel_ms:.2f} ms per step",
            flush=True,
        )
        breaks = dict(torch._dynamo.utils.counters.get("graph_break", {}))
        if v.compile:
            stats = dict(torch._dynamo.utils.counters.get("stats", {}))
            print(f"graph breaks {sum(breaks.values())}: {list(breaks.items())[:6]}; dynamo stats {stats}")
        print(events.table(sort_by="self_device_time_total", row_limit=args.top, max_name_column_width=70))
        print(events.table(sort_by="self_cpu_time_total", row_limit=args.top, max_name_column_width=70))
        v.model = v.opt = v.step = None
        torch.cuda.empty_cache()


def python_profile(step, top: int) -> None:
    """cProfile over five steps: the Python functions by own time, then by cumulative time."""
    import cProfile
    import io
    import pstats

    import torch

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    profiler.disable()
    for key in ("tottime", "cumulative"):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(key).print_stats(top)
        print(text.getvalue().replace(str(pstats.__file__).rsplit("/", 1)[0], "<lib>"))


if __name__ == "__main__":
    main()
