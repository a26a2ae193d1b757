"""The model zoo at real size (zoo_models.py): ResNet-50, MobileNetV3, ViT-B/16, BERT-base, GPT-2, Llama, exported
with PyTorch's default (dynamo) exporter at opset 18.

CPU rows: InferenceSession beside onnxruntime, one thread each, at batch 1 and 8 (target: ours no slower).
GPU rows: InferenceSession on CUDA (CUDA graphs, inputs on the device) beside the same module under
torch.compile(mode="reduce-overhead") (the anchor) and in eager PyTorch (an alternative, timed in the same
interleaved rounds), in fp32 and fp16; outputs checked against eager within the dtype's tolerance.
Session rows: the first session's creation in a fresh process (imports included) and planning a new input
signature, beside onnxruntime's.

    xpuruntime bench --only zoo                 # everything that can run here
    xpuruntime bench --only "zoo bert"          # one model
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .common import close, needs_cuda, needs_onnxruntime
from .row import Row, Setup
from .zoo_models import ZOO, export

OPSET = 18
TEXT_SHAPES = {"bert": [(1, 128), (32, 128), (8, 512)], "gpt2": [(1, 128), (8, 512)], "llama": [(1, 128), (8, 512)]}
IMAGE_BATCHES = {"resnet50": [1, 64], "mobilenet_v3": [1, 64], "vit_b16": [1, 32]}


def _needs_zoo() -> str | None:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as exc:
        return f"needs PyTorch and transformers ({exc.name} missing)"
    return needs_onnxruntime()


def _say(text: str) -> None:
    """A progress line, flushed: exports and compiles take minutes at real size."""
    print(text, flush=True)


def _timed(what: str, fn: Any) -> tuple[Any, float]:
    """fn()'s result and the seconds it took, said when it ends."""
    start = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - start
    _say(f"  {what}: {seconds:.1f} s")
    return result, seconds


def _build(name: str, device: str, dtype: str) -> tuple[Any, bytes, dict[str, float]]:
    """The real-size module on `device` in `dtype`, its ONNX export, and the seconds each took."""
    import torch

    spec = ZOO[name]
    (model, example), built = _timed(f"{name} {dtype}: build", lambda: spec.build("real"))
    model = model.to(device, getattr(torch, dtype))
    example = tuple(t.to(device).to(getattr(torch, dtype)) if t.is_floating_point() else t.to(device) for t in example)
    data, seconds = _timed(f"{name} {dtype}: {exporter()} export, opset {OPSET}",
                           lambda: export(model, example, spec, exporter(), OPSET))  # fmt: skip
    return model, data, {"build": built, "export": seconds}


@functools.lru_cache(maxsize=1)
def _model(name: str, device: str, dtype: str) -> tuple[Any, bytes]:
    """The module and its export for the CPU rows (kept while the rows of one model run)."""
    model, data, _ = _build(name, device, dtype)
    return model, data


@dataclass
class GpuBundle:
    """What every GPU row of one model and dtype shares: the module, one session (a plan and CUDA graph per
    input signature, as a user's session keeps them), one torch.compile wrapper (it compiles again for a new
    shape, as it does for a user), and the seconds the one-off steps took."""

    model: Any
    session: Any
    compiled: Any
    seconds: dict[str, float] = field(default_factory=dict)


@functools.lru_cache(maxsize=1)  # the rows of one model and dtype run one after another
def _bundle(name: str, dtype: str) -> GpuBundle:
    import torch

    from ..onnx import InferenceSession

    model, data, seconds = _build(name, "cuda", dtype)
    session, seconds["session"] = _timed(f"{name} {dtype}: InferenceSession(device='cuda')",
                                         lambda: InferenceSession(data, device="cuda"))  # fmt: skip
    return GpuBundle(model, session, torch.compile(model, mode="reduce-overhead"), seconds)


def exporter() -> str:
    """PyTorch's default exporter (dynamo), or the TorchScript one where onnxscript, which it needs, is missing."""
    try:
        import onnxscript  # noqa: F401
    except ImportError:
        return "torchscript"
    return "dynamo"


def _feed(name: str, batch: int, seq: int | None) -> dict[str, np.ndarray]:
    return ZOO[name].feed("real", batch, np.random.default_rng(0), seq)


# -- CPU: beside onnxruntime, one thread each ------------------------------------------------------------------
def _cpu(name: str, batch: int) -> Setup:
    import onnxruntime as ort

    from ..onnx import InferenceSession, SessionOptions

    _, data = _model(name, "cpu", "float32")
    feed = _feed(name, batch, None)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    reference = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    session = InferenceSession(data, SessionOptions(intra_op_num_threads=1))

    def check() -> str | None:
        err = float(np.abs(session.run(None, feed)[0] - reference.run(None, feed)[0]).max())
        return None if err <= 1e-4 * max(1.0, float(np.abs(reference.run(None, feed)[0]).max())) else f"error {err:.2e}"

    fused = {r.name: r.changes for r in session.pass_summary if r.changes and r.name.endswith(("fusion", "folding"))}
    return Setup(ours=lambda: session.run(None, feed), anchor=lambda: reference.run(None, feed), check=check,
                 note=f"{exporter()} export; fusions {fused}")  # fmt: skip


# -- GPU: beside torch.compile with CUDA graphs and eager ------------------------------------------------------
def _gpu(name: str, dtype: str, batch: int, seq: int | None) -> Setup:
    import torch

    bundle = _bundle(name, dtype)
    model, session = bundle.model, bundle.session
    feed = {
        k: torch.from_numpy(v).cuda().to(getattr(torch, dtype) if v.dtype.kind == "f" else torch.int64)
        for k, v in _feed(name, batch, seq).items()
    }
    args = [feed[k] for k in ZOO[name].inputs]

    def eager() -> Any:
        with torch.no_grad():
            return model(*args)

    def anchor() -> Any:
        with torch.no_grad():
            return bundle.compiled(*args)

    def ours() -> Any:
        return session.run(None, feed)[0]

    shape = f"B{batch}" + (f" S{seq}" if seq else "")
    _, planned = _timed(f"{name} {dtype} {shape}: first run (planning, CUDA graph capture)", ours)
    _, compiled = _timed(f"{name} {dtype} {shape}: torch.compile's first call (compile, CUDA graphs)", anchor)
    tolerance = 1e-3 if dtype == "float32" else 2e-2
    fused = {r.name: r.changes for r in session.pass_summary if r.changes and r.name.endswith(("fusion", "folding"))}
    once = ", ".join(f"{k} {v:.0f} s" for k, v in bundle.seconds.items())
    note = (f"{exporter()} export; {session.runner.status()}; fusions {fused}; first run {planned:.1f} s, "
            f"compile {compiled:.0f} s; once per model: {once}")  # fmt: skip
    attended = feed["attention_mask"].bool() if "attention_mask" in feed else None

    def check() -> str | None:
        """Ours against eager where a token is attended: a padded position's hidden state is undefined (HF's
        SDPA path and its own export disagree there: onnxruntime differs from eager as much as ours does)."""
        got, want = ours(), eager()
        if attended is not None:
            got, want = got[attended], want[attended]
        return close(got, want, tolerance)

    return Setup(ours=ours, anchor=anchor, alternatives={"eager": eager}, check=check, note=note)


# -- session cost ----------------------------------------------------------------------------------------------
_FIRST_SESSION = """
import sys, time
start = time.perf_counter()
if sys.argv[1] == "ours":
    from xpuruntime.onnx import InferenceSession
    InferenceSession(sys.argv[2])
else:
    import onnxruntime
    onnxruntime.InferenceSession(sys.argv[2], providers=["CPUExecutionProvider"])
print(time.perf_counter() - start)
"""


def _session_cost(name: str) -> Setup:
    """Creation of the first session in a fresh process, and the first run at a new input signature (planning)."""
    import onnxruntime as ort

    from ..onnx import InferenceSession

    _, data = _model(name, "cpu", "float32")
    path = os.path.join(tempfile.mkdtemp(), f"{name}.onnx")
    with open(path, "wb") as f:
        f.write(data)

    def first_session(who: str) -> float:
        out = subprocess.run([sys.executable, "-c", _FIRST_SESSION, who, path], capture_output=True, text=True,
                             check=True)  # fmt: skip
        return float(out.stdout.strip().splitlines()[-1]) * 1e3

    def new_signature(make: Any) -> float:
        session, times = make(), []
        for seq in (16, 24, 40, 56, 72):
            feed = _feed(name, 2, seq)
            start = time.perf_counter()
            session.run(None, feed)
            times.append((time.perf_counter() - start) * 1e3)
        return float(np.median(times))

    def measure(timer: Any) -> dict[str, float]:
        ours = float(np.median([first_session("ours") for _ in range(3)]))
        theirs = float(np.median([first_session("onnxruntime") for _ in range(3)]))
        plan_ours = new_signature(lambda: InferenceSession(data))
        plan_theirs = new_signature(lambda: ort.InferenceSession(data, providers=["CPUExecutionProvider"]))
        print(f"{name}: first session {ours:.0f} ms (onnxruntime {theirs:.0f} ms); first run at a new signature "
              f"{plan_ours:.1f} ms (onnxruntime {plan_theirs:.1f} ms)")  # fmt: skip
        return {"ours": ours, "anchor": theirs, "new signature (ours)": plan_ours, "new signature (ort)": plan_theirs}

    return Setup(ours=lambda: None, measure=measure, note="ms; fresh process each, imports included")


def _rows() -> list[Row]:
    rows = []
    for name in ZOO:
        for batch in (1, 8):
            rows.append(Row(f"zoo {name} B{batch} (CPU) vs onnxruntime", "zoo CPU", lambda n=name, b=batch: _cpu(n, b),
                            target=1.0, units="ms", requires=_needs_zoo, anchor="onnxruntime, 1 thread",
                            doc="InferenceSession, 1 thread, same outputs"))  # fmt: skip
    for dtype in ("float16", "float32"):
        short = "fp16" if dtype == "float16" else "fp32"
        shapes = [(n, b, s) for n, v in TEXT_SHAPES.items() for b, s in v]
        shapes += [(n, b, None) for n, v in IMAGE_BATCHES.items() for b in v]
        for name, batch, seq in shapes:
            label = f"B{batch}" + (f" S{seq}" if seq else "")
            rows.append(Row(f"zoo {name} {short} {label} (GPU) vs compile", "zoo GPU",
                            lambda n=name, d=dtype, b=batch, s=seq: _gpu(n, d, b, s), target=1.0, units="ms",
                            requires=lambda: needs_cuda() or _needs_zoo(),
                            anchor="torch.compile(mode='reduce-overhead'); eager beside",
                            doc="InferenceSession on CUDA, CUDA graphs"))  # fmt: skip
    rows.append(Row("zoo bert session creation (CPU) vs onnxruntime", "zoo session", lambda: _session_cost("bert"),
                    target=None, units="ms", requires=_needs_zoo, anchor="onnxruntime.InferenceSession",
                    doc="first session in a process; planning a new signature"))  # fmt: skip
    return rows


ROWS = _rows()
