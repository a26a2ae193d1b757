"""InferenceSession on the GPU: correctness against onnxruntime and timing against PyTorch eager and
torch.compile on the same BERT-style encoder (MiniLM-L6 shape), at the anchor's shapes.

    PYTHONPATH=src python3 benchmarks/inference_gpu.py OUT_DIR [--quick]

Writes OUT_DIR/inference_gpu.json and prints a table last. Times are the median wall time of one
forward including synchronize (the anchor's method), after warm-up, inputs already on the device.
"""

from __future__ import annotations

import io
import json
import math
import statistics
import sys
import time
import traceback
import warnings

import numpy as np
import torch

warnings.filterwarnings("ignore")
START = time.time()
SHAPES = ((32, 128), (1, 128), (64, 256))  # the headline shape first
DTYPES = ("float16", "float32")
TIME_BUDGET_S = 200  # torch.compile rows after this many seconds are skipped (device time is scarce)
OUT_PATH = "inference_gpu.json"


class Layer(torch.nn.Module):
    """One HF-BERT-style post-norm encoder layer, eager code as exporters see it."""

    def __init__(self, hidden: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.q, self.k, self.v, self.o = (torch.nn.Linear(hidden, hidden) for _ in range(4))
        self.ln1, self.ln2 = torch.nn.LayerNorm(hidden, eps=1e-12), torch.nn.LayerNorm(hidden, eps=1e-12)
        self.up, self.down = torch.nn.Linear(hidden, ffn), torch.nn.Linear(ffn, hidden)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        return x.view(b, s, self.heads, self.head_dim).permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim) + mask
        ctx = torch.matmul(torch.softmax(scores, dim=-1), v).permute(0, 2, 1, 3).reshape(x.shape)
        x = self.ln1(x + self.o(ctx))
        return self.ln2(x + self.down(torch.nn.functional.gelu(self.up(x))))


class Encoder(torch.nn.Module):
    def __init__(self, vocab: int = 30522, hidden: int = 384, heads: int = 12, ffn: int = 1536, layers: int = 6):
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(vocab, hidden), torch.nn.Embedding(512, hidden)
        self.ln = torch.nn.LayerNorm(hidden, eps=1e-12)
        self.layers = torch.nn.ModuleList(Layer(hidden, heads, ffn) for _ in range(layers))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        x = self.ln(self.tok(input_ids) + self.pos(positions))
        mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * -10000.0
        for layer in self.layers:
            x = layer(x, mask)
        return x


def export(model: torch.nn.Module, device: str) -> bytes:
    ids = torch.randint(0, 1000, (2, 8), device=device)
    mask = torch.ones(2, 8, dtype=torch.int64, device=device)
    dynamic = {n: {0: "batch", 1: "seq"} for n in ("input_ids", "attention_mask", "out")}
    buffer = io.BytesIO()
    with torch.no_grad():
        torch.onnx.export(model, (ids, mask), buffer, input_names=["input_ids", "attention_mask"],
                          output_names=["out"], dynamic_axes=dynamic, opset_version=17, dynamo=False)  # fmt: skip
    return buffer.getvalue()


def feed(batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), np.int64)
    mask[:, seq - seq // 4 :] = rng.integers(0, 2, (batch, seq // 4))  # about 25% of keys may be masked
    return {"input_ids": rng.integers(0, 30522, (batch, seq)).astype(np.int64), "attention_mask": mask}


def wall_ms(fn, iters: int = 30, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def check_correctness(results: dict) -> None:
    """fp32 model: ours on the GPU vs onnxruntime (CPU) at two signatures, with and without CUDA graphs."""
    import onnxruntime as ort

    from xpuruntime.onnx import InferenceSession, SessionOptions

    torch.manual_seed(0)
    model = Encoder(layers=2).eval()
    data = export(model, "cpu")
    reference = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for graphs in (True, False):
        session = InferenceSession(data, SessionOptions(enable_cuda_graph=graphs), device="cuda")
        for batch, seq in ((2, 9), (3, 16), (2, 9)):
            f = feed(batch, seq, seed=batch * seq)
            want = reference.run(None, f)[0]
            got = session.run(None, f)[0]
            tensors = session.run(None, {k: torch.from_numpy(v).cuda() for k, v in f.items()})[0]
            err = float(np.abs(got - want).max())
            err_t = float(np.abs(tensors.cpu().numpy() - want).max())
            results["correctness"].append({"cuda_graph": graphs, "batch": batch, "seq": seq, "max_abs_err": err,
                                           "max_abs_err_tensor_feed": err_t, "ok": max(err, err_t) <= 1e-3})  # fmt: skip
        results["correctness_explain"] = session.explain()
        results["graph_notes_correctness"] = sorted({e.note for e in session.runner.cache.values()})


def time_encoder(results: dict, quick: bool) -> None:
    from xpuruntime.onnx import InferenceSession

    for dtype in DTYPES:
        try:
            torch.manual_seed(0)
            model = Encoder().eval().to("cuda", getattr(torch, dtype))
            data = export(model, "cuda")
            session = InferenceSession(data, device="cuda")
        except Exception:
            results.setdefault("errors", []).append(f"{dtype}: " + traceback.format_exc()[-3000:])
            continue
        compiled = {}
        for batch, seq in SHAPES[:1] if quick else SHAPES:
            row = {"dtype": dtype, "B": batch, "S": seq}
            try:
                time_row(row, model, session, compiled)
            except Exception:
                row["error"] = traceback.format_exc()[-3000:]
                print(row["error"], flush=True)
            results["timing"].append(row)
            save(results)
            print(json.dumps({k: v for k, v in row.items() if k != "error"}), flush=True)
        results.setdefault("plan_summary", {})[dtype] = session.plan_summary()
        results.setdefault("explain", {})[dtype] = session.explain(verbose=True)


def time_row(row: dict, model: torch.nn.Module, session: object, compiled: dict) -> None:
    """Eager, ours (CUDA graphs on), torch.compile default and reduce-overhead at one shape."""
    batch, seq = row["B"], row["S"]
    f = feed(batch, seq, seed=7)
    tf = {k: torch.from_numpy(v).cuda() for k, v in f.items()}
    with torch.inference_mode():
        eager_out = model(tf["input_ids"], tf["attention_mask"])
        row["eager_ms"] = wall_ms(lambda m=model, t=tf: m(t["input_ids"], t["attention_mask"]))
    start = time.time()
    ours_out = session.run(None, tf)[0]
    row["ours_first_s"] = round(time.time() - start, 2)
    row["ours_ms"] = wall_ms(lambda s=session, t=tf: s.run(None, t))
    row["ours_vs_eager_maxabs"] = float((ours_out.float() - eager_out.float()).abs().max())
    row["cuda_graph"] = session.runner.status()
    row["speedup_vs_eager"] = row["eager_ms"] / row["ours_ms"]
    for mode in ("default", "reduce-overhead"):
        if time.time() - START > TIME_BUDGET_S:
            row[f"compile_{mode}_ms"] = None
            continue
        try:
            key = (mode,)
            if key not in compiled:
                torch._dynamo.reset()
                compiled[key] = torch.compile(model, mode=mode, dynamic=False)
            fn = compiled[key]
            start = time.time()
            with torch.inference_mode():
                fn(tf["input_ids"], tf["attention_mask"])
                row[f"compile_{mode}_first_s"] = round(time.time() - start, 1)
                row[f"compile_{mode}_ms"] = wall_ms(lambda fn=fn, t=tf: fn(t["input_ids"], t["attention_mask"]))
            row[f"speedup_vs_compile_{mode}"] = row[f"compile_{mode}_ms"] / row["ours_ms"]
        except Exception as exc:
            row[f"compile_{mode}_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"


def save(results: dict) -> None:
    with open(OUT_PATH, "w") as f:
        json.dump(results, f, indent=1)


def main() -> None:
    global OUT_PATH
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "."
    OUT_PATH = f"{out_dir}/inference_gpu.json"
    quick = "--quick" in sys.argv
    results: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "correctness": [],
                     "timing": []}  # fmt: skip
    for stage in (check_correctness, lambda r: time_encoder(r, quick)):
        try:
            stage(results)
        except Exception:
            results.setdefault("errors", []).append(traceback.format_exc()[-3000:])
            print(traceback.format_exc(), flush=True)
        save(results)
    print("\ncorrectness (fp32 vs onnxruntime, <= 1e-3):")
    for c in results["correctness"]:
        print(f"  graphs={c['cuda_graph']!s:5} B{c['batch']} S{c['seq']}: max abs {c['max_abs_err']:.2e} "
              f"(tensor feed {c['max_abs_err_tensor_feed']:.2e}) {'ok' if c['ok'] else 'FAIL'}")  # fmt: skip
    print(f"\n{'dtype':8} {'B':>3} {'S':>4} {'eager':>8} {'ours':>8} {'x eager':>8} {'compile':>8} {'c+graphs':>8} "
          f"{'x c+g':>6}  graph")  # fmt: skip
    for r in results["timing"]:

        def ms(key: str, r: dict = r) -> str:
            return f"{r[key]:.3f}" if r.get(key) else "-"

        ratio = f"{r['speedup_vs_compile_reduce-overhead']:.2f}" if r.get("speedup_vs_compile_reduce-overhead") else "-"
        eager = f"{r['speedup_vs_eager']:.2f}" if r.get("speedup_vs_eager") else "-"
        note = r.get("cuda_graph", "ERROR: " + r.get("error", "?").strip().splitlines()[-1])
        print(f"{r['dtype']:8} {r['B']:>3} {r['S']:>4} {ms('eager_ms'):>8} {ms('ours_ms'):>8} "
              f"{eager:>8} {ms('compile_default_ms'):>8} {ms('compile_reduce-overhead_ms'):>8} "
              f"{ratio:>6}  {note[:60]}")  # fmt: skip
    print(f"total {time.time() - START:.0f} s; errors: {len(results.get('errors', []))}")


if __name__ == "__main__":
    main()
