"""Every op's output (and every kernel's workspace) is sized before anything is allocated (issue 26, item 6):
a call whose output cannot fit in its device's memory raises OutOfMemoryError naming the op, the shape and
the bytes, at plan time (a plan-cache hit pays nothing), on the NumPy and the GPU paths alike, instead of a
raw MemoryError from deep inside a kernel or the out-of-memory killer.

The calls below have tiny broadcast (stride-0) inputs and huge outputs. They run in a child process whose
address space is limited to CHILD_MEMORY, which is then what the CPU "has": a regression makes the child fail
(its allocation cannot succeed there), never CI's machine run short."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
from guarded import assert_clean, run_guarded

import xpuruntime as xrt
from xpuruntime.errors import OutOfMemoryError
from xpuruntime.registry import Registry, kernel
from xpuruntime.runtime import capacity

CHILD_MEMORY = 1536 << 20
ROWS, COLS = 2**16, 2**15  # 2**31 float32 elements: 8 GiB, over 5x the child's memory


def huge_calls() -> dict[str, str]:
    """For every op, Python source of a call (in the child: `B(shape)` is a broadcast float32 view) whose
    output is 8 GiB or more. A new op adds its case here (test_every_op_has_a_huge_case says so)."""
    return {
        "sin_affine": f"xrt.ops.sin_affine(B(({ROWS}, {COLS})), 2.0, 1.0)",
        "sum": f"xrt.ops.sum(B(({ROWS * COLS}, 1)), axis=1)",
        "softmax": f"xrt.ops.softmax(B(({ROWS}, {COLS})))",
        "matmul": f"xrt.ops.matmul(B(({ROWS}, 1)), B((1, {COLS})))",
        "linear": f"xrt.ops.linear(B(({ROWS}, 1)), B(({COLS}, 1)))",
        "layer_norm": f"xrt.ops.layer_norm(B(({ROWS}, {COLS})), {COLS})",
        "rms_norm": f"xrt.ops.rms_norm(B(({ROWS}, {COLS})), {COLS})",
        "layer_norm_backward": f"xrt.ops.layer_norm_backward(B(({ROWS}, {COLS})), B(({ROWS}, {COLS})), {COLS})",
        "rms_norm_backward": f"xrt.ops.rms_norm_backward(B(({ROWS}, {COLS})), B(({ROWS}, {COLS})), {COLS})",
        "linear_grad_input": f"xrt.ops.linear_grad_input(B(({ROWS}, 1)), B((1, {COLS})))",
        "linear_grad_weight": f"xrt.ops.linear_grad_weight(B((1, {ROWS})), B((1, {COLS})))",
        "attention": f"xrt.ops.attention(B((1, {ROWS}, 1)), B((1, 1, 1)), B((1, 1, {COLS})))",
        "attention_forward": f"xrt.ops.attention_forward(B((1, {ROWS}, 1)), B((1, 1, 1)), B((1, 1, {COLS})))",
        "attention_backward": (  # dq and dk of 2**31 elements each, one score
            f"xrt.ops.attention_backward(B((1, 1, 1)), B((1, 1, {ROWS * COLS})), B((1, 1, {ROWS * COLS})), "
            f"B((1, 1, 1)), B((1, 1, 1)), B((1, 1)))"
        ),
        "fused_elementwise": f'xrt.ops.fused_elementwise((("sin", ("in", 0)),), B(({ROWS}, {COLS})))',
        "autocast_linear": f"xrt.ops.autocast_linear(B(({ROWS}, 1)), B(({COLS}, 1)), None, 'bfloat16')",
        "add_layer_norm": f"xrt.ops.add_layer_norm(B(({ROWS}, {COLS})), B(({ROWS}, {COLS})))",
        "add_rms_norm": f"xrt.ops.add_rms_norm(B(({ROWS}, {COLS})), B(({ROWS}, {COLS})))",
        "add_layer_norm_backward": f"xrt.ops.add_layer_norm_backward(*[B(({ROWS}, {COLS}))] * 3)",
        "add_rms_norm_backward": f"xrt.ops.add_rms_norm_backward(*[B(({ROWS}, {COLS}))] * 3)",
        "swiglu": f"xrt.ops.swiglu(B(({ROWS}, {COLS})), B(({ROWS}, {COLS})))",
        "geglu": f"xrt.ops.geglu(B(({ROWS}, {COLS})), B(({ROWS}, {COLS})))",
        "swiglu_backward": f"xrt.ops.swiglu_backward(*[B(({ROWS}, {COLS}))] * 3)",
        "geglu_backward": f"xrt.ops.geglu_backward(*[B(({ROWS}, {COLS}))] * 3)",
        "rotary_embedding": f"xrt.ops.rotary_embedding(*[B((1, 1, {ROWS}, {COLS}))] * 2, *[B((1, {ROWS}, {COLS}))] * 2)",
        "rotary_embedding_backward": (
            f"xrt.ops.rotary_embedding_backward(*[B((1, 1, {ROWS}, {COLS}))] * 2, *[B((1, {ROWS}, {COLS}))] * 2)"
        ),
        "linear_cross_entropy": (  # a loss per row
            f"xrt.ops.linear_cross_entropy(B(({ROWS * COLS}, 1)), B((4, 1)), "
            f"np.broadcast_to(np.int64(1), ({ROWS * COLS},)), reduction='none')"
        ),
        "linear_cross_entropy_backward": (
            f"xrt.ops.linear_cross_entropy_backward(np.float32(1), B(({ROWS}, {COLS})), B((4, {COLS})), "
            f"np.zeros({ROWS}, np.int64))"
        ),
    }


CHILD = textwrap.dedent(
    """
    import json, sys, numpy as np, xpuruntime as xrt
    from xpuruntime.errors import NoKernelError, OutOfMemoryError

    def B(shape):
        return np.broadcast_to(np.float32(0.5), shape)

    results = {}
    for op, call in json.loads(sys.argv[1]).items():
        try:
            eval(call)
            results[op] = "ran"
        except OutOfMemoryError as exc:
            results[op] = "OutOfMemoryError: " + str(exc)
        except NoKernelError as exc:  # an op with GPU kernels only (its GPU test sizes it)
            results[op] = "NoKernelError"
        except BaseException as exc:
            results[op] = type(exc).__name__ + ": " + str(exc)[:300]
    print(json.dumps(results))
    """
)


def test_every_op_has_a_huge_case():
    missing = sorted(set(xrt.default_registry().ops) - set(huge_calls()))
    assert not missing, f"add a call with a huge output for {missing} to huge_calls()"


def test_every_op_refuses_an_output_that_cannot_fit_before_allocating_it():
    done = run_guarded(CHILD, args=(json.dumps(huge_calls()),), memory=CHILD_MEMORY, timeout=120)
    assert_clean(done)
    results = json.loads(done.stdout.strip().splitlines()[-1])
    ops_with_cpu_kernels = {op for op in xrt.default_registry().ops if any(
        k.backend == "cpu" for k in xrt.default_registry().kernels_for(op))}  # fmt: skip
    for op, outcome in results.items():
        if op not in ops_with_cpu_kernels:
            assert outcome == "NoKernelError", (op, outcome)
            continue
        assert outcome.startswith("OutOfMemoryError"), (op, outcome)
        assert f"OutOfMemoryError: {op}: " in outcome and " of shape (" in outcome, outcome  # its output or a buffer
        assert "GiB" in outcome and "bytes), more than" in outcome, outcome


def test_the_message_names_op_shape_dtype_and_bytes(monkeypatch):
    monkeypatch.setattr(capacity, "capacity", lambda device: 1000)
    x = np.ones((20, 20), np.float32)
    with pytest.raises(OutOfMemoryError) as caught:
        xrt.ops.softmax(x)
    assert str(caught.value) == (
        "softmax: output of shape (20, 20) (float32) needs 1.6 KiB (1600 bytes), more than the 1000 B cpu has"
    )
    assert isinstance(caught.value, MemoryError)


def test_the_check_runs_once_per_plan_not_per_call(monkeypatch):
    calls = []
    real = capacity.capacity
    monkeypatch.setattr(capacity, "capacity", lambda device: calls.append(device) or real(device))
    dispatcher = xrt.Dispatcher()
    x = np.ones((7, 9), np.float32)
    for _ in range(5):
        dispatcher.run("softmax", (x,), (-1,))
    assert calls == ["cpu"]


def test_a_caller_out_is_not_sized_but_a_workspace_is(monkeypatch):
    monkeypatch.setattr(capacity, "capacity", lambda device: 1000)
    x = np.ones((20, 20), np.float32)
    out = np.empty_like(x)
    assert xrt.ops.softmax(x, out=out) is out  # nothing to allocate: no check
    registry = Registry()
    for schema in xrt.default_registry().ops.values():
        registry.register_op(schema)
    registry.register_backend(xrt.default_registry().backends["cpu"])
    registry.register_kernel(
        kernel("softmax", "greedy", backend="cpu", workspace_bytes=lambda ctx: 10**15)(lambda args: None)
    )
    with pytest.raises(
        OutOfMemoryError, match=r"softmax: workspace of kernel .greedy. needs 909.5 TiB \(1000000000000000 bytes\)"
    ):
        xrt.Dispatcher(registry).run("softmax", (np.ones(3, np.float32),), (-1,), out=np.empty(3, np.float32))


def test_a_kernel_whose_temporaries_do_not_fit_raises_out_of_memory_naming_it():
    registry = Registry()
    for schema in xrt.default_registry().ops.values():
        registry.register_op(schema)
    registry.register_backend(xrt.default_registry().backends["cpu"])

    def greedy(args):
        raise MemoryError("Unable to allocate 8.00 GiB for an array with shape (65536, 32768) and data type float32")

    registry.register_kernel(kernel("softmax", "greedy", backend="cpu")(greedy))
    with pytest.raises(OutOfMemoryError, match=r"softmax: kernel 'greedy' \[cpu\] ran out of memory .* 8.00 GiB"):
        xrt.Dispatcher(registry).run("softmax", (np.ones(3, np.float32),), (-1,))


def test_capacity_follows_the_process_limit():
    done = run_guarded(
        "from xpuruntime.runtime.capacity import capacity; print(capacity('cpu'))", memory=CHILD_MEMORY, timeout=60
    )
    assert_clean(done)
    assert int(done.stdout) == CHILD_MEMORY


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["sin_affine", "softmax", "matmul", "layer_norm", "attention", "autocast_linear"])
def test_gpu_outputs_are_sized_before_allocation(op):
    torch = pytest.importorskip("torch")
    rows = cols = 2**19  # 2**38 elements: 1 TiB in float32, 512 GiB in bf16

    def B(*shape, dtype=torch.float32):
        return torch.full((1,) * len(shape), 0.5, device="cuda", dtype=dtype).expand(*shape)

    calls = {
        "sin_affine": lambda: xrt.ops.sin_affine(B(rows, cols), 2.0, 1.0),
        "softmax": lambda: xrt.ops.softmax(B(rows, cols)),
        "matmul": lambda: xrt.ops.matmul(B(rows, 8), B(8, cols)),
        "layer_norm": lambda: xrt.ops.layer_norm(B(rows, cols), cols),
        # the output has q's shape (flash attention never holds the L x S scores): 4096 heads of 2**19 queries
        "attention": lambda: xrt.ops.attention(B(1, 4096, rows, 64, dtype=torch.float16),
                                               *(B(1, 4096, 16, 64, dtype=torch.float16) for _ in range(2))),
        "autocast_linear": lambda: xrt.ops.autocast_linear(B(rows, 64), B(cols, 64), None, "bfloat16"),
    }  # fmt: skip
    with pytest.raises(OutOfMemoryError, match=rf"{op}: output of shape .* more than the .* cuda:\d has"):
        calls[op]()
