"""GPU check of the cublaslt and torch GEMM kernels: correctness against float64, timings, host cost.

Calls each kernel's launch function directly (ArgPack built from the op's own context), so it runs
before the dispatcher takes CUDA tensors. Usage: python benchmarks/gemm_check.py [OUT_DIR [STEP,STEP...]]
"""

from __future__ import annotations

import json
import sys
import time
import traceback

import numpy as np
import torch
import torch.nn.functional as F
from triton.testing import do_bench

from xpuruntime.abi import ArgPack
from xpuruntime.context import build_context
from xpuruntime.policy import KernelPolicy
from xpuruntime.registry import Registry

RESULTS: dict = {"checks": [], "timings": [], "host_us": {}}


def registry() -> Registry:
    from xpuruntime.registry import default_registry

    return default_registry()


REG = registry()


def call(op: str, kernel: str, inputs: tuple, attrs: tuple, *, check: bool = True):
    """Build the op's context, check the kernel's conditions, launch it; returns (out, reasons, fn)."""
    schema = REG.op(op)
    ctx = build_context(schema, inputs, attrs, None, KernelPolicy())
    spec = REG.kernel(op, kernel)
    reasons = REG.not_supported_reasons(spec, ctx) if check else []
    config = spec.launch_config(ctx)
    ws_bytes = spec.workspace_bytes(ctx)
    ws = torch.empty(ws_bytes, dtype=torch.uint8, device="cuda") if ws_bytes else None
    stream = torch.cuda.current_stream()
    out = torch.full(ctx.out_shape, float("nan"), dtype=inputs[0].dtype, device="cuda")
    attrs_n = dict(ctx.attrs)

    def fn():
        spec.launch(ArgPack(inputs, out, attrs_n, config, ws, stream))

    if not reasons or not check:
        fn()
    return out, reasons, fn


def ref64(op: str, inputs: tuple, attrs: tuple) -> np.ndarray:
    conv = [None if t is None else t.double().cpu().numpy() for t in inputs]
    return np.asarray(REG.op(op).reference(*conv, *attrs))


def record_check(name: str, out, ref: np.ndarray, tol: float, reasons=()):
    if reasons:
        RESULTS["checks"].append({"name": name, "status": "rejected", "reasons": list(reasons)})
        print(f"  {name}: REJECTED {reasons}")
        return
    got = out.double().cpu().numpy()
    finite = bool(np.isfinite(got).all())
    err = float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))
    ok = finite and err < tol
    RESULTS["checks"].append({"name": name, "status": "ok" if ok else "FAIL", "relerr": err, "finite": finite})
    print(f"  {name}: {'ok' if ok else 'FAIL'} relerr={err:.2e} finite={finite}")


def rnd(*shape, dtype=torch.bfloat16, scale=1.0):
    return (torch.randn(*shape, device="cuda", dtype=torch.float32) * scale).to(dtype)


def correctness():
    print("== correctness")
    tol = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-5}
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for batch, n, k in (((1000,), 392, 520), ((3, 337), 256, 1024), ((), 264, 136)):
            x = rnd(*batch, k, dtype=dtype)
            w = rnd(n, k, dtype=dtype, scale=k**-0.5)
            b = rnd(n, dtype=dtype)
            for act in (None, "relu", "gelu"):
                for bias in (b, None):
                    for kern in ("cublasLt", "torch"):
                        name = (
                            f"linear/{kern} {dtype} x{tuple(x.shape)} w{tuple(w.shape)} bias={bias is not None} {act}"
                        )
                        try:
                            out, reasons, _ = call("linear", kern, (x, w, bias), (act,), check=False)
                            record_check(name, out, ref64("linear", (x, w, bias), (act,)), tol[dtype])
                            if reasons:
                                RESULTS["checks"][-1]["conditions_say"] = reasons
                        except Exception as exc:
                            RESULTS["checks"].append({"name": name, "status": "ERROR", "error": repr(exc)})
                            print(f"  {name}: ERROR {exc!r}")
    # non-contiguous weight (transposed storage) and an offset x view
    for dtype in (torch.bfloat16,):
        w = rnd(512, 384, dtype=dtype, scale=0.05).t()  # (384, 512) with strides (1, 384)
        x = rnd(700, 520, dtype=dtype)[:, 8:]  # (700, 512), row stride 520, offset 16 bytes
        for kern in ("cublasLt", "torch"):
            out, reasons, _ = call("linear", kern, (x, w, None), ("gelu",), check=False)
            record_check(f"linear/{kern} strided views", out, ref64("linear", (x, w, None), ("gelu",)), 2e-2)
            RESULTS["checks"][-1]["conditions_say"] = reasons
    # matmul
    for dtype in (torch.bfloat16, torch.float32):
        cases = [((520, 392), (392, 264)), ((3, 200, 136), (3, 136, 264)), ((4, 100, 256), (256, 512)),
                 ((256,), (256, 1000)), ((1000, 256), (256,))]  # fmt: skip
        for sa, sb in cases:
            a, bm = rnd(*sa, dtype=dtype), rnd(*sb, dtype=dtype, scale=0.1)
            for kern in ("cublasLt", "torch"):
                name = f"matmul/{kern} {dtype} {sa}@{sb}"
                try:
                    out, reasons, _ = call("matmul", kern, (a, bm), (), check=False)
                    record_check(name, out, ref64("matmul", (a, bm), ()), tol[dtype])
                except Exception as exc:
                    RESULTS["checks"].append({"name": name, "status": "ERROR", "error": repr(exc)})
                    print(f"  {name}: ERROR {exc!r}")
    # backward ops
    for dtype in (torch.bfloat16, torch.float32):
        dy = rnd(3, 337, 392, dtype=dtype)
        w = rnd(392, 520, dtype=dtype, scale=0.05)
        pre = rnd(3, 337, 520, dtype=dtype)
        x = rnd(3, 337, 520, dtype=dtype)
        for act in (None, "gelu", "relu"):
            for kern in ("cublasLt", "torch"):
                name = f"linear_grad_input/{kern} {dtype} {act}"
                try:
                    p = pre if act else None
                    out, reasons, _ = call("linear_grad_input", kern, (dy, w, p), (act,), check=False)
                    if kern == "cublasLt" and act == "relu":
                        continue
                    record_check(name, out, ref64("linear_grad_input", (dy, w, p), (act,)), tol[dtype] * 2)
                except Exception as exc:
                    RESULTS["checks"].append({"name": name, "status": "ERROR", "error": repr(exc)})
                    print(f"  {name}: ERROR {exc!r}")
        for bias in (False, True):
            for kern in ("cublasLt", "torch"):
                name = f"linear_grad_weight/{kern} {dtype} bias={bias}"
                try:
                    out, reasons, _ = call("linear_grad_weight", kern, (dy, x), (bias,), check=False)
                    record_check(name, out, ref64("linear_grad_weight", (dy, x), (bias,)), tol[dtype] * 2)
                except Exception as exc:
                    RESULTS["checks"].append({"name": name, "status": "ERROR", "error": repr(exc)})
                    print(f"  {name}: ERROR {exc!r}")


def bench(name: str, fn, flops: float = 0, nbytes: float = 0) -> float:
    ms = float(do_bench(fn, warmup=25, rep=150, return_mode="median"))
    row = {"name": name, "ms": ms}
    if flops:
        row["tflops"] = flops / ms / 1e9
    if nbytes:
        row["tbps"] = nbytes / ms / 1e9
    RESULTS["timings"].append(row)
    extra = (f" {row['tflops']:.0f} TFLOP/s" if flops else "") + (f" {row['tbps']:.2f} TB/s" if nbytes else "")
    print(f"  {name}: {ms:.4f} ms{extra}")
    return ms


def timings():
    print("== timings (bf16)")
    for s in (4096, 8192):
        a, b = rnd(s, s), rnd(s, s)
        _, reasons, fn = call("matmul", "cublasLt", (a, b), ())
        assert not reasons, reasons
        t1 = bench(f"matmul cublasLt {s}^3", fn, 2 * s**3)
        t0 = bench(f"matmul torch.matmul {s}^3", lambda a=a, b=b: torch.matmul(a, b), 2 * s**3)
        RESULTS["timings"].append({"name": f"ratio matmul {s}^3 cublasLt/torch", "ratio": t0 / t1})
    for m in (8192, 2048):
        n = k = 4096
        x, w, bias = rnd(m, k), rnd(n, k, scale=k**-0.5), rnd(n)
        _, reasons, fn = call("linear", "cublasLt", (x, w, bias), ("gelu",))
        assert not reasons, reasons
        t1 = bench(f"linear+bias+gelu cublasLt {m}x{n}x{k}", fn, 2 * m * n * k)
        t0 = bench(
            f"eager gelu(linear(x)+b) {m}x{n}x{k}",
            lambda x=x, w=w, bias=bias: F.gelu(F.linear(x, w) + bias),
            2 * m * n * k,
        )
        _, _, fn_t = call("linear", "torch", (x, w, bias), ("gelu",), check=False)
        t2 = bench(f"linear torch kernel (_addmm_activation) {m}x{n}x{k}", fn_t, 2 * m * n * k)
        RESULTS["timings"].append({"name": f"ratio linear gelu {m} cublasLt/eager", "ratio": t0 / t1,
                                   "torch_kernel_ratio": t0 / t2})  # fmt: skip
    # backward at 8192x4096x4096
    m, n, k = 8192, 4096, 4096
    dy, w, pre, x = rnd(m, n), rnd(n, k, scale=0.02), rnd(m, k), rnd(m, k)
    for act in (None, "gelu"):
        _, _, fn = call("linear_grad_input", "cublasLt", (dy, w, pre if act else None), (act,))
        bench(f"linear_grad_input cublasLt {act}", fn, 2 * m * n * k)
        _, _, fn = call("linear_grad_input", "torch", (dy, w, pre if act else None), (act,), check=False)
        bench(f"linear_grad_input torch {act}", fn, 2 * m * n * k)
    for bias in (False, True):
        for kern in ("cublasLt", "torch"):
            try:
                _, _, fn = call("linear_grad_weight", kern, (dy, x), (bias,), check=False)
                bench(f"linear_grad_weight {kern} bias={bias}", fn, 2 * m * n * k)
            except Exception as exc:
                print(f"  linear_grad_weight {kern} bias={bias}: ERROR {exc!r}")
    # GEMV M=1 against a copy of the weight
    for kk, nn in ((8192, 8192), (4096, 16384)):
        v, wt = rnd(1, kk), rnd(kk, nn, scale=0.01)
        nbytes = wt.numel() * 2
        dst = torch.empty_like(wt)
        tc = bench(f"copy {kk}x{nn} bf16 (anchor)", lambda dst=dst, wt=wt: dst.copy_(wt), nbytes=2 * nbytes)
        tt = bench(f"gemv torch.matmul 1x{kk}@{kk}x{nn}", lambda v=v, wt=wt: torch.matmul(v, wt), nbytes=nbytes)
        _, reasons, fn = call("matmul", "cublasLt", (v, wt), ())
        tl = bench(f"gemv cublasLt 1x{kk}@{kk}x{nn}", fn, nbytes=nbytes) if not reasons else None
        RESULTS["timings"].append({"name": f"gemv {kk}x{nn} fraction of copy bandwidth",
                                   "torch": (nbytes / tt) / (2 * nbytes / tc),
                                   "cublasLt": None if tl is None else (nbytes / tl) / (2 * nbytes / tc)})  # fmt: skip


def variants():
    """GELU_BIAS at 8192x4096x4096 under plan variants: workspace limit, in-place C vs A/B-only plans."""
    print("== plan variants (linear gelu 8192x4096x4096)")
    from xpuruntime.backends.cublaslt import common

    m = n = k = 4096
    m = 8192
    x, w, bias = rnd(m, k), rnd(n, k, scale=k**-0.5), rnd(n)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    a, b, c = w, x.t(), out.t()
    limit = common.WORKSPACE_LIMIT
    for name, lim, raw, ab in (("ab-only raw 32MiB", limit, True, True), ("inplace raw 32MiB", limit, True, False),
                               ("inplace execute 32MiB", limit, False, False), ("ab-only raw 1GiB", 1 << 30, True, True),
                               ("inplace raw 1GiB", 1 << 30, True, False)):  # fmt: skip
        common.WORKSPACE_LIMIT = lim
        plan = common.GemmPlan(a, b, c, "GELU_BIAS", {"bias": bias}, None, None, raw=raw, ab_only=ab)
        ws = torch.empty(max(plan.workspace_size, 1), dtype=torch.uint8, device="cuda")
        t = bench(
            f"variant {name} (raw={plan.raw}, inplace={plan.inplace}, ws={plan.workspace_size})",
            lambda plan=plan, ws=ws: plan.run(a, b, c, bias=bias, workspace=ws),
            2 * m * n * k,
        )
        RESULTS["timings"].append({"name": f"variant {name}", "ms": t})
        plan.free()
    common.WORKSPACE_LIMIT = limit
    t0 = bench("eager gelu(linear(x)+b) again", lambda: F.gelu(F.linear(x, w) + bias), 2 * m * n * k)
    RESULTS["timings"].append({"name": "eager again", "ms": t0})


def host_cost():
    print("== host cost per call (tiny problem, sync only at the end)")
    from xpuruntime.backends.cublaslt import common

    a, b = rnd(64, 64), rnd(64, 64)
    x, w, bias = rnd(64, 64), rnd(64, 64), rnd(64)
    _, _, fn = call("matmul", "cublasLt", (a, b), (), check=False)
    _, _, fn_lin = call("linear", "cublasLt", (x, w, bias), ("gelu",), check=False)
    out = torch.empty(64, 64, device="cuda", dtype=torch.bfloat16)
    plan = common.GemmPlan(a, b, out, None, None, None, None)

    def per_call(f, n=3000):
        for _ in range(200):
            f()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / n * 1e6

    RESULTS["host_us"]["matmul kernel launch (raw cuBLASLt path)"] = per_call(fn)
    RESULTS["host_us"]["linear gelu kernel launch (raw path)"] = per_call(fn_lin)
    RESULTS["host_us"]["plan.run raw (views -> pointers)"] = per_call(lambda: plan.run(a, b, out))
    pa, pb, po = a.data_ptr(), b.data_ptr(), out.data_ptr()
    RESULTS["host_us"]["plan.launch raw pointers"] = per_call(lambda: plan.launch(pa, pb, po))
    slow = common.GemmPlan(a, b, out, None, None, None, None, raw=False, ab_only=False)
    RESULTS["host_us"]["nvmath reset_operands_unchecked+execute"] = per_call(lambda: slow.run(a, b, out))
    RESULTS["host_us"]["torch.matmul"] = per_call(lambda: torch.matmul(a, b))
    RESULTS["host_us"]["torch.matmul out="] = per_call(lambda: torch.matmul(a, b, out=out))
    for k, v in RESULTS["host_us"].items():
        print(f"  {k}: {v} us")
    # the dispatcher, if it already takes CUDA tensors
    try:
        from xpuruntime.dispatch import Dispatcher

        d = Dispatcher(REG)
        from xpuruntime.policy import kernel_policy

        with kernel_policy(matmul="cublasLt", linear="cublasLt"):
            y = d.run("matmul", (a, b))
            RESULTS["host_us"]["dispatcher matmul (policy cublasLt, tiny: falls back)"] = per_call(
                lambda: d.run("matmul", (a, b))
            )
        big_x, big_w, big_b = rnd(4096, 4096), rnd(4096, 4096, scale=0.01), rnd(4096)
        with kernel_policy(linear="cublasLt"):
            y = d.run("linear", (big_x, big_w, big_b), ("gelu",))
            ref = F.gelu(F.linear(big_x.float(), big_w.float(), big_b.float()), approximate="tanh")
            err = ((y.float() - ref).norm() / ref.norm()).item()
            print(f"  dispatcher linear 4096^3 gelu relerr {err:.2e}")
            RESULTS["dispatcher_linear_relerr"] = err
            t = bench(
                "dispatcher linear gelu 4096^3 (policy cublasLt)",
                lambda: d.run("linear", (big_x, big_w, big_b), ("gelu",)),
                2 * 4096**3,
            )
            _, _, fn_big = call("linear", "cublasLt", (big_x, big_w, big_b), ("gelu",))
            t2 = bench("kernel launch linear gelu 4096^3", fn_big, 2 * 4096**3)
            RESULTS["timings"].append({"name": "dispatcher/kernel time ratio", "ratio": t / t2})
        print("  dispatcher:", d.plan("linear", big_x, big_w, big_b, activation="gelu").kernel.name)
    except Exception as exc:
        print("  dispatcher with CUDA tensors not usable yet:", repr(exc)[:300])
        RESULTS["host_us"]["dispatcher_error"] = repr(exc)[:300]


def dispatch_profile():
    """Host cost of the public call path at a host-bound size, and where it goes (cProfile)."""
    print("== dispatcher host cost (linear gelu 2048x4096x4096, gemv 1x8192x8192)")
    import cProfile
    import io
    import pstats

    import xpuruntime as xrt

    x, w, bias = rnd(2048, 4096), rnd(4096, 4096, scale=1 / 64), rnd(4096)
    v, wt = rnd(1, 8192), rnd(8192, 8192, scale=0.01)

    def per_call(f, n=300):
        for _ in range(20):
            f()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        host = (time.perf_counter() - t0) / n * 1e6
        torch.cuda.synchronize()
        total = (time.perf_counter() - t0) / n * 1e6
        return host, total

    def scoped():
        with xrt.kernel_policy(linear="cublasLt", strict=True):
            return xrt.ops.linear(x, w, bias, "gelu")

    cases = {
        "linear scoped policy": scoped,
        "linear auto": lambda: xrt.ops.linear(x, w, bias, "gelu"),
        "gemv auto": lambda: xrt.ops.matmul(v, wt),
        "gemv torch.matmul": lambda: torch.matmul(v, wt),
        "linear eager anchor": lambda: F.gelu(F.linear(x, w) + bias),
    }
    for name, f in cases.items():
        host, total = per_call(f)
        RESULTS["host_us"][f"{name} (host us/call, wall us/call)"] = (host, total)
        print(f"  {name}: host {host:.1f} us/call, wall {total:.1f} us/call")
    print(
        "  auto picks:",
        xrt.default_dispatcher().plan("linear", x, w, bias, activation="gelu").kernel.name,
        xrt.default_dispatcher().plan("matmul", v, wt).kernel.name,
    )
    for name in ("linear scoped policy", "gemv auto"):
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(200):
            cases[name]()
        prof.disable()
        torch.cuda.synchronize()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(14)
        print(f"  -- profile {name}")
        print("\n".join(line for line in buf.getvalue().splitlines()[6:30] if line.strip()))


def sanitize():
    """Every cuBLASLt kernel and epilogue once at small sizes (for compute-sanitizer memcheck/racecheck)."""
    print("== sanitize run")
    x, w, b = rnd(3, 96, 256), rnd(384, 256, scale=1 / 16), rnd(384)
    for act in (None, "relu", "gelu"):
        for bias in (b, None):
            call("linear", "cublasLt", (x, w, bias), (act,), check=False)
    for sa, sb in (((200, 256), (256, 136)), ((3, 64, 256), (3, 256, 128)), ((256,), (256, 384))):
        call("matmul", "cublasLt", (rnd(*sa), rnd(*sb)), (), check=False)
    dy, pre = rnd(3, 96, 384), rnd(3, 96, 256)
    for act in (None, "gelu"):
        call("linear_grad_input", "cublasLt", (dy, w, pre if act else None), (act,), check=False)
    for bias in (False, True):
        call("linear_grad_weight", "cublasLt", (dy, x), (bias,), check=False)
    torch.cuda.synchronize()
    print("  sanitize run done")


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "."
    print(torch.__version__, torch.cuda.get_device_name())
    import nvmath

    print("nvmath", nvmath.__version__, "backend unavailable?", REG.backends["cublaslt"].unavailable_reason)
    steps = (dispatch_profile, variants, correctness, timings, host_cost)
    if len(sys.argv) > 2 and sys.argv[2] == "sanitize":
        steps = (sanitize,)
    if len(sys.argv) > 2:  # a comma-separated subset of the steps, by name
        steps = [f for f in steps if f.__name__ in sys.argv[2].split(",")]
    for step in steps:
        try:
            step()
        except Exception:
            traceback.print_exc()
            RESULTS.setdefault("errors", []).append(traceback.format_exc())
    with open(f"{out_dir}/gemm_check.json", "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)
    bad = [c for c in RESULTS["checks"] if c["status"] in ("FAIL", "ERROR")]
    print(f"checks: {len(RESULTS['checks'])} total, {len(bad)} bad")
    for c in bad:
        print("  BAD", c)
    for t in RESULTS["timings"]:
        if "ratio" in t or "torch" in t:
            print("  ", t)


if __name__ == "__main__":
    main()
