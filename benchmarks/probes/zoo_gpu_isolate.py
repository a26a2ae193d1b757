"""Which part of a zoo GPU row faults: our session alone (CUDA graphs on or off), or ours after
torch.compile(mode="reduce-overhead") ran in the same process. One case per process (a fault poisons the
CUDA context):

    python benchmarks/probes/zoo_gpu_isolate.py MODEL DTYPE CASE   (CASE: graphs, nographs, after_compile)
"""

from __future__ import annotations

import sys

import torch

from xpuruntime.bench import zoo
from xpuruntime.onnx import InferenceSession, SessionOptions


def main() -> None:
    name, dtype, case = sys.argv[1:4]
    model, data, _ = zoo._build(name, "cuda", dtype)
    feed = {
        k: torch.from_numpy(v).cuda().to(getattr(torch, dtype) if v.dtype.kind == "f" else torch.int64)
        for k, v in zoo._feed(name, 1, 128).items()
    }
    if case == "after_compile":
        compiled = torch.compile(model, mode="reduce-overhead")
        with torch.no_grad():
            for _ in range(3):
                compiled(*[feed[k] for k in zoo.ZOO[name].inputs])
        torch.cuda.synchronize()
        print("compile ok", flush=True)
    options = SessionOptions(enable_cuda_graph=case != "nographs")
    session = InferenceSession(data, options, device="cuda")
    for i in range(5):
        out = session.run(None, feed)[0]
        torch.cuda.synchronize()
        print(f"{case}: run {i} ok, {float(torch.as_tensor(out).float().abs().max()):.3f}", flush=True)
    with torch.no_grad():
        want = model(*[feed[k] for k in zoo.ZOO[name].inputs])
    want = want[0] if isinstance(want, tuple | list) else getattr(want, "last_hidden_state", want)
    print(case, "max err vs eager", float((torch.as_tensor(out).float() - want.float()).abs().max()))


if __name__ == "__main__":
    main()
