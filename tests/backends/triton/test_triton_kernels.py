"""The Triton kernels against float64 references, through the dispatcher with the policy naming them.

Random inputs, odd sizes, broadcast, strided and offset views, 0-size dims, outputs poisoned with NaN, offsets
past 2**31 (reached without 4 GiB of data: a tiny view with one huge stride over an uninitialized buffer,
of which the OS backs only the pages touched).
On a GPU the shapes are full size; without one this module reruns itself under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import numpy as np
import pytest
from triton_harness import (
    DTYPES,
    INTERPRET,
    ON_GPU,
    POLICY_ALL,
    TORCH_DTYPES,
    assert_close,
    f64,
    kernel_test,
    make,
    poisoned,
    rerun_under_interpreter,
    size,
    strict,
    torch,
)  # fmt: skip

import xpuruntime as xrt
from xpuruntime.ops.elementwise import reference as sin_affine_reference
from xpuruntime.ops.matmul import reference as matmul_reference
from xpuruntime.ops.norm import layer_norm_reference, rms_norm_reference
from xpuruntime.ops.norm_backward import layer_norm_backward_reference, rms_norm_backward_reference
from xpuruntime.ops.reduction import reference as sum_reference
from xpuruntime.ops.softmax import reference as softmax_reference

if not (INTERPRET or ON_GPU):  # CPU-only machines (CI): run this module again under the interpreter

    def test_kernels_under_interpreter() -> None:
        rerun_under_interpreter(__file__)


# -- sin_affine -------------------------------------------------------------------------------------

SIN_CASES = [  # x shape, view of x, a, b  (("t", shape): a random tensor of that shape)
    (size((4099, 8193), (7, 13)), None, 1.5, -0.3),
    ((6, 10, 9), lambda t: t[:, ::2, 1:], ("t", (5, 1)), 0.7),
    ((4, 1), None, ("t", (9,)), ("t", (2, 4, 9))),
    ((2, 5, 4, 3), None, ("t", (2, 1, 4, 1)), ("t", (5, 1, 3))),
    ((0, 3), None, 1.0, 2.0),
    ((5,), None, ("t", ()), ("t", (1,))),
    ((1,), None, ("t", (3, 4)), 2),
]


@kernel_test
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(SIN_CASES)))
def test_sin_affine(rng, case: int, dtype: str) -> None:
    shape, view, a, b = SIN_CASES[case]
    x = make(rng, shape, dtype, view)
    a, b = (make(rng, v[1], dtype) if isinstance(v, tuple) else v for v in (a, b))
    ref = sin_affine_reference(f64(x), f64(a), f64(b))
    out = poisoned(ref.shape, dtype)
    with strict(sin_affine="triton"):
        result = xrt.ops.sin_affine(x, a, b, out=out)
        assert_close(result, ref, dtype)
        assert_close(xrt.ops.sin_affine(x, a, b), ref, dtype)


@kernel_test
def test_sin_affine_in_place(rng) -> None:
    x = make(rng, (33, 17), "float32")
    ref = sin_affine_reference(f64(x), 0.5, 0.25)
    with strict(sin_affine="triton"):
        xrt.ops.sin_affine(x, 0.5, 0.25, out=x)
    assert_close(x, ref, "float32")


# -- sum --------------------------------------------------------------------------------------------

SUM_CASES = [  # shape, view, axis, keepdims
    (size((8192, 8192), (7, 13)), None, -1, False),
    ((7, 13, 5), None, 0, True),
    ((7, 13, 5), None, 1, False),
    ((7, 13, 5), None, (0, 1), False),
    ((7, 13, 5), None, (1, 2), True),
    ((7, 13, 5), None, (0, 2), False),
    ((7, 13, 5), None, None, False),
    ((7, 13, 5), None, (), False),
    ((3, size(3_000_001, 40_001)), None, -1, False),  # few very long rows: split into partials
    ((size(1_000_003, 5003), 3), None, 0, True),  # long columns: split
    ((9, 11, 6), lambda t: t[:, ::2, 1:], 1, False),
    ((0, 4), None, 0, False),
    ((4, 0), None, 1, True),
]


@kernel_test
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(SUM_CASES)))
def test_sum(rng, case: int, dtype: str) -> None:
    shape, view, axis, keepdims = SUM_CASES[case]
    x = make(rng, shape, dtype, view, shift=0.0 if dtype == "float16" else 0.5)  # fp16 sums stay finite
    ref = sum_reference(f64(x), axis, keepdims)
    out = poisoned(ref.shape, dtype)
    with strict(sum="triton"):
        xrt.ops.sum(x, axis, keepdims, out=out)
    assert_close(out, ref, dtype, tol=2e-5 if dtype == "float32" else None)


# -- softmax ----------------------------------------------------------------------------------------

SOFTMAX_CASES = [  # shape, view, axis
    (size((4096, 4099), (5, 7, 9)), None, -1),
    ((5, 7, 9), None, 0),
    ((5, 7, 9), None, 1),
    ((3, size(100_003, 20_001)), None, -1),  # longer than one tile: online max/sum pass, then write
    ((size(100_003, 20_001), 3), None, 0),
    ((6, 8, 10), lambda t: t[:, ::2, ::3], 1),
    ((0, 5), None, 1),
]


@kernel_test
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(SOFTMAX_CASES)))
def test_softmax(rng, case: int, dtype: str) -> None:
    shape, view, axis = SOFTMAX_CASES[case]
    x = make(rng, shape, dtype, view, scale=3.0)
    ref = softmax_reference(f64(x), axis)
    out = poisoned(ref.shape, dtype)
    with strict(softmax="triton"):
        xrt.ops.softmax(x, axis, out=out)
    assert_close(out, ref, dtype)


@kernel_test
def test_softmax_row_of_minus_infinity_is_nan_and_strided_out(rng) -> None:
    x = make(rng, (4, 6), "float32")
    x[1] = -float("inf")
    out = poisoned((4, 12), "float32")[:, ::2]
    with strict(softmax="triton"):
        xrt.ops.softmax(x, -1, out=out)
    assert_close(out, softmax_reference(f64(x), -1), "float32")


# -- layer_norm / rms_norm, forward and backward ----------------------------------------------------

NORM_CASES = [  # x shape, view, normalized_shape, affine
    (size((8192, 4096), (5, 7)), None, -1, True),
    ((3, 4, 9), None, (4, 9), True),
    ((2, size(70_001, 20_001)), None, -1, True),  # longer than MAX_ONE_PASS: looped kernels
    ((0, 6), None, -1, True),
    ((6, 33), None, -1, False),
    ((6, 40), lambda t: t[:, 3:36], -1, True),  # offset view with a row stride != N
    ((size(1000, 37), 64), None, -1, True),  # several rows per program
]


def _norm_inputs(rng, case: int, dtype: str):
    shape, view, ns, affine = NORM_CASES[case]
    x = make(rng, shape, dtype, view, scale=2.0, shift=0.7)
    ns = tuple(x.shape[-1:]) if ns == -1 else ns
    w = make(rng, ns, dtype) if affine else None
    b = make(rng, ns, dtype) if affine else None
    return x, ns, w, b


@kernel_test
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(NORM_CASES)))
def test_layer_norm_and_rms_norm(rng, case: int, dtype: str) -> None:
    x, ns, w, b = _norm_inputs(rng, case, dtype)
    ref_ln = layer_norm_reference(f64(x), ns, None if w is None else f64(w), None if b is None else f64(b))
    ref_rms = rms_norm_reference(f64(x), ns, None if w is None else f64(w), 1e-6)
    out_ln, out_rms = poisoned(tuple(x.shape), dtype), poisoned(tuple(x.shape), dtype)
    with strict(layer_norm="triton", rms_norm="triton"):
        xrt.ops.layer_norm(x, ns, w, b, out=out_ln)
        xrt.ops.rms_norm(x, ns, w, 1e-6, out=out_rms)
    assert_close(out_ln, ref_ln, dtype)
    assert_close(out_rms, ref_rms, dtype)


@kernel_test
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(NORM_CASES)))
def test_norm_backward(rng, case: int, dtype: str) -> None:
    x, ns, w, _ = _norm_inputs(rng, case, dtype)
    dy = make(rng, tuple(x.shape), dtype)
    wf = None if w is None else f64(w)
    ref_ln = layer_norm_backward_reference(f64(dy), f64(x), ns, wf, 1e-5)
    ref_rms = rms_norm_backward_reference(f64(dy), f64(x), ns, wf, 1e-6)
    packed_ln, packed_rms = poisoned(ref_ln.shape, dtype), poisoned(ref_rms.shape, dtype)
    with strict(layer_norm_backward="triton", rms_norm_backward="triton"):
        dx, dw, db = xrt.ops.layer_norm_backward(dy, x, ns, w, 1e-5, out=packed_ln)
        xrt.ops.rms_norm_backward(dy, x, ns, w, 1e-6, out=packed_rms)
    m = ref_ln.shape[0] - 2
    assert_close(packed_ln[:m], ref_ln[:m], dtype)
    assert_close(packed_ln[m:], ref_ln[m:], dtype)
    assert_close(packed_rms[:m], ref_rms[:m], dtype)
    assert_close(packed_rms[m:], ref_rms[m:], dtype)
    assert tuple(dx.shape) == tuple(x.shape) and tuple(dw.shape) == tuple(ns) and tuple(db.shape) == tuple(ns)


@kernel_test
def test_norm_backward_is_deterministic(rng) -> None:
    x = make(rng, size((4099, 1024), (37, 24)), "float32")
    dy, w = make(rng, tuple(x.shape), "float32"), make(rng, tuple(x.shape[-1:]), "float32")
    with strict(layer_norm_backward="triton"):
        first = [f64(g) for g in xrt.ops.layer_norm_backward(dy, x, x.shape[-1], w)]
        second = [f64(g) for g in xrt.ops.layer_norm_backward(dy, x, x.shape[-1], w)]
    assert all(np.array_equal(a, b) for a, b in zip(first, second))


# -- matmul -----------------------------------------------------------------------------------------

MATMUL_CASES = [  # a shape, b shape, transpose a (column-major view)
    (size((1031, 2053), (17, 33)), size((2053, 771), (33, 19)), False),
    (size((1024, 4096), (17, 33)), size((4096, 1024), (33, 19)), True),
    ((2, 17, 20), (20, 9), False),
    ((3, 1, 5, 16), (2, 16, 7), False),
    ((33,), (33, 18), False),
    ((18, 33), (33,), True),
    ((40,), (40,), False),
    ((0, 5), (5, 3), False),
    ((4, 0), (0, 3), False),
]


def _matmul_reference(a, b) -> np.ndarray:
    if ON_GPU:
        return (a.double() @ b.double()).cpu().numpy()
    return matmul_reference(f64(a), f64(b))


def _operand(rng, shape: tuple[int, ...], dtype: str, transpose: bool):
    if transpose and len(shape) == 2:
        return make(rng, shape[::-1], dtype).swapaxes(0, 1)  # column-major storage
    return make(rng, shape, dtype)


@kernel_test
@pytest.mark.parametrize("kernel_name", ["triton", "triton_splitk"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(MATMUL_CASES)))
def test_matmul(rng, case: int, dtype: str, kernel_name: str) -> None:
    sa, sb, transpose = MATMUL_CASES[case]
    a, b = _operand(rng, sa, dtype, transpose), _operand(rng, sb, dtype, False)
    ref = _matmul_reference(a, b)
    out = poisoned(ref.shape, dtype)
    policy = dict(matmul=kernel_name)
    if kernel_name == "triton_splitk":  # a long-K problem, which is what split-K is for
        a, b = make(rng, (size(64, 5), size(16384, 300)), dtype), make(rng, (size(16384, 300), size(96, 7)), dtype)
        ref, out = _matmul_reference(a, b), poisoned((a.shape[0], b.shape[1]), dtype)
    with strict(**policy):
        xrt.ops.matmul(a, b, out=out)
    assert_close(out, ref, dtype, tol=2e-5 if dtype == "float32" else None)


@kernel_test
def test_matmul_split_k_partials_add_up(rng) -> None:
    """The atomic split-K path directly (the interpreter never tunes, so it never picks a split)."""
    from xpuruntime.backends.triton import matmul as tm

    a, b = make(rng, (1, 37, size(4099, 200)), "float32"), make(rng, (1, size(4099, 200), 29), "float32")
    c = poisoned((1, 37, 29), "float32")
    params = {"precision": "ieee", "fp32": True}
    at, bt, ct = (tm.as_torch(t) for t in (a, b, c))
    tm._run(params, at, bt, ct, (16, 16, 16, 4, 1, 4) if INTERPRET else (32, 32, 32, 4, 3, 4))
    assert_close(c, _matmul_reference(a[0], b[0])[None], "float32", tol=2e-5)


@pytest.mark.gpu
@kernel_test
def test_matmul_tf32_only_under_math_mode_tf32(rng) -> None:
    a, b = make(rng, (1024, 4096), "float32"), make(rng, (4096, 512), "float32")
    ref = _matmul_reference(a, b)
    with strict(matmul="triton"):
        assert_close(xrt.ops.matmul(a, b), ref, "float32", tol=2e-5)
    with xrt.kernel_policy(matmul="triton", strict=True, math_mode="tf32"):
        out = xrt.ops.matmul(a, b)
    assert_close(out, ref, "float32", tol=5e-3)
    assert not np.allclose(f64(out), ref, rtol=0, atol=1e-5 * np.abs(ref).max())  # tf32 really ran


GEMV_CASES = [  # a shape, b shape, column-major b
    (size((16384, 8192), (20, 600)), size((8192,), (600,)), False),  # N == 1, split reduction
    (size((8192,), (33,)), size((8192, 16384), (33, 18)), False),  # M == 1
    (size((1, 4096), (1, 50)), size((4096, 4099), (50, 30)), True),  # M == 1, column-major b
    ((30, 50), (50, 1), False),
    ((40,), (40,), False),
    ((0, 7), (7,), False),
]


@kernel_test
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(GEMV_CASES)))
def test_gemv(rng, case: int, dtype: str) -> None:
    sa, sb, col_major = GEMV_CASES[case]
    a, b = make(rng, sa, dtype), _operand(rng, sb, dtype, col_major)
    ref = _matmul_reference(a, b)
    out = poisoned(ref.shape, dtype)
    with strict(matmul="triton_gemv" if ref.ndim == 0 or len(sb) == 1 or sb[-1] == 1 else "triton_gemv_t"):
        xrt.ops.matmul(a, b, out=out)
    assert_close(out, ref, dtype, tol=2e-5 if dtype == "float32" else None)


# -- everything at once: the policy names every Triton kernel ---------------------------------------


@kernel_test
def test_policy_naming_all_triton_kernels_runs_each_of_them(rng) -> None:
    x = make(rng, (9, 16), "float32")
    xrt.enable_dispatch_logging()
    with strict(**POLICY_ALL, matmul="triton"):
        xrt.ops.sin_affine(x, 2.0, 1.0)
        xrt.ops.sum(x)
        xrt.ops.softmax(x)
        xrt.ops.layer_norm(x, 16)
        xrt.ops.rms_norm(x, 16)
        xrt.ops.layer_norm_backward(x, x, 16)
        xrt.ops.rms_norm_backward(x, x, 16)
        xrt.ops.matmul(x, x.T)
    logs = xrt.get_dispatch_logs()
    assert {(r.op_name, r.selected_kernel) for r in logs} == {(op, "triton") for op in [*POLICY_ALL, "matmul"]}
    assert all(r.backend == "triton" for r in logs)


# -- fused elementwise: generated kernels -----------------------------------------------------------

UNARY_OPS = ["neg", "abs", "exp", "log", "sqrt", "rsqrt", "reciprocal", "tanh", "erf", "sigmoid", "relu", "gelu",
             "gelu_tanh", "sin", "cos", "copy"]  # fmt: skip
BINARY_OPS = ["add", "sub", "mul", "div", "pow", "max", "min"]


def _fused(program: tuple, *inputs, dtype: str = "float32", out=None):
    from xpuruntime.ops.fused_elementwise import fused_elementwise

    with strict(fused_elementwise="triton"):
        return fused_elementwise(program, *inputs, dtype=dtype, out=out)


@kernel_test
@pytest.mark.parametrize("name", UNARY_OPS + BINARY_OPS)
def test_fused_elementwise_each_op_with_broadcasting(rng, name: str) -> None:
    from xpuruntime.ops.fused_elementwise import reference

    x = make(rng, size((2049, 4097), (7, 13)), "float32")
    b = make(rng, (x.shape[1],), "float32")
    if name in ("log", "sqrt", "rsqrt", "pow"):  # positive arguments: |x| + 0.5
        program = (
            ("abs", ("in", 0)),
            ("add", ("t", 0), ("c", 0.5)),
            (name, ("t", 1), *([("in", 1)] if name == "pow" else [])),
        )
    elif name in BINARY_OPS:
        program = ((name, ("in", 0), ("in", 1)), ("mul", ("t", 0), ("c", 0.75)))
    else:
        program = (("add", ("in", 0), ("in", 1)), (name, ("t", 0)))
    ref = reference(f64(x), f64(b), program=program)
    out = poisoned(ref.shape, "float32")
    _fused(program, x, b, out=out)
    assert_close(out, ref, "float32", tol=1e-5 if name != "gelu_tanh" or ON_GPU else 2e-5)


@kernel_test
@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_elementwise_chain_mixed_inputs_strided_out(rng, dtype: str) -> None:
    """gelu(x * w + b) - relu(mask * 2): float, int and bool inputs, a strided x, a strided out."""
    from xpuruntime.ops.fused_elementwise import reference

    x = make(rng, (6, 20, 9), "float32", view=lambda t: t[:, ::2, 1:])
    w = make(rng, (10, 1), "float32")
    b = make(rng, (8,), dtype)
    mask_np = rng.random((6, 1, 8)) > 0.5
    mask = torch.tensor(mask_np, device="cuda") if ON_GPU else mask_np
    program = (("mul", ("in", 0), ("in", 1)), ("add", ("t", 0), ("in", 2)), ("gelu", ("t", 1)),
               ("mul", ("in", 3), ("c", 2.0)), ("relu", ("t", 3)), ("sub", ("t", 2), ("t", 4)))  # fmt: skip
    ref = reference(f64(x), f64(w), f64(b), mask_np.astype(np.float64), program=program)
    out = poisoned((6, 10, 16), dtype)[:, :, ::2]
    _fused(program, x, w, b, mask, dtype=dtype, out=out)
    assert_close(out, ref, dtype)


@kernel_test
def test_fused_elementwise_special_values_and_empty(rng) -> None:
    from xpuruntime.ops.fused_elementwise import reference

    xs = np.array([-2.0, -2.0, -0.5, 0.0, 0.0, 3.0, np.nan, -1.0], np.float32)
    ys = np.array([3.0, 2.0, 0.5, 0.0, 2.0, -1.0, 1.0, np.nan], np.float32)
    as_device = (lambda a: torch.tensor(a, device="cuda")) if ON_GPU else (lambda a: a)
    for program in ((("pow", ("in", 0), ("in", 1)),), (("max", ("in", 0), ("in", 1)),),
                    (("min", ("in", 0), ("c", float("inf"))), ("relu", ("t", 0)))):  # fmt: skip
        n_in = 2 if any(r == ("in", 1) for instr in program for r in instr[1:]) else 1
        ins = [as_device(xs), as_device(ys)][:n_in]
        ref = reference(xs, *([ys] if n_in == 2 else []), program=program)
        assert_close(_fused(program, *ins), ref, "float32")
    empty = make(rng, (0, 4), "float32")
    assert tuple(_fused((("exp", ("in", 0)),), empty).shape) == (0, 4)


@kernel_test
def test_fused_elementwise_generates_one_kernel_per_program() -> None:
    from xpuruntime.backends.triton.elementwise import fused_kernel, kernel_source

    program = (("mul", ("in", 0), ("c", 3.0)), ("sin", ("t", 0)))
    assert fused_kernel(program, 1) is fused_kernel(program, 1)
    assert fused_kernel(program, 1) is not fused_kernel(program, 2)
    source = kernel_source(program, 1)
    assert source.count("tl.store") == 2 and "t1 = " in source and "t2 = " not in source


# -- property tests (interpreter: tiny random shapes, many of them) ---------------------------------

if INTERPRET:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    _SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    _SHAPES = st.lists(st.integers(0, 6), min_size=1, max_size=4).map(tuple)

    @_SETTINGS
    @given(shape=_SHAPES, data=st.data())
    def test_sum_matches_reference_for_any_axes(shape: tuple[int, ...], data: st.DataObject) -> None:
        ndim = len(shape)
        axes = data.draw(st.none() | st.lists(st.integers(0, ndim - 1), unique=True, max_size=ndim).map(tuple))
        keepdims = data.draw(st.booleans())
        x = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1))).standard_normal(shape).astype(np.float32)
        if data.draw(st.booleans()) and ndim >= 2:
            x = np.swapaxes(x, 0, -1)  # a strided view
        ref = sum_reference(x, axes, keepdims)
        out = poisoned(ref.shape, "float32")
        with strict(sum="triton"):
            xrt.ops.sum(x, axes, keepdims, out=out)
        # a sum's rounding error scales with sum(|x|), not with |sum(x)| (which cancellation makes small):
        # relative to max |ref| a well-rounded sum of 90 values that cancel to 0.5 failed at 2.8e-5
        assert f64(out).shape == ref.shape
        err = np.abs(f64(out) - ref) / np.maximum(sum_reference(np.abs(x), axes, keepdims), 1e-30)
        assert float(err.max(initial=0.0)) <= 2e-5, f"error {err.max():.3e} of sum(|x|) > 2e-5"

    _OPS = st.sampled_from(["add", "mul", "sub", "max", "sin", "tanh", "sigmoid", "relu", "abs"])

    @_SETTINGS
    @given(shape=_SHAPES, data=st.data())
    def test_fused_elementwise_random_programs_with_broadcasting(shape: tuple[int, ...], data: st.DataObject) -> None:
        from xpuruntime.ops.fused_elementwise import BINARY, fused_elementwise, reference

        other = tuple(d if data.draw(st.booleans()) else 1 for d in shape)[data.draw(st.integers(0, len(shape))) :]
        rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
        inputs = [rng.standard_normal(shape).astype(np.float32), rng.standard_normal(other).astype(np.float32)]
        program = []
        for index in range(data.draw(st.integers(1, 4))):
            name = data.draw(_OPS)
            refs = [("in", 0), ("in", 1), ("c", 0.5)] + [("t", j) for j in range(index)]
            args = [data.draw(st.sampled_from(refs)) for _ in range(2 if name in BINARY else 1)]
            program.append((name, *args))
        program = tuple(program)
        ref = reference(*inputs, program=program)
        out = poisoned(ref.shape, "float32")
        with strict(fused_elementwise="triton"):
            fused_elementwise(program, *inputs, out=out)
        assert_close(out, ref, "float32")


HUGE = 2**30 + 16  # a stride that fits in 32 bits; twice it does not


def huge_view(shape: tuple[int, ...], strides: tuple[int, ...], dtype: str, values: np.ndarray | None) -> object:
    """A (tiny) view with huge strides (in elements) over a buffer reaching past 2**31 elements, set to
    `values` (NaN when None)."""
    reach = sum((n - 1) * s for n, s in zip(shape, strides)) + 1
    fill = np.full(shape, np.nan) if values is None else values
    try:
        if ON_GPU:
            view = torch.empty(reach, dtype=TORCH_DTYPES[dtype], device="cuda").as_strided(shape, strides)
            view.copy_(torch.as_tensor(fill, dtype=TORCH_DTYPES[dtype]))
            return view
        buffer = np.empty(reach, np.dtype(dtype))
    except (MemoryError, RuntimeError):
        pytest.skip(f"cannot reserve {reach} elements of address space")
    itemsize = np.dtype(dtype).itemsize
    view = np.lib.stride_tricks.as_strided(buffer, shape, tuple(s * itemsize for s in strides))
    view[...] = fill
    return view


def random(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.standard_normal(shape) + 0.5


@kernel_test
@pytest.mark.parametrize("where", ["x", "out"])
def test_softmax_one_pass_offsets_past_2_31(rng, where: str) -> None:
    """Softmax along an axis with a huge stride: one-pass rows indexed r * stride in 32 bits wrapped."""
    data = random(rng, (3, 5))
    ref = softmax_reference(data, 0)
    x = huge_view((3, 5), (HUGE, 1), "float16", data) if where == "x" else make(rng, (3, 5), "float16")
    if where == "out":
        x[...] = torch.as_tensor(data) if ON_GPU else data
    out = huge_view((3, 5), (HUGE, 1), "float16", None) if where == "out" else poisoned((3, 5), "float16")
    with strict(softmax="triton"):
        xrt.ops.softmax(x, 0, out=out)
    assert_close(out, ref, "float16")


@kernel_test
@pytest.mark.parametrize("where", ["a", "b", "out"])
def test_matmul_offsets_past_2_31(rng, where: str) -> None:
    """a with a huge row stride, b with a huge column stride, out with a huge column stride."""
    a_data, b_data = random(rng, (3, 16)), random(rng, (16, 3))
    a = huge_view((3, 16), (HUGE, 1), "float16", a_data) if where == "a" else make(rng, (3, 16), "float16")
    b = huge_view((16, 3), (1, HUGE), "float16", b_data) if where == "b" else make(rng, (16, 3), "float16")
    if where != "a":
        a[...] = torch.as_tensor(a_data) if ON_GPU else a_data
    if where != "b":
        b[...] = torch.as_tensor(b_data) if ON_GPU else b_data
    out = huge_view((3, 3), (1, HUGE), "float16", None) if where == "out" else poisoned((3, 3), "float16")
    with strict(matmul="triton"):
        xrt.ops.matmul(a, b, out=out)
    assert_close(out, matmul_reference(f64(a), f64(b)), "float16")


@kernel_test
@pytest.mark.parametrize(
    ("kernel_name", "where"), [("triton_gemv", "v"), ("triton_gemv_t", "v"), ("triton_gemv", "out")]
)
def test_gemv_offsets_past_2_31(rng, kernel_name: str, where: str) -> None:
    """The vector (a column of a wide matrix) or the output with a huge stride."""
    w = make(rng, (3, 5), "float16", shift=0.5)
    v = huge_view((5,), (HUGE,), "float16", random(rng, (5,))) if where == "v" else make(rng, (5,), "float16")
    args = (w, v) if kernel_name == "triton_gemv" else (v, w.T)
    ref = matmul_reference(*(f64(t) for t in args))
    out = huge_view((3,), (HUGE,), "float16", None) if where == "out" else poisoned((3,), "float16")
    with strict(matmul=kernel_name):
        xrt.ops.matmul(*args, out=out)
    assert_close(out, ref, "float16")


@kernel_test
def test_sum_output_offsets_past_2_31(rng) -> None:
    x = make(rng, (3, 4), "float32", shift=0.5)
    out = huge_view((4,), (HUGE,), "float32", None)
    with strict(sum="triton"):
        xrt.ops.sum(x, 0, False, out=out)
    assert_close(out, sum_reference(f64(x), 0, False), "float32")


@kernel_test
def test_norm_offsets_past_2_31(rng) -> None:
    """Rows whose normalized dim has a huge stride (a transposed view): cols * stride wrapped."""
    data, dy = random(rng, (2, 3)), make(rng, (2, 3), "float32")
    x = huge_view((2, 3), (1, HUGE), "float32", data)
    w, b = make(rng, (3,), "float32"), make(rng, (3,), "float32")
    out = poisoned((2, 3), "float32")
    packed = poisoned((3, 3), "float32")
    with strict(layer_norm="triton", rms_norm_backward="triton"):
        xrt.ops.layer_norm(x, (3,), w, b, out=out)
        xrt.ops.rms_norm_backward(dy, x, (3,), w, 1e-6, out=packed)
    assert_close(out, layer_norm_reference(data, (3,), f64(w), f64(b)), "float32")
    assert_close(packed, rms_norm_backward_reference(f64(dy), data, (3,), f64(w), 1e-6), "float32")


@kernel_test
@pytest.mark.parametrize("op", ["layer_norm_backward", "rms_norm_backward"])
def test_norm_backward_into_a_column_of_a_wider_buffer(rng, op: str) -> None:
    """normalized_shape (1,): the packed (M + k, 1) output as a column of a wider array. dweight/dbias went
    to the column stride instead of the row stride (outside the view; dbias left unwritten)."""
    m = 5
    x, dy, w = make(rng, (m, 1), "float32", shift=0.5), make(rng, (m, 1), "float32"), make(rng, (1,), "float32")
    reference = layer_norm_backward_reference if op == "layer_norm_backward" else rms_norm_backward_reference
    ref = reference(f64(dy), f64(x), (1,), f64(w), 1e-5)
    wide = poisoned((ref.shape[0], 7), "float32")
    with strict(**{op: "triton"}):
        getattr(xrt.ops, op)(dy, x, (1,), w, 1e-5, out=wide[:, 3:4])
    assert_close(wide[:, 3:4], ref, "float32", tol=1e-4)  # dx is 0 up to x - mean's rounding times rstd ~ 316
    others = f64(wide)[:, [0, 1, 2, 4, 5, 6]]
    assert np.isnan(others).all(), "wrote outside the out= view"


@kernel_test
def test_triton_fused_programs_differing_in_a_zero_constants_sign(rng) -> None:
    """-0.0 == 0.0 as dict keys: x / -0.0 after x / 0.0 reused the first program's kernel (+inf, not -inf)."""
    x = make(rng, (6,), "float32", shift=3.0)
    for zero in (0.0, -0.0):
        with strict(fused_elementwise="triton"):
            got = xrt.ops.fused_elementwise((("div", ("in", 0), ("c", zero)),), x)
        with np.errstate(divide="ignore"):
            np.testing.assert_array_equal(f64(got), (f64(x) / zero).astype(np.float32))
