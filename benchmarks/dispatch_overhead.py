"""Dispatcher overhead on a plan-cache hit, against calling the same kernel directly.

For each op the same tiny problem (so the kernel itself costs little) is timed three ways:
  direct   the NumPy call the CPU kernel makes, as a user would write it (allocates its output)
  launch   the registered kernel's launch function with a pre-built ArgPack, plus output allocation
  xrt      the public front end, `xrt.ops.<op>(...)`, which goes through policy, plan cache and launch
and the overhead (xrt - direct, xrt - launch) is printed in µs; each time is the best of 15 interleaved
rounds of 20,000 calls. The verdict's "vs launch" is the median over rounds of xrt - launch in the same
round (the host's speed drifts between rounds: the two bests may come from different ones); "(bests)" is
the difference of the two bests, and the verdict is given for both. Target: xrt - launch <= 3 µs (DESIGN §4).

With a CUDA device (and PyTorch) the same is done with CUDA tensors: "direct" is the PyTorch call, "launch"
the selected GPU kernel's launch with its output allocated and the stream fetched beforehand (so the
current-stream lookup counts as dispatcher overhead), "xrt" the front end; 45 rounds of 1,000 calls, each
ending with a device synchronize; the C++ extension (plan key and plan-cache hit in C) is loaded first. A private op `scale2` (y = 2x through `torch.mul`) measures the dispatcher with the cheapest
possible GPU kernel. It also times output allocation through our caching allocator against `torch.empty`
and the current-stream lookup.

    python benchmarks/dispatch_overhead.py [--json results.json] [--cuda-only]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

import xpuruntime as xrt
from xpuruntime.abi import ArgPack

TARGET_US = 3.0


def round_times(
    variants: dict[str, Callable[[], object]], number: int = 20_000, repeat: int = 15,
    sync: Callable[[], object] | None = None,
) -> dict[str, list[float]]:  # fmt: skip
    """Mean µs per call of each variant in each round; the variants are timed interleaved round by round so
    that load from other processes hits them alike; `sync` (a device synchronize) ends each round."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    warm_until = time.perf_counter() + 0.5  # let the CPU clock and caches settle before timing
    while time.perf_counter() < warm_until:
        for fn in variants.values():
            fn()
    sync = sync or (lambda: None)
    for _ in range(repeat):
        for name, fn in variants.items():
            sync()
            start = time.perf_counter()
            for _ in range(number):
                fn()
            sync()
            times[name].append((time.perf_counter() - start) / number * 1e6)
    return times


def per_call_us(
    variants: dict[str, Callable[[], object]], number: int = 20_000, repeat: int = 15,
    sync: Callable[[], object] | None = None,
) -> dict[str, float]:  # fmt: skip
    """Best (minimum) of `round_times` per variant."""
    return {name: min(t) for name, t in round_times(variants, number, repeat, sync).items()}


def cases() -> list[tuple[str, Callable[[], object], Callable[[], object], tuple]]:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((4, 4), dtype=np.float32)
    b = rng.standard_normal((4, 4), dtype=np.float32)
    x = rng.standard_normal((64,), dtype=np.float32)
    return [
        ("matmul 4x4", lambda: xrt.ops.matmul(a, b), lambda: np.matmul(a, b), ("matmul", a, b)),
        ("sin_affine 64", lambda: xrt.ops.sin_affine(x, 2.0, 0.5), lambda: np.sin(2.0 * x + 0.5), ("sin_affine", x, 2.0, 0.5)),
        ("sum 64", lambda: xrt.ops.sum(x), lambda: np.sum(x, dtype=np.float64), ("sum", x)),
    ]  # fmt: skip


def launch_only(op: str, *inputs: object, dispatcher: object = None) -> Callable[[], object]:
    """The selected kernel's launch function called directly, with its output allocated per call (on the
    stream fetched once, beforehand)."""
    plan = (dispatcher or xrt.default_dispatcher()).plan(op, *inputs)
    stream = None if plan.current_stream is None else plan.current_stream(plan.device)

    def call() -> object:
        out = plan.allocate(stream)
        plan.launch(ArgPack(inputs, out, plan.attrs, plan.config, None, stream))
        return out

    return call


def cuda_cases(torch: object) -> list[tuple[str, Callable[[], object], Callable[[], object], Callable[[], object]]]:
    """(name, xrt call, direct PyTorch call, launch-only call) with CUDA tensors, for ops with a GPU kernel."""
    a = torch.randn(4, 4, device="cuda")
    b = torch.randn(4, 4, device="cuda")
    x = torch.randn(64, device="cuda")
    found = []
    for name, through_xrt, direct, (op, *inputs) in [
        ("cuda matmul 4x4", lambda: xrt.ops.matmul(a, b), lambda: torch.matmul(a, b), ("matmul", a, b)),
        ("cuda sin_affine 64", lambda: xrt.ops.sin_affine(x, 2.0, 0.5), lambda: torch.sin(2.0 * x + 0.5),
         ("sin_affine", x, 2.0, 0.5)),
        ("cuda sum 64", lambda: xrt.ops.sum(x), lambda: torch.sum(x, -1), ("sum", x)),
        ("cuda softmax 64", lambda: xrt.ops.softmax(x), lambda: torch.softmax(x, -1), ("softmax", x)),
    ]:  # fmt: skip
        plan = xrt.default_dispatcher().plan(op, *inputs)
        if plan.device.startswith("cuda"):
            found.append((f"{name} [{plan.kernel.backend}/{plan.kernel.name}]", through_xrt, direct,
                          launch_only(op, *inputs)))  # fmt: skip
    dispatcher = scale2_dispatcher(torch)
    found.append(("cuda scale2 64 [torch.mul]", lambda: dispatcher.run("scale2", (x,)), lambda: torch.mul(x, 2),
                  launch_only("scale2", x, dispatcher=dispatcher)))  # fmt: skip
    return found


def scale2_dispatcher(torch: object) -> object:
    """A dispatcher with one op, y = 2x, whose only kernel is `torch.mul` on a CUDA backend."""
    from xpuruntime.dispatch import Dispatcher
    from xpuruntime.registry import Backend, Registry, kernel
    from xpuruntime.runtime import streams
    from xpuruntime.schema import OpSchema

    dtypes = {"float32": torch.float32, "float16": torch.float16}
    registry = Registry()
    registry.register_op(OpSchema(name="scale2", inputs=("x",), infer_dtype=lambda ctx: ctx.tensor("x").dtype,
                                  infer_shape=lambda ctx: ctx.tensor("x").shape, reference=lambda x: 2 * x))  # fmt: skip
    registry.register_backend(Backend(
        "cudabench", "cuda", empty=lambda shape, dtype, device, stream: torch.empty(shape, dtype=dtypes[dtype],
                                                                                    device=device),
        current_stream=streams.current_stream, synchronize=streams.synchronize, record_event=streams.record_event,
    ))  # fmt: skip

    @kernel("scale2", "torch_mul", backend="cudabench")
    def launch(args: ArgPack) -> None:
        torch.mul(args.inputs[0], 2, out=args.out)

    registry.register_kernel(launch)
    return Dispatcher(registry)


def cuda_extras(torch: object) -> dict[str, float]:
    """Per-call µs of the plan key of a call with two CUDA tensors (the active one, C once the extension is
    loaded, and the Python one), output allocation (our caching allocator vs torch.empty) and current-stream lookups."""
    from xpuruntime import arguments
    from xpuruntime.policy import current_policy
    from xpuruntime.runtime import allocator, streams

    ours = allocator.get_allocator("device", "cuda:0")
    device = torch.device("cuda:0")
    x = torch.randn(4, 4, device="cuda")
    b = torch.randn(4, 4, device="cuda")
    active = "Python" if arguments.plan_key is arguments.python_plan_key else "C"
    return per_call_us({
        f"plan key of matmul(a, b) (active: {active})": lambda: arguments.plan_key("matmul", 1, (), (x, b), None),
        "plan key of matmul(a, b) (Python)": lambda: arguments.python_plan_key("matmul", 1, (), (x, b), None),
        "current_policy()": current_policy,
        "torch.empty(64, device='cuda:0')": lambda: torch.empty((64,), dtype=torch.float32, device="cuda:0"),
        "torch.empty(64, device=torch.device)": lambda: torch.empty((64,), dtype=torch.float32, device=device),
        "xrt allocator.empty(64)": lambda: ours.empty((64,), torch.float32),
        "xrt allocator allocate+free (1 KiB)": lambda: ours.free(ours.allocate(1024)),
        "xrt streams.current_stream": lambda: streams.current_stream("cuda:0"),
        "torch.cuda.current_stream(torch.device)": lambda: torch.cuda.current_stream(device),
    }, number=5_000, repeat=7, sync=torch.cuda.synchronize)  # fmt: skip


def measure(cases: list) -> list[dict]:
    """Time (name, xrt, direct, launch, sync) cases; one result dict per case."""
    rows = []
    for name, through_xrt, direct, launch, sync in cases:
        # many short rounds: the median of paired differences then shrugs off the host's drift
        number, repeat = (20_000, 15) if sync is None else (1_000, 45)
        rounds = round_times({"xrt": through_xrt, "direct": direct, "launch": launch}, number, repeat, sync)
        t_xrt, t_direct, t_launch = (min(rounds[k]) for k in ("xrt", "direct", "launch"))
        paired = statistics.median(x - k for x, k in zip(rounds["xrt"], rounds["launch"]))
        rows.append({"case": name, "xrt_us": t_xrt, "direct_us": t_direct, "launch_us": t_launch,
                     "overhead_vs_direct_us": t_xrt - t_direct, "overhead_vs_launch_us": paired,
                     "overhead_vs_launch_best_us": t_xrt - t_launch})  # fmt: skip
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="also write the results to this JSON file")
    parser.add_argument("--cuda-only", action="store_true", help="only the CUDA rows")
    parser.add_argument("--python-hits", action="store_true", help="a control: plan-cache hits run in Python")
    args = parser.parse_args()

    measured = [] if args.cuda_only else [(*c[:3], launch_only(*c[3]), None) for c in cases()]
    extras: dict[str, float] = {}
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        from xpuruntime.runtime import extension

        extension.load()  # what a long-running process has (its first CUDA plan miss starts the build)
        print(f"C++ extension (plan key and plan-cache hit in C): {extension.status()}")
        measured += [(*c, torch.cuda.synchronize) for c in cuda_cases(torch)]
        extras = cuda_extras(torch)
    if args.python_hits:
        from xpuruntime import dispatch

        dispatch._hit_in_c = None
        print("control: plan-cache hits run in Python (the plan key stays as loaded)")
    rows = measure(measured)

    stats = xrt.plan_cache().stats()
    print(f"Python {platform.python_version()} on {platform.machine()}, NumPy {np.__version__}")
    width = max(16, *(len(r["case"]) + 2 for r in rows))
    print(f"{'case':<{width}}{'xrt µs':>9}{'direct µs':>11}{'launch µs':>11}{'overhead vs direct':>20}"
          f"{'vs launch':>11}{'(bests)':>9}")  # fmt: skip
    for r in rows:
        print(f"{r['case']:<{width}}{r['xrt_us']:>9.2f}{r['direct_us']:>11.2f}{r['launch_us']:>11.2f}"
              f"{r['overhead_vs_direct_us']:>20.2f}{r['overhead_vs_launch_us']:>11.2f}"
              f"{r['overhead_vs_launch_best_us']:>9.2f}")  # fmt: skip
    print(f"plan cache: {stats.hits} hits, {stats.misses} misses")
    for name, us in extras.items():
        print(f"  {name:<45}{us:>8.2f} µs")
    for key, how in (("overhead_vs_launch_us", "median of paired rounds"), ("overhead_vs_launch_best_us", "bests")):
        worst = max(r[key] for r in rows)
        verdict = "meets" if worst <= TARGET_US else "MISSES"
        print(
            f"worst overhead over the kernel's own launch ({how}): {worst:.2f} µs ({verdict} the {TARGET_US} µs target)"
        )
    if args.json:
        with open(args.json, "w") as f:
            doc = {"python": platform.python_version(), "numpy": np.__version__, "rows": rows, "cuda_extras_us": extras}
            if torch is not None:
                doc["torch"] = torch.__version__
                doc["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
            json.dump(doc, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
