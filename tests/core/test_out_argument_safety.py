"""`out=` cannot give silently wrong results (issue 26, items 4 and 7):
- an `out` whose elements overlap each other (a zero or overlapping stride) is refused, like an `out` that
  overlaps an input, by every op (checked once per plan: strides are in the plan key);
- `out=` into a PyTorch tensor behaves as PyTorch's out= functions and in-place ops do: the tensor's version
  counter is bumped (a backward that saved its old values raises instead of computing wrong gradients), and
  while grad mode is on a tensor that requires grad is refused (autograd cannot record the write)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import xpuruntime as xrt
from xpuruntime.arrays import overlaps_itself
from xpuruntime.dispatch import Dispatcher
from xpuruntime.errors import ArgumentError, LayoutError
from xpuruntime.registry import Backend, Registry, kernel
from xpuruntime.schema import OpSchema

torch = pytest.importorskip("torch")


def self_overlapping(shape: tuple[int, ...], dtype=np.float64) -> np.ndarray:
    """A writable view of `shape` whose rows all share the memory of one row (stride 0 on axis 0)."""
    row = np.zeros(shape[1:], dtype)
    return np.lib.stride_tricks.as_strided(row, shape=shape, strides=(0, *row.strides))


CALLS = {  # the issue's three ops, and one of each other kind
    "matmul": lambda out: xrt.ops.matmul(np.ones((4, 3)), np.ones((3, 4)), out=out),
    "softmax": lambda out: xrt.ops.softmax(np.random.rand(4, 4), out=out),
    "sin_affine": lambda out: xrt.ops.sin_affine(np.random.rand(4, 4), 2.0, 1.0, out=out),
    "layer_norm": lambda out: xrt.ops.layer_norm(np.random.rand(4, 4), 4, out=out),
    "linear": lambda out: xrt.ops.linear(np.random.rand(4, 3), np.random.rand(4, 3), out=out),
}


@pytest.mark.parametrize("op", sorted(CALLS))
def test_an_out_overlapping_itself_is_refused(op):
    out = self_overlapping((4, 4))
    with pytest.raises(LayoutError, match=rf"{op}: argument 'out' expected an array whose elements do not overlap"):
        CALLS[op](out)


def test_an_unusually_strided_out_that_does_not_overlap_is_accepted_and_right():
    buffer = np.full(64, np.nan)
    out = np.lib.stride_tricks.as_strided(buffer, shape=(3, 2), strides=(2 * 8, 3 * 8))  # offsets 0,3,2,5,4,7
    x = np.random.rand(3, 2)
    assert xrt.ops.sin_affine(x, 2.0, 1.0, out=out) is out
    np.testing.assert_allclose(out, np.sin(2.0 * x + 1.0), rtol=1e-12)


def test_a_self_overlapping_cpu_tensor_out_is_refused():
    out = torch.zeros(4).expand(4, 4)
    with pytest.raises(LayoutError, match="do not overlap"):
        xrt.ops.softmax(torch.rand(4, 4), out=out)


def _brute_force(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    offsets = [sum(i * s for i, s in zip(index, strides)) for index in itertools.product(*map(range, shape))]
    return len(set(offsets)) < len(offsets)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(-7, 7)), min_size=0, max_size=4))
def test_overlaps_itself_agrees_with_enumerating_every_offset(dims):
    shape, strides = tuple(n for n, _ in dims), tuple(s for _, s in dims)
    assert overlaps_itself(shape, strides) == _brute_force(shape, strides), (shape, strides)


# -- out= into PyTorch tensors -------------------------------------------------------------------------------


def test_writing_into_a_tensor_autograd_saved_makes_backward_raise():
    """Before: the version counter stayed, and backward used the overwritten values (max error 4.58)."""
    x = torch.randn(4, 4, requires_grad=True)
    w = torch.randn(4, 4)
    loss = (x @ w).sum()  # saves w for x's gradient
    before = w._version
    xrt.ops.sin_affine(torch.randn(4, 4), 3.0, 0.0, out=w)
    assert w._version > before
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_every_tensor_write_bumps_the_version():
    out = torch.empty(4, 4)
    versions = [out._version]
    for call in (
        lambda: xrt.ops.softmax(torch.rand(4, 4), out=out),
        lambda: xrt.ops.matmul(torch.rand(4, 3), torch.rand(3, 4), out=out),
        lambda: xrt.ops.sin_affine(np.random.rand(4, 4).astype(np.float32), 1.0, 0.0, out=out),  # via the slow path
    ):
        call()
        versions.append(out._version)
    assert versions == sorted(set(versions)), versions
    view = out[1:]  # a view shares its base's version counter, as in PyTorch
    xrt.ops.softmax(torch.rand(3, 4), out=view)
    assert out._version > versions[-1]


@pytest.mark.parametrize("leaf", [True, False])
def test_a_tensor_that_requires_grad_is_refused_as_out_while_grad_mode_is_on(leaf):
    out = torch.zeros(4, 4, requires_grad=True)
    if not leaf:
        out = out * 2
    with pytest.raises(ArgumentError, match=r"softmax: argument 'out' requires grad.*torch\.no_grad"):
        xrt.ops.softmax(torch.rand(4, 4), out=out)
    with torch.no_grad():
        before = out._version
        xrt.ops.softmax(torch.rand(4, 4), out=out)
    assert out._version > before and torch.allclose(out.detach().sum(dim=-1), torch.ones(4))


def test_an_input_that_requires_grad_is_refused_with_out_as_pytorch_does():
    x = torch.rand(4, 4, requires_grad=True)
    with pytest.raises(RuntimeError, match="don't support automatic differentiation"):
        torch.sin(x, out=torch.empty(4, 4))  # PyTorch's own rule
    with pytest.raises(ArgumentError, match="softmax: argument 'x' requires grad"):
        xrt.ops.softmax(x, out=torch.empty(4, 4))
    assert xrt.ops.softmax(x.detach(), out=torch.empty(4, 4)).shape == (4, 4)


def test_an_inference_tensor_is_written_only_in_inference_mode():
    with torch.inference_mode():
        out = torch.empty(4, 4)
        xrt.ops.softmax(torch.rand(4, 4), out=out)  # fine inside
    with pytest.raises(ArgumentError, match="inference tensor"):
        xrt.ops.softmax(torch.rand(4, 4), out=out)


def test_numpy_out_and_calls_without_out_are_unchanged():
    x = torch.rand(4, 4, requires_grad=True)
    assert xrt.ops.softmax(x.detach()).shape == (4, 4)
    out = np.empty((4, 4), np.float32)
    assert xrt.ops.softmax(np.random.rand(4, 4).astype(np.float32), out=out) is out


@pytest.mark.gpu
def test_cuda_tensor_out_bumps_the_version_and_refuses_requires_grad():
    w = torch.randn(64, 64, device="cuda")
    x = torch.randn(64, 64, device="cuda", requires_grad=True)
    loss = (x @ w).sum()
    xrt.ops.softmax(torch.randn(64, 64, device="cuda"), out=w)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    with pytest.raises(ArgumentError, match="requires grad"):
        xrt.ops.matmul(torch.randn(8, 8, device="cuda"), torch.randn(8, 8, device="cuda"),
                       out=torch.zeros(8, 8, device="cuda", requires_grad=True))  # fmt: skip
    with pytest.raises(LayoutError, match="do not overlap"):
        xrt.ops.sin_affine(torch.randn(8, 8, device="cuda"), 1.0, 0.0, out=torch.zeros(8, device="cuda").expand(8, 8))


# -- buffers the kernels write besides `out` (schema.buffers: add_layer_norm's residual_out, ...) ---------------


def buffer_registry() -> Registry:
    """An op 'scaled' (out = 2x) whose kernel also writes x + 1 into the buffer 'buf'."""
    registry = Registry()
    registry.register_op(OpSchema(
        name="scaled", inputs=("x", "buf"), buffers=frozenset({"buf"}), infer_dtype=lambda ctx: ctx.tensor("x").dtype,
        infer_shape=lambda ctx: ctx.tensor("x").shape, reference=lambda x, buf: 2 * x,
    ))  # fmt: skip
    registry.register_backend(Backend("cpu", "cpu", empty=lambda shape, dtype, device, stream: np.empty(shape, dtype)))

    def launch(args):
        x, buf = args.inputs
        np.multiply(x, 2, out=args.out)
        np.add(x, 1, out=buf)

    registry.register_kernel(kernel("scaled", "numpy", backend="cpu")(launch))
    return registry


def test_a_buffer_overlapping_itself_is_refused():
    dispatcher = Dispatcher(buffer_registry())
    x = np.random.rand(4, 4)
    with pytest.raises(LayoutError, match="scaled: argument 'buf' expected an array whose elements do not overlap"):
        dispatcher.run("scaled", (x, self_overlapping((4, 4))))
    buf = np.empty((4, 4))
    np.testing.assert_array_equal(dispatcher.run("scaled", (x, buf)), 2 * x)
    np.testing.assert_array_equal(buf, x + 1)


def test_a_tensor_buffer_is_written_as_pytorch_writes_in_place():
    x, r = torch.rand(4, 4), torch.rand(4, 4)
    saved = torch.zeros(4, 4)
    w = torch.rand(4, 4, requires_grad=True)
    loss = (w * saved).sum()  # saves `saved` for w's gradient
    before = saved._version
    xrt.ops.add_layer_norm(x, r, residual_out=saved)
    assert saved._version > before
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    with pytest.raises(ArgumentError, match="add_layer_norm: argument 'residual_out' requires grad"):
        xrt.ops.add_layer_norm(x, r, residual_out=torch.zeros(4, 4, requires_grad=True))
