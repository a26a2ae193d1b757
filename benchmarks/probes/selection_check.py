"""What auto and autotune run at a bench row, and every alternative's time round by round.

For each row whose name contains --only: the kernels the dispatch log shows for one call under auto and
under autotune (with the times autotune stored), then --rounds rounds of the bench's timer over every
alternative in rotated order, one line per round, so drift between rounds and slots shows.

    PYTHONPATH=src python3 benchmarks/probes/selection_check.py --only "S8192 D128" [--rounds 8]
"""

from __future__ import annotations

import argparse
import collections

import xpuruntime as xrt
from xpuruntime import autotune, bench


def kernels_of(fn) -> str:
    xrt.clear_dispatch_logs()
    xrt.enable_dispatch_logging()
    fn()
    xrt.disable_dispatch_logging()
    ran = collections.Counter(f"{r.op_name}/{r.selected_kernel} ({r.reason})" for r in xrt.get_dispatch_logs())
    return ", ".join(ran)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", action="append", required=True)
    p.add_argument("--rounds", type=int, default=8)
    args = p.parse_args()
    timer = bench.default_timer("device")
    autotune.ARBITERS.append(
        lambda op, key, times, backends, policy: print(
            f"  tuned {op}: { ({k: round(v) for k, v in times.items()}) } µs"
        )
    )
    for row in bench.select(bench.discover()[0], args.only):
        print(f"== {row.name}")
        setup = row.setup()
        alternatives = setup.alternatives
        for mode in ("auto", "autotune"):
            if mode in alternatives:
                print(f"  {mode}: {kernels_of(alternatives[mode])}")
        names = list(alternatives)
        print("  round " + " ".join(f"{n[:12]:>12}" for n in names))
        for r in range(args.rounds):
            shift = r * len(names) // args.rounds
            ms = {n: timer(alternatives[n]) for n in names[shift:] + names[:shift]}
            print(f"  {r:>5} " + " ".join(f"{ms[n]:>12.3f}" for n in names))


if __name__ == "__main__":
    main()
