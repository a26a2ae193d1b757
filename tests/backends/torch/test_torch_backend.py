"""The torch backend: PyTorch's kernels as registered candidates. Their launch functions are plain
PyTorch calls, so on a CPU-only machine they are tested directly on CPU tensors against the float64
references (outputs poisoned first); on a GPU through the dispatcher with a policy naming them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import xpuruntime as xrt
from xpuruntime.abi import ArgPack, LaunchConfig
from xpuruntime.context import build_context
from xpuruntime.policy import KernelPolicy
from xpuruntime.registry import default_registry

torch = pytest.importorskip("torch")

from xpuruntime.dispatch import run  # noqa: E402

OPS = ("matmul", "linear", "linear_grad_input", "linear_grad_weight", "layer_norm", "rms_norm", "softmax", "sum")


def launch_on_cpu(op: str, inputs: tuple, attrs: tuple) -> torch.Tensor:
    """Run the torch kernel's launch function on CPU tensors, with the op's own normalized attributes."""
    registry = default_registry()
    ctx = build_context(registry.op(op), inputs, attrs, None, KernelPolicy())
    ctx = dataclasses.replace(ctx, device="cuda:0")  # what the kernel would see on a GPU
    kernel = registry.kernel(op, "torch")
    dtype = getattr(torch, ctx.out_dtype)
    poison = float("nan") if dtype.is_floating_point else torch.iinfo(dtype).min
    out = torch.full(ctx.out_shape, poison, dtype=dtype)
    kernel.launch(ArgPack(inputs, out, dict(ctx.attrs), LaunchConfig(), None, None))
    return out


def reference(op: str, inputs: tuple, attrs: tuple) -> np.ndarray:
    schema = default_registry().op(op)
    arrays = {n: None if t is None else t.double().numpy() for n, t in zip(schema.inputs, inputs)}
    return np.asarray(schema.reference(**arrays, **dict(zip(schema.attrs, attrs))))


def rand(*shape: int, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64).to(dtype)


def test_backend_and_kernels_are_registered():
    registry = default_registry()
    backend = registry.backends["torch"]
    assert backend.device_type == "cuda"
    for op in OPS:
        assert registry.kernel(op, "torch").backend == "torch"
    if not torch.cuda.is_available():
        assert "no CUDA device" in backend.unavailable_reason


def test_explain_lists_torch_kernels_beside_ours():
    spec = xrt.TensorSpec((4096, 4096), "bfloat16", device="cuda:0")
    explanation = xrt.explain("matmul", spec, spec, show=False)
    names = {c.kernel.name for c in explanation.candidates}
    assert {"torch", "cublasLt"} <= names


CASES = [
    ("matmul", (rand(5, 7), rand(7, 3)), ()),
    ("matmul", (rand(2, 5, 7), rand(7)), ()),
    ("matmul", (rand(7), rand(2, 7, 3)), ()),
    ("matmul", (rand(7), rand(7)), ()),
    ("matmul", (rand(2, 1, 5, 7), rand(3, 7, 4)), ()),
    ("linear", (rand(2, 5, 7), rand(3, 7), rand(3)), ("gelu",)),
    ("linear", (rand(5, 7), rand(3, 7), rand(3)), ("relu",)),
    ("linear", (rand(5, 7), rand(3, 7), rand(3)), (None,)),
    ("linear", (rand(5, 7).t(), rand(3, 5), None), ("gelu",)),
    ("linear", (rand(0, 7), rand(3, 7), rand(3)), ("gelu",)),
    ("linear", (rand(4, 0), rand(3, 0), rand(3)), ("relu",)),
    ("linear_grad_input", (rand(2, 5, 3), rand(3, 7), rand(2, 5, 7)), ("gelu",)),
    ("linear_grad_input", (rand(5, 3), rand(3, 7), rand(5, 7)), ("relu",)),
    ("linear_grad_input", (rand(5, 3), rand(3, 7), None), (None,)),
    ("linear_grad_weight", (rand(2, 5, 3), rand(2, 5, 7)), (False,)),
    ("linear_grad_weight", (rand(2, 5, 3), rand(2, 5, 7)), (True,)),
    ("layer_norm", (rand(4, 9), rand(9), rand(9)), ((9,), 1e-5)),
    ("rms_norm", (rand(4, 3, 9), rand(3, 9)), ((3, 9), 1e-6)),
    ("softmax", (rand(4, 9),), (0,)),
    ("sum", (rand(4, 9, 2),), ((0, 2), True)),
    ("sum", (torch.arange(12, dtype=torch.int32).reshape(3, 4),), ((1,), False)),
]


@pytest.mark.parametrize(("op", "inputs", "attrs"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_torch_kernels_match_reference(op, inputs, attrs):
    got = launch_on_cpu(op, inputs, attrs)
    ref = reference(op, inputs, attrs)
    assert got.shape == ref.shape
    assert not torch.isnan(got.double()).any(), "an output element was left unwritten"
    if not got.dtype.is_floating_point:
        assert (got != torch.iinfo(got.dtype).min).all(), "an output element was left unwritten"
    np.testing.assert_allclose(got.double().numpy(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["matmul", "linear", "layer_norm", "rms_norm", "softmax", "sum"])
def test_torch_kernels_through_the_dispatcher_on_gpu(op):
    if default_registry().backends["torch"].unavailable_reason:
        pytest.skip(default_registry().backends["torch"].unavailable_reason)
    cases = {c[0]: c for c in CASES}
    _, inputs, attrs = cases[op]
    cuda_inputs = tuple(None if t is None else t.cuda() for t in inputs)
    with xrt.kernel_policy(strict=True, **{op: "torch"}):
        got = run(op, cuda_inputs, attrs)
    assert got.is_cuda
    np.testing.assert_allclose(got.double().cpu().numpy(), reference(op, inputs, attrs), rtol=1e-5, atol=1e-5)


def test_torch_linear_grad_input_with_a_vector_dy_writes_a_strided_out() -> None:
    """torch.matmul(vector, matrix, out=) resizes `out` (its strides too) instead of writing it."""
    registry = default_registry()
    dy, weight = torch.randn(3, dtype=torch.float64), torch.randn(3, 7, dtype=torch.float64)
    ctx = build_context(registry.op("linear_grad_input"), (dy, weight, None), (None,), None, KernelPolicy())
    ctx = dataclasses.replace(ctx, device="cuda:0")
    wide = torch.full((14,), float("nan"), dtype=torch.float64)
    out = wide[::2]
    registry.kernel("linear_grad_input", "torch").launch(
        ArgPack((dy, weight, None), out, dict(ctx.attrs), LaunchConfig())
    )
    np.testing.assert_allclose(wide[::2].numpy(), dy.numpy() @ weight.numpy(), rtol=1e-12)
    assert torch.isnan(wide[1::2]).all() and out.stride() == (2,)
