"""One GPU call for the Triton backend: the GPU tests, a launch-parameter sweep of the bandwidth kernels,
and the benchmark rows (norm, elementwise, reduction, matmul, gemv) with the auto-selection check.

    PYTHONPATH=src python benchmarks/triton_h100.py OUT_DIR [--skip-tests] [--skip-sweep]
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import torch
import triton
from triton.testing import do_bench


def tbps(nbytes: int, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e12


def bench(fn) -> float:
    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


def run_tests(out: Path) -> None:
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-n", "8", "-p", "no:cacheprovider",
           "tests/backends/triton/test_triton_kernels.py", "tests/backends/triton/test_triton_backend.py"]  # fmt: skip
    start = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    (out / "pytest_triton_gpu.txt").write_text(proc.stdout + proc.stderr)
    tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-500:]
    print(f"pytest ({time.time() - start:.0f}s): {tail}", flush=True)
    if proc.returncode:
        print(proc.stdout[-4000:], flush=True)


def sweep() -> dict:
    """Time the bandwidth kernels directly over their launch parameters (what the heuristics should pick)."""
    from xpuruntime.backends.triton import elementwise as E
    from xpuruntime.backends.triton import matmul as MM
    from xpuruntime.backends.triton import norm as NM
    from xpuruntime.backends.triton import reduction as RD

    found: dict = {}
    m, n = 8192, 4096
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    w, b = torch.randn(n, device="cuda", dtype=torch.bfloat16), torch.randn(n, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)
    for rms in (False, True):
        for bm in (1, 2, 4):
            for warps in (4, 8, 16):

                def fwd(bm=bm, warps=warps, rms=rms):
                    NM._norm_fwd_kernel[(triton.cdiv(m, bm),)](
                        x, w, b, y, m, n, n, 1, n, 1, 1, 1, 1e-5, HAS_W=True, HAS_B=not rms, RMS=rms,
                        BLOCK_M=bm, BLOCK_N=n, ONE_PASS=True, num_warps=warps)  # fmt: skip

                try:
                    found[f"{'rms' if rms else 'layer'}_fwd bm={bm} w={warps}"] = tbps(4 * m * n, bench(fwd))
                except Exception as exc:
                    found[f"{'rms' if rms else 'layer'}_fwd bm={bm} w={warps}"] = repr(exc)[:80]
    dy = torch.randn_like(x)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for per_sm in (1, 2, 4, 8):
        for warps in (8, 16):
            p = per_sm * sms
            part = torch.empty(2, p, n, device="cuda", dtype=torch.float32)

            def bwd(p=p, warps=warps, part=part):
                NM._norm_bwd_kernel[(p,)](dy, x, w, y, part, m, n, n, 1, n, 1, n, 1, 1, 1e-5,
                                          HAS_W=True, RMS=False, BLOCK_M=1, BLOCK_N=n, ONE_PASS=True,
                                          num_warps=warps)  # fmt: skip

            found[f"layer_bwd(dx+partials) per_sm={per_sm} w={warps}"] = tbps(6 * m * n, bench(bwd))
    xs = torch.randn(8192, 8192, device="cuda")
    ys = torch.empty_like(xs)
    count = xs.numel()
    for block in (1024, 2048, 4096, 8192):
        for warps in (4, 8, 16):

            def sin(block=block, warps=warps):
                E._sin_affine_kernel[(triton.cdiv(count, block),)](
                    xs, xs, xs, ys, 1.7, -0.3, count, 1, 1, 1, *([0] * 16), X_MODE=2, A_MODE=0, B_MODE=0,
                    Y_LINEAR=True, WIDE=False, BLOCK=block, num_warps=warps)  # fmt: skip

            found[f"sin_affine block={block} w={warps}"] = tbps(8 * count, bench(sin))
    out = torch.empty(8192, device="cuda")
    for br, bi in ((8192, 1), (4096, 1), (2048, 1), (2048, 2), (1024, 4), (512, 8), (256, 16)):
        for warps in (4, 8, 16):
            t = dict(O=1, R=8192, I=8192, x=(0, 1, 8192), out=(0, 1), BLOCK_R=br, BLOCK_I=bi,
                     n_i=triton.cdiv(8192, bi), split=1, r_per=8192, num_warps=warps)  # fmt: skip
            found[f"sum(-1) BR={br} BI={bi} w={warps}"] = tbps(
                4 * 8192 * 8193, bench(lambda t=t: RD.launch_sum(xs, out, t))
            )
    g = 16384
    wg = torch.randn(g, g, device="cuda", dtype=torch.bfloat16)
    vg = torch.randn(g, device="cuda", dtype=torch.bfloat16)
    yg = torch.empty(g, device="cuda", dtype=torch.bfloat16)
    for bi, bj, warps in (
        (4, 512, 4),
        (8, 512, 4),
        (8, 512, 8),
        (16, 256, 4),
        (16, 512, 8),
        (8, 1024, 8),
        (32, 256, 8),
    ):

        def gemv(bi=bi, bj=bj, warps=warps):
            MM._gemv_kernel[(triton.cdiv(g, bi), 1)](wg, vg, yg, g, g, g, g, 1, 1, 1, 0, BLOCK_I=bi, BLOCK_J=bj,
                                                      num_warps=warps)  # fmt: skip

        found[f"gemv N=1 BI={bi} BJ={bj} w={warps}"] = tbps(2 * g * g, bench(gemv))
    for bi, bj, warps in ((256, 32, 8), (128, 64, 8), (512, 16, 8), (256, 16, 4), (128, 32, 4)):
        for split in (1, 4, 8):
            part = torch.empty(split, g, device="cuda")
            jp = triton.cdiv(triton.cdiv(g, split), bj) * bj

            def gemv_t(bi=bi, bj=bj, warps=warps, split=split, part=part, jp=jp):
                MM._gemv_kernel[(triton.cdiv(g, bi), split)](wg, vg, part, g, g, jp, 1, g, 1, 1, g, BLOCK_I=bi,
                                                              BLOCK_J=bj, num_warps=warps)  # fmt: skip

            found[f"gemv M=1 BI={bi} BJ={bj} w={warps} split={split}"] = tbps(2 * g * g, bench(gemv_t))
    copy_dst = torch.empty_like(wg)
    found["copy 16384^2 bf16"] = tbps(4 * g * g, bench(lambda: copy_dst.copy_(wg)))
    return found


def diagnose() -> None:
    """Host cost per call and the kernels one layer_norm forward+backward launches (with their times)."""
    from torch.profiler import ProfilerActivity, profile

    import xpuruntime as xrt
    from xpuruntime.backends.triton import matmul as tm

    m, n = 8192, 4096
    x, dy = (torch.randn(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    w, b = (torch.randn(n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    policy = xrt.KernelPolicy(layer_norm="triton", layer_norm_backward="triton", strict=True)

    def step() -> None:
        with xrt.kernel_policy(policy):
            xrt.ops.layer_norm(x, n, w, b)
            xrt.ops.layer_norm_backward(dy, x, n, w)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(50):
        step()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    print(
        f"layer_norm fwd+bwd: host {1e6 * (t1 - t0) / 50:.1f} us/call, host+device {1e6 * (t2 - t0) / 50:.1f} us/call"
    )
    t0 = time.perf_counter()
    for _ in range(50):
        with xrt.kernel_policy(layer_norm="triton", layer_norm_backward="triton", strict=True):
            pass
    print(f"kernel_policy(**prefs) scope: {1e6 * (time.perf_counter() - t0) / 50:.1f} us")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    for e in prof.key_averages():
        if e.device_type.name == "CUDA" or getattr(e, "self_device_time_total", 0):
            print(f"  {e.key[:70]:70s} {getattr(e, 'device_time_total', 0.0):9.1f} us x{e.count}")
    print("matmul winners:", {k[:5]: v for k, v in tm._WINNERS.items()})


def run_bench(out: Path) -> list:
    from xpuruntime import bench as B

    rows, failures = B.discover()
    mine = [r for r in rows if r.group in ("norm", "elementwise", "reduction", "gemv") or r.name.startswith("triton")]
    for module, why in failures:
        print("bench module failed:", module, why)
    results = B.run(mine, progress=False)
    B.write_reports(results, out / "bench") if hasattr(B, "write_reports") else None
    return results


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    print(f"torch {torch.__version__} triton {triton.__version__} {torch.cuda.get_device_name()}", flush=True)
    if "--skip-tests" not in sys.argv:
        run_tests(out)
    if "--skip-sweep" not in sys.argv:
        start = time.time()
        found = sweep()
        (out / "triton_sweep.json").write_text(json.dumps(found, indent=1))
        print(f"sweep ({time.time() - start:.0f}s):")
        groups: dict = {}
        for k, v in found.items():
            if isinstance(v, float):
                g = k.split(" ")[0] + (" " + k.split(" ")[1] if k.startswith("gemv") else "")
                if v > groups.get(g, ("", 0.0))[1]:
                    groups[g] = (k, v)
        for k, v in groups.values():
            print(f"  best {k}: {v:.2f} TB/s")
    start = time.time()
    results = run_bench(out)
    diagnose()
    print(f"bench ({time.time() - start:.0f}s)")
    print(f"{'row':48s} {'ours':>8s} {'anchor':>8s} {'units':7s} {'ratio':>6s} {'target':>7s} status / auto vs best")
    for r in results:
        auto = ""
        alts = getattr(r, "alternatives_ms", {}) or {}
        if alts:
            best = min((v, k) for k, v in alts.items() if k != "auto")
            auto = f"auto {alts.get('auto', float('nan')):.3f}ms vs best {best[1]} {best[0]:.3f}ms"
        fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        print(f"{r.name[:48]:48s} {fmt(r.ours_value):>8s} {fmt(r.anchor_value):>8s} {r.units:7s} {fmt(r.ratio):>6s} "
              f"{fmt(r.target):>7s} {r.status} {'met' if r.met else ('MISSED' if r.met is False else '')} {auto} {r.message[:90]}")  # fmt: skip


if __name__ == "__main__":
    main()
