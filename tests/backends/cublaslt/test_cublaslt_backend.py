"""The cublaslt backend: probe, conditions and plan-cache keying on any machine; kernels on a GPU.

Without nvmath-python or a CUDA device the backend is registered but unavailable, with a reason that
`explain` shows; its conditions are plain functions of a DispatchContext and are tested here directly.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("torch")

import xpuruntime as xrt
from xpuruntime.abi import MathMode, TensorSpec
from xpuruntime.backends.cublaslt import BACKEND
from xpuruntime.backends.cublaslt import common as lt
from xpuruntime.context import DispatchContext
from xpuruntime.registry import Registry, _declared, _submodules


def _registry() -> Registry:
    """Only the ops and backends under test (independent of other modules' state)."""
    import importlib

    from xpuruntime.registry import KernelSpec
    from xpuruntime.schema import OpSchema

    registry = Registry()
    ops = [importlib.import_module(f"xpuruntime.ops.{m}") for m in ("matmul", "linear", "linear_backward")]
    for schema in _declared(ops, OpSchema):
        registry.register_op(schema)
    registry.register_backend(BACKEND)
    for spec in _declared(_submodules(importlib.import_module("xpuruntime.backends.cublaslt")), KernelSpec):
        registry.register_kernel(spec)
    return registry


REGISTRY = _registry()


def context(op: str, *specs: TensorSpec | None, math_mode: MathMode | None = None, **attrs) -> DispatchContext:
    """The op's normalized context for TensorSpecs on cuda:0 (shape checks included)."""
    schema = REGISTRY.op(op)
    values = {**schema.defaults, **attrs}
    ctx = DispatchContext(
        op=op, arg_names=schema.inputs, inputs=specs, attrs={a: values.get(a) for a in schema.attrs},
        attr_names=schema.attrs, device="cuda:0", compute_capability=(9, 0),
        math_mode=math_mode or MathMode.for_dtype(next(s for s in specs if s is not None).dtype),
    )  # fmt: skip
    return dataclasses.replace(ctx, attrs=schema.normalize_attrs(ctx))


def reasons(op: str, *specs, **attrs) -> list[str]:
    ctx = context(op, *specs, **attrs)
    return REGISTRY.kernel(op, "cublasLt").not_supported_reasons(ctx)


def spec(shape, dtype="bfloat16", strides=None, ptr=1 << 20) -> TensorSpec:
    return TensorSpec(shape, dtype, strides=strides, device="cuda:0", ptr=ptr)


def test_kernels_are_named_cublaslt_and_declared_fused():
    for op in ("matmul", "linear", "linear_grad_input", "linear_grad_weight"):
        kernel = REGISTRY.kernel(op, "cublasLt")
        assert kernel.backend == "cublaslt" and kernel.tensor_cores
        assert kernel.workspace_bytes(None) >= lt.WORKSPACE_LIMIT
    assert REGISTRY.kernel("linear", "cublasLt").fused
    assert BACKEND.device_type == "cuda"


def test_probe_names_what_is_missing():
    reason = BACKEND.unavailable_reason
    try:
        import nvmath  # noqa: F401
    except ImportError:
        assert reason is not None and "nvmath-python is not installed" in reason
        return
    import torch

    if not torch.cuda.is_available():
        assert reason is not None and "CUDA" in reason


def test_explain_shows_the_unavailable_backend_with_its_reason():
    if BACKEND.unavailable_reason is None:
        pytest.skip("the backend is available here")
    from xpuruntime.dispatch import Dispatcher

    explanation = Dispatcher(REGISTRY).explain("linear", spec((8192, 4096)), spec((4096, 4096)), spec((4096,)),
                                               activation="gelu")  # fmt: skip
    (candidate,) = [c for c in explanation.candidates if c.kernel.name == "cublasLt"]
    assert candidate.reasons and "unavailable" in candidate.reasons[0]


def test_large_aligned_problems_are_supported():
    assert reasons("linear", spec((8192, 4096)), spec((4096, 4096)), spec((4096,)), activation="gelu") == []
    assert reasons("linear", spec((4, 1024, 1024)), spec((1024, 1024)), None) == []
    assert reasons("matmul", spec((4096, 4096)), spec((4096, 4096))) == []
    assert reasons("matmul", spec((8, 1024, 1024)), spec((8, 1024, 1024))) == []
    assert reasons("matmul", spec((8, 1024, 1024)), spec((1024, 1024))) == []
    assert reasons("linear_grad_input", spec((8192, 4096)), spec((4096, 4096)), spec((8192, 4096)),
                   activation="gelu") == []  # fmt: skip
    assert reasons("linear_grad_weight", spec((8192, 4096)), spec((8192, 4096))) == []


def test_small_problems_are_left_to_cheaper_kernels():
    (reason,) = reasons("matmul", spec((64, 64)), spec((64, 64)))
    assert "too small" in reason and "host cost" in reason
    assert any("empty problem" in r for r in reasons("matmul", spec((0, 64)), spec((64, 64))))


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ((spec((4096, 4096), ptr=(1 << 20) + 8), spec((4096, 4096))), "'a' data pointer is not 16-byte aligned"),
        ((spec((4096, 4095), strides=(4095, 1)), spec((4095, 4096))), "'a' leading dimension 4095"),
        ((spec((4096, 4096), strides=(8192, 2)), spec((4096, 4096))), "no unit stride"),
        ((spec((4, 4096, 512)), spec((2, 4, 512, 512))), "broadcast"),
        ((spec((4096,)), spec((4096,))), "dot product"),
    ],
)
def test_matmul_conditions_give_reasons(args, words):
    assert any(words in r for r in reasons("matmul", *args)), reasons("matmul", *args)


def test_dtype_and_math_mode_conditions():
    kernel = REGISTRY.kernel("matmul", "cublasLt")
    ctx = context("matmul", spec((4096, 4096), "float64"), spec((4096, 4096), "float64"))
    assert any("dtype float64" in r for r in kernel.not_supported_reasons(ctx))
    ctx = context("matmul", spec((4096, 4096), "float32"), spec((4096, 4096), "float32"), math_mode=MathMode.BF16)
    assert any("math_mode bf16" in r for r in kernel.not_supported_reasons(ctx))
    assert lt.compute_type_name("float32", MathMode.TF32) == "COMPUTE_32F_FAST_TF32"
    assert lt.compute_type_name("float32", MathMode.FP32) == "COMPUTE_32F"
    assert lt.compute_type_name("bfloat16", MathMode.BF16) is None


def test_linear_conditions_give_reasons():
    big = (spec((8192, 4096)), spec((4096, 4096)))
    assert any("'bias' must be contiguous" in r for r in reasons("linear", *big, spec((4096,), strides=(2,))))
    assert any("'bias' data pointer" in r for r in reasons("linear", *big, spec((4096,), ptr=(1 << 20) + 2)))
    x = spec((8, 1024, 4096), strides=(2048 * 4096, 4096, 1))  # leading dims that do not fold
    assert any("do not fold" in r for r in reasons("linear", x, big[1], None))
    relu = reasons("linear_grad_input", big[0], big[1], spec((8192, 4096)), activation="relu")
    assert any("RELU_AUX" in r for r in relu)
    odd = reasons("linear_grad_input", spec((8192, 4096)), spec((4096, 4100)), spec((8192, 4100)), activation="gelu")
    assert any("K % 8" in r for r in odd)
    padded = spec((8192, 4096), strides=(4104, 1))
    assert any("dense" in r for r in reasons("linear_grad_input", *big, padded, activation="gelu"))
    odd_n = reasons("linear_grad_weight", spec((8192, 4095)), spec((8192, 4095)), bias=True)
    assert any("packs db after dW" in r for r in odd_n)
    assert reasons("linear_grad_weight", big[0], big[0], bias=True) == []


def test_layout_helpers():
    assert lt.pointer_alignment(4096) == 256 and lt.pointer_alignment(4096 + 16) == 16
    assert lt.pointer_alignment(4096 + 64) == 64
    assert lt.matrix_layout((3, 4), (4, 1)) == "row"
    assert lt.matrix_layout((3, 4), (1, 3)) == "col"
    assert lt.matrix_layout((3, 4), (8, 2)) is None
    assert lt.collapsed_rows(spec((2, 3, 8))) == ((6, 8), (8, 1))
    assert lt.collapsed_rows(spec((2, 3, 8), strides=(48, 16, 1))) == ((6, 8), (16, 1))
    assert lt.collapsed_rows(spec((2, 3, 8), strides=(64, 16, 1))) is None
    assert lt.collapsed_rows(spec((8,))) == ((1, 8), (8, 1))


class FakePlan:
    freed = 0

    def free(self) -> None:
        FakePlan.freed += 1


def test_plan_keys_separate_alignment_classes_and_signatures_not_pointers():
    from xpuruntime.abi import ArgPack

    ctx = context("matmul", spec((4096, 4096)), spec((4096, 4096)))
    config = REGISTRY.kernel("matmul", "cublasLt").launch_config(ctx)
    other = REGISTRY.kernel("matmul", "cublasLt").launch_config(ctx)  # another call signature's plan
    args, args2 = (ArgPack((), None, {}, c, None, None) for c in (config, other))
    base = 1 << 20
    assert lt.fast_key(args, base, base) == lt.fast_key(args, 3 << 20, 5 << 21)  # moved, same classes
    assert lt.fast_key(args, base, base) != lt.fast_key(args, base + 16, base)  # an offset view
    assert lt.fast_key(args, base, base) != lt.fast_key(args, base + 64, base)
    assert lt.fast_key(args, base, base) != lt.fast_key(args2, base, base)


def test_plan_cache_builds_once_per_key_and_frees_evicted_plans():
    cache = lt.PlanCache(capacity=2)
    built = []

    def build(name):
        def make():
            built.append(name)
            return FakePlan()

        return make

    first = cache.get("a", build("a"))
    assert cache.get("a", build("a")) is first and built == ["a"]
    cache.get("b", build("b"))
    cache.get("a", build("a"))  # "a" becomes the most recently used
    before = FakePlan.freed
    cache.get("c", build("c"))  # evicts "b"
    assert FakePlan.freed == before + 1 and len(cache) == 2
    assert cache.get("a", build("a")) is first
    cache.get("b", build("b"))
    assert built == ["a", "b", "c", "b"] and (cache.hits, cache.misses) == (3, 4)
    cache.clear()
    assert len(cache) == 0


def test_host_cost_threshold_is_consistent():
    """The size rule rejects a problem exactly when its roofline time is below the host cost."""
    assert lt.estimated_gpu_us("bfloat16", 4096, 4096, 4096, 3 * 4096 * 4096 * 2) > lt.MIN_GPU_US
    assert lt.estimated_gpu_us("bfloat16", 128, 128, 128, 3 * 128 * 128 * 2) < lt.MIN_GPU_US


def test_size_rule_counts_the_sms_a_small_output_leaves_idle():
    """A fp32 (128, 768) output fills 24 of 132 SMs: BERT's and GPT-2's B1 projections (12-25 µs on the GPU) are
    cuBLASLt's, while fp16 at the same shape (~1 µs) and a fp32 GEMV stay below the host cost; a large output
    is the plain roofline."""
    fp32 = lt.estimated_gpu_us("float32", 128, 768, 768, 4 * (128 * 768 * 2 + 768 * 768))
    assert fp32 > lt.MIN_GPU_US and fp32 == pytest.approx(2 * 128 * 768 * 768 / (50e6 * 24 / 132))
    assert lt.estimated_gpu_us("float16", 128, 768, 768, 2 * (128 * 768 * 2 + 768 * 768)) < lt.MIN_GPU_US
    assert lt.estimated_gpu_us("float32", 1, 768, 768, 4 * 768 * 770) < lt.MIN_GPU_US
    big = 2 * 4096 * 4096 * 4096 / (700 * 1e6)
    assert lt.estimated_gpu_us("float16", 4096, 4096, 4096, 3 * 4096 * 4096 * 2) == pytest.approx(big)


# -- on the GPU -------------------------------------------------------------------------------------------
def _gpu_ready() -> None:
    if BACKEND.unavailable_reason:
        pytest.skip(BACKEND.unavailable_reason)


@pytest.mark.gpu
@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_linear_on_gpu_matches_reference(activation, dtype):
    _gpu_ready()
    import torch

    from xpuruntime.ops.linear import linear, reference

    torch_dtype = getattr(torch, dtype)
    x = torch.randn(3, 700, 1024, device="cuda").to(torch_dtype)
    w = (torch.randn(1536, 1024, device="cuda") / 32).to(torch_dtype)
    b = torch.randn(1536, device="cuda").to(torch_dtype)
    with xrt.kernel_policy(linear="cublasLt", strict=True):
        y = linear(x, w, b, activation)
    ref = reference(*(t.double().cpu().numpy() for t in (x, w, b)), activation)
    err = np.linalg.norm(y.double().cpu().numpy() - ref) / np.linalg.norm(ref)
    assert err < {"bfloat16": 1e-2, "float16": 2e-3, "float32": 1e-5}[dtype]
    assert xrt.default_dispatcher().plan("linear", x, w, b, activation=activation).kernel.name == "cublasLt"


def _check_on_gpu(op: str, inputs: tuple, attrs: tuple, tol: float) -> None:
    """Run `op` under a strict cublasLt policy on CUDA tensors; compare with the float64 reference."""
    from xpuruntime.dispatch import run

    schema = xrt.default_registry().op(op)
    with xrt.kernel_policy(strict=True, **{op: "cublasLt"}):
        got = run(op, inputs, attrs)
    arrays = {n: None if t is None else t.double().cpu().numpy() for n, t in zip(schema.inputs, inputs)}
    ref = np.asarray(schema.reference(**arrays, **dict(zip(schema.attrs, attrs))))
    got = got.double().cpu().numpy()
    assert got.shape == ref.shape and np.isfinite(got).all()
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert err < tol, f"{op}: relative error {err:.2e}"


def _randn(*shape, dtype="bfloat16", scale=1.0):
    import torch

    return (torch.randn(*shape, device="cuda") * scale).to(getattr(torch, dtype))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "case",
    ["2d", "batched", "rows_times_matrix", "transposed_b", "offset_a", "fp32"],
)
def test_matmul_on_gpu_matches_reference(case):
    _gpu_ready()
    a, b = _randn(2048, 1024), _randn(1024, 2048, scale=1 / 32)
    if case == "batched":
        a, b = _randn(4, 1024, 1024), _randn(4, 1024, 1024, scale=1 / 32)
    elif case == "rows_times_matrix":
        a = _randn(4, 512, 1024)
    elif case == "transposed_b":
        b = _randn(2048, 1024, scale=1 / 32).t()
    elif case == "offset_a":
        a = _randn(2048, 1032)[:, 8:]  # 16-byte aligned, not 256: its own plan
    elif case == "fp32":
        a, b = _randn(1024, 1024, dtype="float32"), _randn(1024, 1024, dtype="float32", scale=1 / 32)
    _check_on_gpu("matmul", (a, b), (), 1e-5 if case == "fp32" else 1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("activation", [None, "gelu"])
def test_linear_grad_input_on_gpu_matches_reference(activation):
    _gpu_ready()
    dy, w, pre = _randn(3, 700, 1024), _randn(1024, 2048, scale=1 / 32), _randn(3, 700, 2048)
    _check_on_gpu("linear_grad_input", (dy, w, pre if activation else None), (activation,), 1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("bias", [False, True])
def test_linear_grad_weight_on_gpu_matches_reference(bias):
    _gpu_ready()
    dy, x = _randn(3, 700, 1024), _randn(3, 700, 2048)
    _check_on_gpu("linear_grad_weight", (dy, x), (bias,), 1e-2)


@pytest.mark.gpu
def test_plans_are_reused_across_calls_and_new_tensors():
    _gpu_ready()
    x, w, b = _randn(4096, 1024), _randn(1024, 1024, scale=1 / 32), _randn(1024)
    with xrt.kernel_policy(linear="cublasLt", strict=True):
        xrt.ops.linear(x, w, b, "gelu")
        misses = lt.PLANS.misses
        for _ in range(3):
            xrt.ops.linear(x.clone(), w, b, "gelu")  # new pointers, same alignment classes
    assert lt.PLANS.misses == misses
