"""Norms: our Triton layer norm and RMS norm, forward and forward + backward, against PyTorch's."""

from __future__ import annotations

from .common import close, forced, kernel_alternatives, needs_triton, randn
from .row import Row, Setup

M, N = 8192, 4096


def _auto_or_forced(step, calls: list) -> object:
    """`step` as is when auto picks the Triton kernel for every op in it, else under a policy naming them."""
    import xpuruntime as xrt

    if all(xrt.explain(op, *inputs, show=False, **attrs).selected == "triton" for op, inputs, attrs in calls):
        return step
    policy = xrt.KernelPolicy(strict=True, **{op: "triton" for op, _, _ in calls})

    def forced_step() -> object:
        with xrt.kernel_policy(policy):
            return step()

    return forced_step


def _layer_norm_forward() -> Setup:
    import torch.nn.functional as F

    import xpuruntime as xrt

    x, w, b = randn(M, N, dtype="bfloat16"), randn(N, dtype="bfloat16"), randn(N, dtype="bfloat16")
    call = lambda: xrt.ops.layer_norm(x, N, w, b)  # noqa: E731
    ours = forced("layer_norm", "triton", call, x, w, b, normalized_shape=N)
    return Setup(
        ours=ours, anchor=lambda: F.layer_norm(x, (N,), w, b), bytes=2 * (2 * M * N + 2 * N),
        check=lambda: close(ours(), F.layer_norm(x, (N,), w, b), 2e-2),
        alternatives=kernel_alternatives("layer_norm", call, x, w, b, normalized_shape=N),
    )  # fmt: skip


def _layer_norm_forward_backward() -> Setup:
    import torch
    import torch.nn.functional as F

    import xpuruntime as xrt

    x, w, b, dy = (randn(*s, dtype="bfloat16") for s in ((M, N), (N,), (N,), (M, N)))
    xr, wr, br = (t.clone().requires_grad_() for t in (x, w, b))

    def step() -> object:
        y = xrt.ops.layer_norm(x, N, w, b)
        return y, xrt.ops.layer_norm_backward(dy, x, N, w)

    ours = _auto_or_forced(step, [("layer_norm", (x, w, b), {"normalized_shape": N}),
                                  ("layer_norm_backward", (dy, x, w), {"normalized_shape": N})])  # fmt: skip

    def anchor() -> object:
        y = F.layer_norm(xr, (N,), wr, br)
        return y, torch.autograd.grad(y, (xr, wr, br), dy)

    def check() -> str | None:
        (_, (dx, dw, db)), (_, (ax, aw, ab)) = ours(), anchor()
        return close(dx, ax, 2e-2) or close(dw, aw, 2e-2) or close(db, ab, 2e-2)

    return Setup(ours=ours, anchor=anchor, bytes=2 * 5 * M * N, check=check,
                 note="bytes: x, y (forward) + dy, x, dx (backward)")  # fmt: skip


def _rms_norm_forward() -> Setup:
    import torch.nn.functional as F

    import xpuruntime as xrt

    x, w = randn(M, N, dtype="bfloat16"), randn(N, dtype="bfloat16")
    call = lambda: xrt.ops.rms_norm(x, N, w, 1e-6)  # noqa: E731
    ours = forced("rms_norm", "triton", call, x, w, normalized_shape=N, eps=1e-6)
    return Setup(
        ours=ours, anchor=lambda: F.rms_norm(x, (N,), w, 1e-6), bytes=2 * (2 * M * N + N),
        check=lambda: close(ours(), F.rms_norm(x, (N,), w, 1e-6), 2e-2),
        alternatives=kernel_alternatives("rms_norm", call, x, w, normalized_shape=N, eps=1e-6),
    )  # fmt: skip


def _rms_norm_forward_backward() -> Setup:
    import torch
    import torch.nn.functional as F

    import xpuruntime as xrt

    x, w, dy = (randn(*s, dtype="bfloat16") for s in ((M, N), (N,), (M, N)))
    xr, wr = (t.clone().requires_grad_() for t in (x, w))

    def step() -> object:
        return xrt.ops.rms_norm(x, N, w, 1e-6), xrt.ops.rms_norm_backward(dy, x, N, w, 1e-6)

    ours = _auto_or_forced(step, [("rms_norm", (x, w), {"normalized_shape": N, "eps": 1e-6}),
                                  ("rms_norm_backward", (dy, x, w), {"normalized_shape": N, "eps": 1e-6})])  # fmt: skip

    def anchor() -> object:
        y = F.rms_norm(xr, (N,), wr, 1e-6)
        return y, torch.autograd.grad(y, (xr, wr), dy)

    return Setup(ours=ours, anchor=anchor, bytes=2 * 5 * M * N)


def _routed_forward_backward(op: str, m: int, n: int):
    """F.layer_norm / F.rms_norm forward + backward under `op="triton"` (the route, autograd and all) against
    PyTorch's, wall time per call: what a training step pays (issue 25 item 3)."""

    def setup() -> Setup:
        import statistics

        import torch.nn.functional as F
        from triton.testing import do_bench

        import xpuruntime as xrt
        import xpuruntime.pytorch as xtorch

        x, w, b, dy = (randn(*s, dtype="bfloat16") for s in ((m, n), (n,), (n,), (m, n)))
        for t in (x, w, b):
            t.requires_grad_()
        if op == "layer_norm":
            call = lambda: F.layer_norm(x, (n,), w, b).backward(dy)  # noqa: E731
        else:
            call = lambda: F.rms_norm(x, (n,), w, 1e-6).backward(dy)  # noqa: E731
        policy = xrt.KernelPolicy(**{op: "triton"})

        def measure(timer: object) -> dict[str, float]:
            times: dict[str, list[float]] = {"ours": [], "anchor": []}
            try:
                for _ in range(4):
                    for name, chosen in (("ours", policy), ("anchor", None)):
                        xtorch.set_kernel_policy(chosen)
                        times[name].append(float(do_bench(call, warmup=25, rep=100, return_mode="median")))
            finally:
                xtorch.clear_kernel_policy()
            return {name: statistics.median(values) for name, values in times.items()}

        note = "do_bench wall time (host-bound calls show their host time), alternating policies"
        return Setup(call, call, bytes=2 * 5 * m * n, measure=measure, note=note)

    return setup


_SHAPE = f"{M}x{N} bf16"
ROWS = [
    Row(f"layer_norm forward {_SHAPE}", "norm", _layer_norm_forward, target=2.6, target_kind="TB/s",
        requires=needs_triton, anchor="F.layer_norm", doc="Triton forward"),
    Row(f"layer_norm forward+backward {_SHAPE}", "norm", _layer_norm_forward_backward, target=1.3,
        requires=needs_triton, anchor="F.layer_norm with autograd", doc="Triton forward + layer_norm_backward"),
    Row(f"rms_norm forward {_SHAPE}", "norm", _rms_norm_forward, target=1.1, requires=needs_triton,
        anchor="F.rms_norm", doc="Triton forward"),
    Row(f"rms_norm forward+backward {_SHAPE}", "norm", _rms_norm_forward_backward, requires=needs_triton,
        anchor="F.rms_norm with autograd", doc="Triton forward + rms_norm_backward"),
]  # fmt: skip
ROWS += [
    Row(f"F.{op} forward+backward routed {m}x{n} bf16", "routed", _routed_forward_backward(op, m, n), target=1.0,
        requires=needs_triton, anchor=f"F.{op} forward+backward, no policy",
        doc=f"policy {op}=triton: the aten route, its autograd and our kernels, wall time")
    for op in ("layer_norm", "rms_norm") for m, n in ((8192, 4096), (16384, 1024))
]  # fmt: skip
