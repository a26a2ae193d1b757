"""MatMul and Gemm on the CPU by a constant fp32 weight: oneDNN with the weight packed once (linalg.PackedLinear)
where PyTorch is installed, for 2 to linalg.MAX_ROWS (512) rows, NumPy otherwise; both match a float64 product at
any row count (padded rows, broadcast batch dims, transB, bias shapes), the cases the packed path declines run on
NumPy, a weight that can change between runs is never taken for a constant, and memory stays bounded across many
row counts."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx_models import make, randn, vi
from test_onnx_reliability import GIB, run_limited

from xpuruntime.onnx import InferenceSession
from xpuruntime.onnx.ops import linalg

K, N = 512, 520  # K * N >= linalg.MIN_WEIGHT: large enough for the packed path


@pytest.fixture(params=["onednn", "numpy"])
def path(request, monkeypatch) -> str:
    if request.param == "onednn":
        pytest.importorskip("torch")
    else:
        monkeypatch.setattr(linalg, "ONEDNN_GEMM", False)
    return request.param


@pytest.fixture
def packed_calls(monkeypatch) -> list:
    """The row counts of every call the packed path ran."""
    calls: list = []
    run = linalg.PackedLinear._run

    def counted(x, packed, bias, pad=True):
        calls.append(x.shape[0])
        return run(x, packed, bias, pad)

    monkeypatch.setattr(linalg.PackedLinear, "_run", staticmethod(counted))
    return calls


def _runs(model, feed: dict, times: int = 3) -> list:
    session = InferenceSession(model.SerializeToString())
    return [session.run(None, {k: v.copy() for k, v in feed.items()})[0] for _ in range(times)]


def _close(got: np.ndarray, want: np.ndarray, k: int) -> None:
    """Within fp32 rounding of a k-term dot product of these magnitudes."""
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=0, atol=scale * 2e-6 * np.sqrt(k) + 1e-6)


@pytest.mark.parametrize("padded", [False, True], ids=["exact rows", "padded rows"])
@pytest.mark.parametrize("shape", [(1,), (2,), (5,), (16,), (17,), (128,), (130,), (300,), (2, 3, 45), (4, 64), (600,)])
def test_matmul_by_a_constant_weight_matches_float64(path, packed_calls, rng, monkeypatch, shape, padded) -> None:
    """Padded rows (to 2, 4, 8, then multiples of 16) once a node has run EXACT_ROW_COUNTS row counts unpadded."""
    if padded:
        monkeypatch.setattr(linalg, "EXACT_ROW_COUNTS", 0)
    w = randn(rng, K, N) / 8
    x = randn(rng, *shape, K)
    model = make([helper.make_node("MatMul", ["x", "w"], ["y"])], [vi("x", [None] * (len(shape) + 1))],
                 [vi("y", None)], {"w": w}, 17)  # fmt: skip
    want = np.matmul(x.astype(np.float64), w.astype(np.float64))
    for got in _runs(model, {"x": x}):
        assert got.shape == want.shape and got.dtype == np.float32
        _close(got, want, K)
    rows = int(np.prod(shape))
    if path == "onednn" and linalg.MIN_ROWS <= rows <= linalg.MAX_ROWS:  # the runs after the weight's first sight
        assert packed_calls and all(r == rows for r in packed_calls)
    else:
        assert not packed_calls


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("bias", ["vector", "row", "none"])
@pytest.mark.parametrize("rows", [16, 77, 128, 200, 530])
def test_gemm_by_a_constant_weight_matches_float64(path, packed_calls, rng, trans_b, bias, rows) -> None:
    w = randn(rng, *((N, K) if trans_b else (K, N))) / 8
    consts = {"w": w}
    inputs = ["a", "w"]
    if bias != "none":
        consts["c"] = randn(rng, *((N,) if bias == "vector" else (1, N)))
        inputs.append("c")
    model = make([helper.make_node("Gemm", inputs, ["y"], transB=trans_b)], [vi("a", ["m", K])], [vi("y", None)],
                 consts, 17)  # fmt: skip
    a = randn(rng, rows, K)
    want = a.astype(np.float64) @ (w.T if trans_b else w).astype(np.float64)
    if bias != "none":
        want = want + consts["c"].astype(np.float64)
    for got in _runs(model, {"a": a}):
        _close(got, want, K)
    assert bool(packed_calls) == (path == "onednn" and rows <= linalg.MAX_ROWS)


@pytest.mark.parametrize(
    "case", ["alpha", "beta", "transA", "full C", "few rows", "small weight", "float64", "fed weight"]
)
def test_what_the_packed_path_declines_runs_on_numpy(packed_calls, rng, case) -> None:
    pytest.importorskip("torch")
    dtype = np.float64 if case == "float64" else np.float32
    k, n = (8, 8) if case == "small weight" else (K, N)
    rows = 1 if case == "few rows" else 40  # one row: a matrix-vector product, NumPy's
    attrs = {"alpha": {"alpha": 0.5}, "beta": {"beta": 0.5}, "transA": {"transA": 1}}.get(case, {})
    a = randn(rng, *((k, rows) if case == "transA" else (rows, k)), dtype=dtype)
    w = randn(rng, k, n, dtype=dtype) / 8
    c = randn(rng, *((rows, n) if case == "full C" else (n,)), dtype=dtype)
    elem = TensorProto.DOUBLE if dtype == np.float64 else TensorProto.FLOAT
    consts = {"c": c} if case == "fed weight" else {"w": w, "c": c}
    inputs = [vi("a", list(a.shape), elem)] + ([vi("w", [k, n], elem)] if case == "fed weight" else [])
    model = make([helper.make_node("Gemm", ["a", "w", "c"], ["y"], **attrs)], inputs, [vi("y", None, elem)],
                 consts, 17)  # fmt: skip
    a64 = a.astype(np.float64).T if case == "transA" else a.astype(np.float64)
    want = attrs.get("alpha", 1.0) * (a64 @ w.astype(np.float64)) + attrs.get("beta", 1.0) * c.astype(np.float64)
    session = InferenceSession(model.SerializeToString())
    feed = {"a": a, "w": w} if case == "fed weight" else {"a": a}
    for _ in range(3):
        _close(session.run(None, feed)[0], want, k)
    assert not packed_calls


def test_a_weight_fed_and_changed_in_place_is_never_taken_for_a_constant(packed_calls, rng) -> None:
    """The same array object fed on every run, its values changed between runs (a preallocated input)."""
    model = make([helper.make_node("MatMul", ["x", "w"], ["y"])], [vi("x", [64, K]), vi("w", [K, N])],
                 [vi("y", None)], {}, 17)  # fmt: skip
    session = InferenceSession(model.SerializeToString())
    x, w = randn(rng, 64, K), randn(rng, K, N)
    for _ in range(4):
        w[:] = randn(rng, K, N)
        _close(session.run(None, {"x": x, "w": w})[0], x.astype(np.float64) @ w.astype(np.float64), K)
    # a read-only weight fed anew on each run: packed only when the same object comes twice, so never here
    for _ in range(3):
        w2 = randn(rng, K, N)
        w2.flags.writeable = False
        _close(session.run(None, {"x": x, "w": w2})[0], x.astype(np.float64) @ w2.astype(np.float64), K)
    assert not packed_calls


@pytest.mark.parametrize("policy", ["matmul=numpy_blas", "matmul=blocked"])
def test_a_policy_that_picks_the_matmul_kernel_keeps_it(packed_calls, rng, policy) -> None:
    pytest.importorskip("torch")
    model = make([helper.make_node("MatMul", ["x", "w"], ["y"])], [vi("x", [64, K])], [vi("y", None)],
                 {"w": randn(rng, K, N) / 8}, 17)  # fmt: skip
    session = InferenceSession(model.SerializeToString(), policy=policy)
    feed = {"x": randn(rng, 64, K)}
    for _ in range(3):
        session.run(None, feed)
    assert not packed_calls
    assert f"matmul/{policy.split('=')[1]}" in session.explain(feed)


def test_many_row_counts_keep_memory_bounded() -> None:
    """oneDNN keeps a primitive (and its memory) per distinct row count: 300 row counts through a 768 x 3072 weight
    grow resident memory by less than 48 MB after the 40th (the first 4 row counts as they are, then rows padded to
    multiples of 16, more than 512 on NumPy: at most 4 + 32 row counts, 20 padded ones here; all unpadded, one
    oneDNN primitive per row count grew it ~1-2 MB each at 100-200 rows). The first row counts run unpadded."""
    pytest.importorskip("torch")
    code = """
        import resource
        import numpy as np
        from onnx import helper, TensorProto, numpy_helper
        from xpuruntime.onnx import InferenceSession
        from xpuruntime.onnx.ops import linalg
        rng = np.random.default_rng(0)
        w = (rng.standard_normal((768, 3072)) / 30).astype(np.float32)
        graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", 768])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                                  [numpy_helper.from_array(w, "w")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
        session = InferenceSession(model.SerializeToString())
        calls = []
        run = linalg.PackedLinear._run
        linalg.PackedLinear._run = staticmethod(lambda x, p, b, pad: calls.append((len(x), pad)) or run(x, p, b, pad))
        for m in range(17, 317):
            x = rng.standard_normal((m, 768)).astype(np.float32)
            for _ in range(2):
                session.run(None, {"x": x})
            if m == 56:
                early = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        late = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print("packed_calls", len(calls), "growth_mb", (late - early) // 1024)
        print("unpadded", sorted({m for m, pad in calls if not pad}))
    """
    result = run_limited(code, 4 * GIB, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    words = result.stdout.split()
    assert int(words[1]) >= 200 and int(words[3]) < 48, result.stdout
    assert result.stdout.splitlines()[1] == "unpadded [17, 18, 19, 20]", result.stdout
