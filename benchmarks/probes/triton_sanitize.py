"""Small cases of every Triton kernel, for compute-sanitizer (memcheck / racecheck) on the GPU machine:

compute-sanitizer --tool memcheck python3 benchmarks/probes/triton_sanitize.py
"""

from __future__ import annotations

import torch

import xpuruntime as xrt
from xpuruntime.ops.fused_elementwise import fused_elementwise


def main() -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    r = lambda *s, dt=torch.float32: torch.randn(*s, device="cuda", generator=g).to(dt)  # noqa: E731
    x, w = r(37, 1000, dt=torch.bfloat16), r(1000, dt=torch.bfloat16)
    long_x, long_w = r(3, 20001), r(20001)
    with xrt.kernel_policy(strict=True, sin_affine="triton", sum="triton", softmax="triton", layer_norm="triton",
                           rms_norm="triton", layer_norm_backward="triton", rms_norm_backward="triton"):  # fmt: skip
        xrt.ops.sin_affine(r(33, 65)[:, ::2], r(33, 1), 0.5)
        for axis in (-1, 0, (0, 1)):
            xrt.ops.sum(r(45, 77), axis)
        xrt.ops.sum(r(2, 300001), -1)  # split into partials
        xrt.ops.softmax(r(45, 77), -1)
        xrt.ops.softmax(r(3, 20001), -1)  # looped
        xrt.ops.softmax(r(45, 77), 0)
        for xx, ww in ((x, w), (long_x, long_w)):
            n = xx.shape[-1]
            xrt.ops.layer_norm(xx, n, ww, ww)
            xrt.ops.rms_norm(xx, n, ww)
            xrt.ops.layer_norm_backward(xx, xx, n, ww)
            xrt.ops.rms_norm_backward(xx, xx, n, ww)
    a, bb = r(67, 129, dt=torch.bfloat16), r(129, 95, dt=torch.bfloat16)
    with xrt.kernel_policy(matmul="triton", strict=True):
        xrt.ops.matmul(a, bb)
        xrt.ops.matmul(r(2, 33, 40), r(40, 17))
    with xrt.kernel_policy(matmul="triton_splitk", strict=True):
        xrt.ops.matmul(r(19, 2100), r(2100, 23))
    from xpuruntime.backends.triton import matmul as tm

    c = torch.empty(1, 19, 23, device="cuda")
    tm._run({"precision": "ieee", "fp32": True}, r(1, 19, 2100), r(1, 2100, 23), c, (32, 32, 32, 4, 3, 4))
    with xrt.kernel_policy(matmul="triton_gemv", strict=True):
        xrt.ops.matmul(a, r(129, dt=torch.bfloat16))
    with xrt.kernel_policy(matmul="triton_gemv_t", strict=True):
        xrt.ops.matmul(r(67, dt=torch.bfloat16), a)
    with xrt.kernel_policy(fused_elementwise="triton", strict=True):
        fused_elementwise((("add", ("in", 0), ("in", 1)), ("gelu", ("t", 0))), r(33, 65), r(65))
    torch.cuda.synchronize()
    print("sanitize cases done")


if __name__ == "__main__":
    main()
