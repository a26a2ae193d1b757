"""PyTorch tensors through the dispatcher: CPU tensors as NumPy views (CI), CUDA tensors on the GPU."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import xpuruntime as xrt
from xpuruntime.abi import ArgPack
from xpuruntime.dispatch import Dispatcher
from xpuruntime.errors import DeviceMismatchError, DTypeError
from xpuruntime.registry import Backend, Registry, kernel
from xpuruntime.schema import OpSchema

torch = pytest.importorskip("torch")


def rel_err(got, ref) -> float:
    got = np.asarray(got, np.float64)
    ref = np.asarray(ref, np.float64)
    assert not np.isnan(got).any() or np.isnan(ref).any(), "NaN in the output"
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))


def strided(t):
    """A non-contiguous view of a tensor with an odd trailing size (every other column of a wider one)."""
    wide = torch.empty((*t.shape[:-1], 2 * t.shape[-1] + 1), dtype=t.dtype, device=t.device)
    view = wide[..., 1::2]
    view.copy_(t)
    assert not view.is_contiguous()
    return view


# -- CPU tensors: the CPU backend through NumPy views -------------------------------------------
OP_CALLS = [
    ("sin_affine", lambda x: xrt.ops.sin_affine(x, 1.7, -0.3), lambda x: np.sin(1.7 * x - 0.3)),
    ("sum", lambda x: xrt.ops.sum(x, -1), lambda x: x.sum(-1)),
    ("softmax", lambda x: xrt.ops.softmax(x, -1),
     lambda x: np.exp(x - x.max(-1, keepdims=True)) / np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)),
    ("matmul", lambda x: xrt.ops.matmul(x, x.transpose(-1, -2)), lambda x: x @ np.swapaxes(x, -1, -2)),
]  # fmt: skip


@pytest.mark.parametrize("name,call,reference", OP_CALLS, ids=[c[0] for c in OP_CALLS])
@pytest.mark.parametrize("contiguous", [True, False])
def test_cpu_tensors_run_on_the_cpu_backend_and_come_back_as_cpu_tensors(name, call, reference, contiguous):
    x = torch.randn(3, 7, 13, dtype=torch.float32)
    if not contiguous:
        x = strided(x)
    xrt.enable_dispatch_logging()
    y = call(x)
    assert isinstance(y, torch.Tensor) and y.device.type == "cpu" and y.dtype == torch.float32
    assert rel_err(y.numpy(), reference(x.numpy().astype(np.float64))) < 1e-5
    record = xrt.get_dispatch_logs()[-1]
    assert record.op_name == name and record.backend == "cpu"


def test_cpu_tensor_inputs_and_outputs_are_views_not_copies():
    seen = {}
    registry = Registry()
    registry.register_op(
        OpSchema(name="twice", inputs=("x",), infer_dtype=lambda ctx: ctx.tensor("x").dtype,
                 infer_shape=lambda ctx: ctx.tensor("x").shape, reference=lambda x: 2 * np.asarray(x, np.float64))
    )  # fmt: skip
    registry.register_backend(Backend("cpu", "cpu", empty=lambda shape, dtype, device, stream: np.empty(shape, dtype)))

    @kernel("twice", "np", backend="cpu")
    def twice(args: ArgPack) -> None:
        seen["in"] = args.inputs[0].__array_interface__["data"][0]
        seen["out"] = args.out.__array_interface__["data"][0]
        np.multiply(args.inputs[0], 2, out=args.out)

    registry.register_kernel(twice)
    dispatcher = Dispatcher(registry)
    x = strided(torch.randn(5, 9, dtype=torch.float64))
    y = dispatcher.run("twice", (x,))
    assert seen["in"] == x.data_ptr(), "the input was copied"
    assert isinstance(y, torch.Tensor) and y.data_ptr() == seen["out"], "the output was copied"
    torch.testing.assert_close(y, 2 * x)
    out = torch.full((5, 9), float("nan"), dtype=torch.float64)
    assert dispatcher.run("twice", (x,), out=out) is out
    assert seen["out"] == out.data_ptr() and not out.isnan().any()
    torch.testing.assert_close(out, 2 * x)


def test_cpu_tensor_out_poisoned_first_is_fully_written_and_returned():
    x = torch.randn(4, 11, dtype=torch.float32)
    out = torch.full((4, 11), float("nan"))
    assert xrt.ops.sin_affine(x, 0.5, 0.25, out=out) is out
    assert rel_err(out.numpy(), np.sin(0.5 * x.numpy().astype(np.float64) + 0.25)) < 1e-6


def test_cpu_tensors_mix_with_numpy_share_plans_and_drop_autograd():
    rng = np.random.default_rng()
    a = rng.standard_normal((6, 5)).astype(np.float32)
    b = torch.randn(5, 3, requires_grad=True)
    y = xrt.ops.matmul(a, b)  # NumPy and CPU tensors together: a CPU call, a CPU tensor back
    assert isinstance(y, torch.Tensor) and not y.requires_grad
    assert rel_err(y.numpy(), a.astype(np.float64) @ b.detach().numpy().astype(np.float64)) < 1e-5
    hits = xrt.plan_cache().stats().hits
    xrt.ops.matmul(a, b.detach().numpy().copy())  # same signature as NumPy: the same plan
    assert xrt.plan_cache().stats().hits == hits + 1


def test_empty_cpu_tensors():
    x = torch.randn(0, 7)
    y = xrt.ops.softmax(x, -1)
    assert isinstance(y, torch.Tensor) and tuple(y.shape) == (0, 7)
    s = xrt.ops.sum(torch.randn(3, 0), -1)
    assert torch.equal(s, torch.zeros(3))


def test_bfloat16_cpu_tensor_is_a_clear_dtype_error():
    with pytest.raises(DTypeError, match=r"sin_affine: argument 'x'.*bfloat16.*\.float\(\)"):
        xrt.ops.sin_affine(torch.randn(4, dtype=torch.bfloat16), 1.0, 0.0)


# -- CUDA tensors -------------------------------------------------------------------------------
def cuda_registry(conditions=()) -> tuple[Registry, dict]:
    """A registry with op 'scale2' (y = 2x) on a torch CUDA backend that records what each launch saw."""
    from xpuruntime.runtime import streams

    seen: dict = {"launches": 0}
    registry = Registry()
    registry.register_op(
        OpSchema(name="scale2", inputs=("x",), infer_dtype=lambda ctx: ctx.tensor("x").dtype,
                 infer_shape=lambda ctx: ctx.tensor("x").shape, reference=lambda x: 2 * np.asarray(x, np.float64))
    )  # fmt: skip
    dtypes = {"float16": torch.float16, "float32": torch.float32, "bfloat16": torch.bfloat16}
    registry.register_backend(
        Backend("cudatest", "cuda",
                empty=lambda shape, dtype, device, stream: torch.empty(shape, dtype=dtypes[dtype], device=device),
                current_stream=streams.current_stream, synchronize=streams.synchronize,
                record_event=streams.record_event)
    )  # fmt: skip

    @kernel("scale2", "torch_mul", backend="cudatest", conditions=conditions)
    def launch(args: ArgPack) -> None:
        seen["launches"] += 1
        seen["stream"] = args.stream
        torch.cuda._sleep(seen.get("sleep", 0))
        torch.mul(args.inputs[0], 2, out=args.out)

    registry.register_kernel(launch)
    return registry, seen


def aligned16(ctx):
    return None if ctx.tensor("x").ptr % 16 == 0 else f"x at 0x{ctx.tensor('x').ptr:x} is not 16-byte aligned"


@pytest.mark.gpu
def test_cuda_tensors_dispatch_on_the_callers_stream_and_return_cuda_tensors():
    registry, seen = cuda_registry()
    dispatcher = Dispatcher(registry)
    x = strided(torch.randn(33, 17, device="cuda", dtype=torch.float16))
    y = dispatcher.run("scale2", (x,))
    assert y.is_cuda and y.dtype == torch.float16 and y.shape == x.shape
    assert rel_err(y.cpu().float().numpy(), 2 * x.cpu().double().numpy()) < 1e-3
    assert seen["stream"] == torch.cuda.current_stream()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        y = dispatcher.run("scale2", (x,))
        assert seen["stream"] == side
    side.synchronize()
    assert dispatcher.plans.stats().hits == 1


@pytest.mark.gpu
def test_alignment_class_is_part_of_the_plan_key():
    registry, _ = cuda_registry(conditions=(aligned16,))
    dispatcher = Dispatcher(registry)
    base = torch.randn(1100, device="cuda", dtype=torch.float16)
    dispatcher.run("scale2", (base[8:1000],))  # 16-byte aligned
    with pytest.raises(xrt.XpuRuntimeError, match="not 16-byte aligned"):
        dispatcher.run("scale2", (base[1:993],))  # same shape, dtype and strides; 2-byte offset
    dispatcher.run("scale2", (base[16:1008],))
    assert dispatcher.plans.stats().hits == 1


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["sum", "softmax", "matmul", "layer_norm"])
def test_row_major_tensors_share_a_plan_whatever_their_size_one_strides(op):
    """The plan key says 'row-major' instead of the strides when PyTorch calls a tensor contiguous: a
    size-1 dim's stride never addresses memory, so such tensors share one plan and all compute right."""
    base = torch.randn(4096, device="cuda")
    plain = base[:96].view(1, 96).clone()
    odd = base.as_strided((1, 96), (7, 1), 2048)  # row-major by PyTorch's rule, stride 7 on the size-1 dim
    odd.copy_(plain)
    assert odd.is_contiguous() and odd.stride() != plain.stride()
    w, b = torch.randn(96, device="cuda"), torch.randn(96, 33, device="cuda")
    call = {
        "sum": lambda x: xrt.ops.sum(x, -1),
        "softmax": lambda x: xrt.ops.softmax(x, -1),
        "matmul": lambda x: xrt.ops.matmul(x, b),
        "layer_norm": lambda x: xrt.ops.layer_norm(x, 96, w, w),
    }[op]
    dispatcher = xrt.default_dispatcher()
    expected = call(plain)
    misses = dispatcher.plans.stats().misses
    got = call(odd)
    assert dispatcher.plans.stats().misses == misses, "a row-major tensor with another size-1 stride missed"
    torch.testing.assert_close(got, expected)


@pytest.mark.gpu
def test_mixing_devices_is_a_device_mismatch():
    x = torch.randn(8, 8, device="cuda")
    with pytest.raises(DeviceMismatchError, match=r"matmul: argument 'b' expected device cuda:0.*got cpu"):
        xrt.ops.matmul(x, np.ones((8, 8), np.float32))
    with pytest.raises(DeviceMismatchError, match="argument 'b'"):
        xrt.ops.matmul(x, torch.ones(8, 8))
    with pytest.raises(DeviceMismatchError, match="argument 'out'"):
        xrt.ops.matmul(x, x, out=torch.empty(8, 8))


@pytest.mark.gpu
def test_event_record_gives_an_event_and_full_sync_waits():
    registry, seen = cuda_registry()
    dispatcher = Dispatcher(registry)
    x = torch.randn(1 << 16, device="cuda")
    seen["sleep"] = 200_000_000  # the kernel's stream stays busy for a while
    with xrt.kernel_policy(sync="event_record"):
        y = dispatcher.run("scale2", (x,))
        event = xrt.last_event()
        assert event is not None and event.query() is False
        event.synchronize()
        assert event.query() is True
    with xrt.kernel_policy(sync="full_sync"):
        y = dispatcher.run("scale2", (x,))
        assert torch.cuda.current_stream().query(), "FULL_SYNC returned before the kernel finished"
    torch.testing.assert_close(y, 2 * x)


@pytest.mark.gpu
@pytest.mark.parametrize("op,kernel_name", [("sin_affine", "triton"), ("matmul", "torch"), ("layer_norm", "triton"),
                                            ("layer_norm_backward", "triton")])  # fmt: skip
def test_ambient_stream_kernels_run_on_the_callers_side_stream(op, kernel_name):
    """Triton and torch kernels get no stream in their ArgPack (they follow PyTorch's current stream):
    on a side stream kept busy, their work queues behind the sleep there, and the result is right."""
    registry = xrt.default_dispatcher().registry
    if kernel_name not in registry.kernels.get(op, {}):
        pytest.skip(f"no {op}/{kernel_name} kernel registered")
    x = torch.randn(64, 96, device="cuda")
    w, b = torch.randn(96, device="cuda"), torch.randn(96, device="cuda")
    args = {"sin_affine": (x, 1.3, 0.2), "matmul": (x, x.t()), "layer_norm": (x, 96, w, b),
            "layer_norm_backward": (torch.randn_like(x), x, 96, w)}[op]  # fmt: skip
    with xrt.kernel_policy(**{op: kernel_name}, strict=True):
        expected = getattr(xrt.ops, op)(*args)
        torch.cuda.synchronize()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(100_000_000)
            got = getattr(xrt.ops, op)(*args)
            done = torch.cuda.Event()
            done.record(side)
        assert done.query() is False, "the side stream finished its sleep already"
        assert torch.cuda.current_stream().query(), "work landed on the default stream"
        side.synchronize()
    torch.testing.assert_close(got, expected)


@pytest.mark.gpu
def test_registered_gpu_kernels_match_float64_references():
    """Every op with a CUDA kernel, called with CUDA tensors, against its float64 reference."""
    cases = {
        "sin_affine": lambda x: (x, 1.3, 0.2),
        "sum": lambda x: (x,),
        "softmax": lambda x: (x,),
        "matmul": lambda x: (x, x.transpose(-1, -2)),
    }
    ran = 0
    for op, args in cases.items():
        x = strided(torch.randn(5, 31, 67, device="cuda"))
        explanation = xrt.explain(op, *args(x), show=False)
        if explanation.decision is None or not explanation.decision.ctx.device.startswith("cuda"):
            continue
        xrt.enable_dispatch_logging()
        y = getattr(xrt.ops, op)(*args(x))
        assert y.is_cuda
        schema = xrt.default_dispatcher().registry.op(op)
        ref = schema.reference(*[a.cpu().double().numpy() if isinstance(a, torch.Tensor) else a for a in args(x)])
        tol = 5e-4 if op == "matmul" else 1e-5  # matmul may use TF32 on the GPU
        assert rel_err(y.cpu().double().numpy(), ref) < tol, op
        out = torch.full_like(y, float("nan"))  # poisoned: an unwritten element shows as NaN
        assert getattr(xrt.ops, op)(*args(x), out=out) is out
        assert rel_err(out.cpu().double().numpy(), ref) < tol, f"{op} with out="
        ran += 1
    if not ran:
        pytest.skip("no CUDA kernels registered yet")


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(0, 9), min_size=1, max_size=3),
    step=st.integers(1, 3),
    op=st.sampled_from(["sin_affine", "sum", "softmax"]),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.float16]),
)
def test_cpu_tensors_give_exactly_what_numpy_arrays_give(shape, step, op, dtype):
    base = torch.randn(*shape[:-1], shape[-1] * step + 1).to(dtype)
    x = base[..., 1::step]  # strided whenever step > 1, offset always
    call = {"sin_affine": lambda t: xrt.ops.sin_affine(t, 0.7, 0.1), "sum": lambda t: xrt.ops.sum(t, -1),
            "softmax": lambda t: xrt.ops.softmax(t, -1)}[op]  # fmt: skip
    got = call(x)
    want = call(x.numpy())
    assert isinstance(got, torch.Tensor) and got.dtype == dtype
    np.testing.assert_array_equal(got.numpy(), want)
