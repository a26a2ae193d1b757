"""API fuzz test: every op in the registry (through the CPU backend's kernels), every front-end function,
the public policy/logging/profiling/registry functions and every CLI command, called with arbitrary
Python values and arrays of every NumPy dtype, byte order, odd shape and odd strides.

The contract: a call either returns what the float64 reference returns (within a tolerance for the
dtype) or raises an `XpuRuntimeError` subclass whose message names the op and an argument. No other
exception type, no kernel crash (`LaunchError` on a call the schema accepted), inputs never modified,
and the CLI never prints a traceback. New ops are fuzzed without editing this file: the op list is the
registry's. `XPURUNTIME_FUZZ_SCALE` scales the example counts (1 in CI).

The classes of issue 26 are drawn too: outputs whose elements overlap each other, devices with almost no
memory (every output must then be refused by size, naming the op, its shape and bytes), integers beyond the
float range as attributes, hand-made TensorSpecs, kernels declaring unknown dtypes, returns_output kernels
returning anything, tuning-cache files of any content and depth, TOML policy files in any suffix case.
Hazards that would hang or exhaust this process (FIFOs, /dev/zero) are driven in guarded child processes
instead (tests/core/test_checked_files.py, tests/cli/test_cli_fuzz.py).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import io
import math
import os
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xpuruntime as xrt
from xpuruntime import policy
from xpuruntime.abi import TensorSpec
from xpuruntime.arguments import normalize_call
from xpuruntime.cli import main
from xpuruntime.context import build_context
from xpuruntime.dispatch import Dispatcher
from xpuruntime.errors import LaunchError, NoKernelError, OutOfMemoryError, XpuRuntimeError
from xpuruntime.policy import KernelPolicy
from xpuruntime.registry import Registry, default_registry, kernel
from xpuruntime.runtime import capacity, tuning_cache

SCALE = float(os.environ.get("XPURUNTIME_FUZZ_SCALE", "1"))

# Ops whose contract differs from "a pure function of its inputs", by design; the error contract still holds.
# one output per op: the schema's buffers are input buffers the kernels fill
WRITTEN_INPUTS = {op: schema.buffers for op, schema in default_registry().ops.items() if schema.buffers}
NO_REFERENCE_CHECK = {  # the reference recomputes saved tensors that random inputs cannot be consistent with
    "attention_backward": "out and lse must come from attention_forward of the same q, k, v",
}
# Known gaps, reported to their owners: these still run (a fix turns them into passes).
FRONT_END_GAPS: dict[str, str] = {}
OP_EXAMPLES = 1500  # per op; with the front-end test's, CI runs about 1800 calls of each op
CPU_BACKEND = "cpu"


def fuzz_settings(n: int) -> settings:
    return settings(
        max_examples=max(1, round(n * SCALE)),
        deadline=None,
        database=None,  # CI replays nothing stale; a failure prints its reproducer
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )


# -- a registry of every op with only the CPU backend's kernels ----------------------------------------------
def cpu_registry() -> Registry:
    """Every op of the default registry, and only the CPU backend with its kernels (GPU backends' kernels
    may run only under a policy or on a device this machine lacks)."""
    source = default_registry()
    registry = Registry()
    for schema in source.ops.values():
        registry.register_op(schema)
    registry.register_backend(source.backends[CPU_BACKEND])
    for table in source.kernels.values():
        for spec in table.values():
            if spec.backend == CPU_BACKEND:
                registry.register_kernel(spec)
    return registry


REGISTRY = cpu_registry()
DISPATCHER = Dispatcher(REGISTRY)
OPS = sorted(op for op in REGISTRY.ops if REGISTRY.kernels_for(op))

# -- values ------------------------------------------------------------------------------------------------
NUMERIC = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
           "float32", "float64", "complex64", "complex128", "longdouble"]  # fmt: skip
OTHER = ["datetime64[s]", "timedelta64[ms]", "U3", "S2", "object", "V4", "f4,i2"]
FLOATS = ["float16", "float32", "float64"]


@st.composite
def dtypes(draw: st.DrawFn, floats_only: bool = False) -> np.dtype:
    """Any NumPy dtype, in either byte order where it has one (floats most often)."""
    kind = draw(st.sampled_from(FLOATS if floats_only else [*FLOATS, *FLOATS, *NUMERIC, *OTHER]))
    dtype = np.dtype(kind)
    if dtype.itemsize > 1 and dtype.kind in "iufcmM" and draw(st.integers(0, 3)) == 0:
        dtype = dtype.newbyteorder(draw(st.sampled_from("<>")))
    return dtype


def fill(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Random values (never zeros everywhere) of `dtype`: small integers, N(0, 1) floats."""
    n = math.prod(shape)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(dtype)
    if dtype.kind in "iu":
        low = 0 if dtype.kind == "u" else -4
        return rng.integers(low, 5, shape).astype(dtype)
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    if dtype.kind in "mM":
        return rng.integers(0, 1000, shape).astype(dtype)
    if dtype.kind == "O":
        return np.array([float(v) for v in rng.standard_normal(n)] + [None], dtype=object)[:n].reshape(shape)
    return np.zeros(shape, dtype)  # strings, void, structured


LAYOUTS = ("contiguous", "fortran", "reversed", "strided", "offset", "transposed", "broadcast", "unaligned",
           "overlapping")  # fmt: skip


_RNG = [np.random.default_rng(0)]  # values of the example being drawn: seeded once per example by `seed`


def seed(draw: st.DrawFn) -> None:
    """Seed the value generator from one draw, so an example replays exactly (and costs one draw)."""
    _RNG[0] = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))


@st.composite
def arrays(draw: st.DrawFn, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An array of exactly `shape` and `dtype`, as a view with a drawn memory layout."""
    rng = _RNG[0]
    layout = draw(st.sampled_from(LAYOUTS))
    if layout == "fortran":
        return np.asfortranarray(fill(rng, shape, dtype))
    if layout == "reversed" and shape:
        axis = draw(st.integers(0, len(shape) - 1))
        return np.flip(fill(rng, shape, dtype), axis)
    if layout == "strided":
        big = fill(rng, tuple(2 * n for n in shape), dtype)
        return big[tuple(slice(None, None, 2) for _ in shape)]
    if layout == "offset":
        return fill(rng, (math.prod(shape) + 1,), dtype)[1:].reshape(shape)
    if layout == "transposed" and len(shape) >= 2:
        return fill(rng, shape[::-1], dtype).T
    if layout == "broadcast" and shape:
        row = fill(rng, (1, *shape[1:]), dtype)
        return np.broadcast_to(row, shape)  # stride 0, read-only
    if layout == "overlapping" and len(shape) >= 1 and shape[0] > 1:
        row = fill(rng, shape[1:], dtype)  # stride 0 and writable: as an out=, its elements overlap each other
        return np.lib.stride_tricks.as_strided(row, shape=shape, strides=(0, *row.strides))
    if layout == "unaligned" and dtype.itemsize > 1 and dtype.kind in "biufc":
        data = fill(rng, shape, dtype)
        raw = np.empty(data.nbytes + 1, np.uint8)
        view = raw[1:].view(dtype).reshape(shape)
        view[...] = data
        return view
    return fill(rng, shape, dtype)


class Hostile:
    """An object whose every conversion raises TypeError or ValueError (what failed conversions raise):
    the library must turn them into its own errors, naming the argument."""

    def __init__(self, error: type[Exception]) -> None:
        self.error = error

    def _fail(self, *args: Any) -> Any:
        raise self.error("hostile object")

    def _unhashable(self) -> int:
        raise TypeError("unhashable hostile object")  # what hash() raises for unhashable objects

    __index__ = __int__ = __float__ = __bool__ = __len__ = __iter__ = __array__ = __str__ = _fail
    __eq__ = __lt__ = __fspath__ = __getitem__ = _fail  # type: ignore[assignment]
    __hash__ = _unhashable  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Hostile({self.error.__name__})"


ODD_VALUES = [
    None, True, False, 0, 1, -1, 3, 2**70, -(2**70), 10**400, -(10**400), 0.0, -0.0, 1.5, -2.5, math.nan, math.inf,
    -math.inf, 1e308,
    5e-324, 1 + 2j, "", "x", "float32", "x" * 100_000, b"", b"ab", bytearray(b"a"), [], [1, 2], [1.0, [2.0]],
    [[1.0, 2.0], [3.0, 4.0]], [0.5] * 257, (), (1, 2), ((1, 2), 3), (None,), {}, {"a": 1}, {1, 2}, object(),
    Ellipsis, slice(1), range(3), len, int, np.float32(1.5), np.float16(-2.0), np.int64(2), np.uint8(7),
    np.bool_(True), np.complex64(1j), np.datetime64(1, "s"), np.str_("ab"), np.array(2.5), np.array([]),
    np.array([1, 2], dtype=object), np.zeros((2, 2), [("a", "f4"), ("b", "i4")]), TensorSpec((2, 3)),
    np.ma.masked_array([1.0, 2.0], [0, 1]), np.array([[1.0, 2.0]]).view(np.recarray), memoryview(b"ab"),
    Hostile(TypeError), Hostile(ValueError),
]  # fmt: skip

python_values = st.one_of(
    st.integers(0, len(ODD_VALUES) - 1).map(ODD_VALUES.__getitem__),  # (sampled_from would print them all)
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.text(max_size=6),
    st.lists(st.integers(-3, 5) | st.floats(-3, 3), max_size=4),
)


@st.composite
def any_array(draw: st.DrawFn, dims: tuple[int, ...], dtype: np.dtype | None) -> np.ndarray:
    """An array whose sides come from `dims` (so that shapes of one call fit together now and then)."""
    ndim = draw(st.integers(0, 4))
    shape = tuple(draw(st.sampled_from(dims)) for _ in range(ndim))
    return draw(arrays(shape, dtype if dtype is not None else draw(dtypes())))


@st.composite
def argument(draw: st.DrawFn, dims: tuple[int, ...], dtype: np.dtype | None) -> Any:
    """One input: mostly an array (of the call's dtype when it has one), sometimes anything at all."""
    choice = draw(st.integers(0, 9))
    if choice < 7:
        return draw(any_array(dims, dtype))
    if choice == 7:
        return draw(any_array(dims, None))
    return draw(python_values)


plausible_attrs = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-4, 5),
    st.tuples(st.integers(-3, 5)),
    st.tuples(st.integers(-3, 5), st.integers(-3, 5)),
    st.lists(st.integers(0, 5), max_size=3),
    st.floats(0, 2),
    st.sampled_from(["relu", "gelu", "silu", "tanh", "float32", "float16", "mean", "", "x"]),
)


@st.composite
def attribute(draw: st.DrawFn, default: Any, has_default: bool) -> Any:
    choice = draw(st.integers(0, 9))
    if choice < 4 and has_default:
        return default
    if choice < 9:
        return draw(plausible_attrs)
    return draw(python_values)


Template = tuple[tuple[Any, ...], tuple[Any, ...], tuple[int, ...]]  # input shapes (or scalars), attrs, out shape


@functools.cache
def find_templates(op: str, trials: int = 4000, keep: int = 12) -> list[Template]:
    """Valid calls of `op` found by random search (float32 arrays, drawn shapes and plausible attributes),
    so the fuzzer reaches the kernels instead of stopping at the argument checks."""
    schema = REGISTRY.ops[op]
    rng = np.random.default_rng(0)
    attr_pool = [None, False, True, -1, 0, 1, 2, 3, (0,), (-1,), (0, 1), 1e-5, "relu", "gelu", "float32"]
    found: dict[Any, Template] = {}
    for _ in range(trials):
        vocabulary = rng.integers(1, 6, size=3)
        shapes = []
        for name in schema.inputs:
            if name in schema.optional and rng.random() < 0.3:
                shapes.append(None)
            elif name in schema.scalars and rng.random() < 0.5:
                shapes.append(float(rng.standard_normal()))
            else:
                shapes.append(tuple(int(rng.choice(vocabulary)) for _ in range(rng.integers(1, 5))))
        attrs = []
        for name in schema.attrs:
            if name in schema.defaults and rng.random() < 0.6:
                attrs.append(schema.defaults[name])
            else:
                attrs.append(attr_pool[rng.integers(len(attr_pool))])
        inputs = tuple(np.ones(s, np.float32) if isinstance(s, tuple) else s for s in shapes)
        try:
            decision = DISPATCHER.decide(op, inputs, tuple(attrs), None, KernelPolicy(validate=False))
        except XpuRuntimeError:
            continue
        key = (tuple(shapes), repr(attrs))
        found.setdefault(key, (tuple(shapes), tuple(attrs), decision.ctx.out_shape))
        if len(found) >= keep:
            break
    return list(found.values())


@st.composite
def templated_call(draw: st.DrawFn, op: str, dims: tuple[int, ...]) -> tuple[list, list, Any]:
    """A valid call's shapes and attributes with drawn dtype and layouts, and now and then one argument
    (or attribute) replaced by anything at all."""
    shapes, attrs, out_shape = draw(st.sampled_from(find_templates(op)))
    choice = draw(st.integers(0, 3))  # half the time the template's own float32, which some inputs require
    dtype = np.dtype(np.float32) if choice < 2 else draw(dtypes(floats_only=choice == 2))
    inputs = [draw(arrays(s, dtype)) if isinstance(s, tuple) else s for s in shapes]
    attrs = list(attrs)
    mutation = draw(st.integers(0, 5))
    if mutation == 0 and inputs:
        inputs[draw(st.integers(0, len(inputs) - 1))] = draw(argument(dims, dtype))
    elif mutation == 1 and attrs:
        index = draw(st.integers(0, len(attrs) - 1))
        attrs[index] = draw(attribute(attrs[index], True))
    out = None
    if draw(st.integers(0, 3)) == 0:
        out = draw(arrays(out_shape, dtype)) if draw(st.integers(0, 3)) else draw(argument(dims, dtype))
    return inputs, attrs, out


@st.composite
def random_call(draw: st.DrawFn, op: str, dims: tuple[int, ...]) -> tuple[list, list, Any]:
    """Arguments and attributes drawn with no regard for validity."""
    schema = REGISTRY.ops[op]
    dtype = draw(dtypes(floats_only=draw(st.booleans())))
    inputs = []
    for name in schema.inputs:
        if name in schema.optional and draw(st.booleans()):
            inputs.append(None)
        elif name in schema.scalars and draw(st.booleans()):
            inputs.append(draw(st.floats(-3, 3) | st.integers(-3, 3) | python_values))
        else:
            inputs.append(draw(argument(dims, dtype)))
    attrs = [draw(attribute(schema.defaults.get(n), n in schema.defaults)) for n in schema.attrs]
    out = draw(argument(dims, dtype)) if draw(st.integers(0, 4)) == 0 else None
    return inputs, attrs, out


@st.composite
def op_calls(draw: st.DrawFn, op: str) -> tuple[tuple, tuple, Any, str | None]:
    """(inputs, attrs, out, preferred CPU kernel or None) for one call of `op`."""
    seed(draw)
    dims = tuple(draw(st.lists(st.integers(0, 5), min_size=1, max_size=3)))
    valid_first = find_templates(op) and draw(st.integers(0, 2)) > 0
    inputs, attrs, out = draw(templated_call(op, dims) if valid_first else random_call(op, dims))
    if draw(st.integers(0, 19)) == 0:  # wrong arity now and then
        (inputs if draw(st.booleans()) else attrs).append(None)
    kernels = [None, *(k.name for k in REGISTRY.kernels_for(op))]
    memory = None if draw(st.integers(0, 9)) else draw(st.sampled_from([0, 1, 64, 4096]))  # a tiny device
    return tuple(inputs), tuple(attrs), out, draw(st.sampled_from(kernels)), memory


# -- checks ------------------------------------------------------------------------------------------------
TOLERANCE = {"float16": 2e-2, "bfloat16": 6e-2, "float32": 1e-4, "float64": 1e-9}


OUTCOMES: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)


def check_error(exc: BaseException, op: str, names: tuple[str, ...]) -> None:
    """A library error naming the op and (unless it lists every kernel's reasons) one argument."""
    if not isinstance(exc, XpuRuntimeError):
        raise AssertionError(f"{op}: raised {type(exc).__name__}, not an XpuRuntimeError: {exc}") from exc
    if isinstance(exc, LaunchError):
        raise AssertionError(f"{op}: a kernel crashed on a call the schema accepted: {exc}") from exc
    message = str(exc)
    assert len(message) < 20_000, f"{op}: a {len(message)}-character message"
    assert op in message, f"{op}: the message does not name the op: {message}"
    if isinstance(exc, OutOfMemoryError):  # an output that cannot fit: named by shape and bytes
        assert (f"{op}: output of shape" in message or f"{op}: workspace of kernel" in message) and "bytes" in message
    elif not isinstance(exc, NoKernelError):
        assert any(f"'{n}'" in message for n in names) or "arguments" in message or "inputs" in message, (
            f"{op}: the message names no argument: {message}"
        )
    OUTCOMES[op][type(exc).__name__] += 1


def reference_answer(op: str, inputs: tuple, attrs: tuple) -> np.ndarray:
    """The schema's float64 reference, called with the call's inputs and (normalized) attributes."""
    schema = REGISTRY.ops[op]
    reference = schema.reference
    params = inspect.signature(reference).parameters
    kwargs = dict(zip(schema.attrs, attrs))
    if any(p.kind is p.VAR_POSITIONAL for p in params.values()):
        return reference(*(x for x in inputs if x is not None), **kwargs)
    return reference(**dict(zip(schema.inputs, inputs)), **kwargs)


def logit_rounding(op: str, inputs: tuple, attrs: tuple, dtype: np.dtype) -> float:
    """Error any implementation in `dtype` may make in a softmax-weighted answer: its logits z carry a
    rounding of about eps * max|z|, which moves the weights (and so the output, by up to max|v|) as much.
    Zero where logits stay small; it matters for calls like attention with scale=1e4."""
    if op not in ("softmax", "attention", "attention_forward") or np.dtype(dtype).kind != "f":
        return 0.0
    eps = float(np.finfo(dtype).eps)

    def peak(x: Any) -> float:
        x = np.asarray(x, dtype=np.float64) if x is not None and np.asarray(x).dtype.kind in "fiub" else np.zeros(0)
        return float(np.max(np.abs(x[np.isfinite(x)]), initial=0.0))

    if op == "softmax":
        return 2 * eps * peak(inputs[0])
    named = dict(zip(REGISTRY.ops[op].attrs, attrs))
    q, k, v = inputs[:3]
    depth = np.shape(q)[-1] if np.ndim(q) else 1
    scale = named.get("scale")
    scale = 1.0 / max(depth, 1) ** 0.5 if scale is None else abs(float(scale))
    mask = inputs[3] if len(inputs) > 3 and np.asarray(inputs[3]).dtype.kind == "f" else None
    logits = scale * depth * peak(q) * peak(k) + peak(mask)
    return 2 * eps * logits * (1.0 + peak(v))


def check_answer(op: str, got: Any, inputs: tuple, attrs: tuple) -> None:
    with np.errstate(all="ignore"):
        ref = np.asarray(reference_answer(op, inputs, attrs))
    got = np.asarray(got)
    assert got.shape == ref.shape, f"{op}: shape {got.shape}, reference {ref.shape}"
    if got.dtype.kind in "iub":
        if ref.dtype.kind in "iu":  # integer results wrap at the output's width, as NumPy's and PyTorch's do
            ref = ref.astype(got.dtype)
        np.testing.assert_array_equal(got.astype(np.int64), ref.astype(np.int64), err_msg=op)
        return
    tol = TOLERANCE.get(got.dtype.name, 1e-2)
    got64, ref64 = got.astype(np.float64), ref.astype(np.float64)
    assert np.array_equal(np.isnan(got64), np.isnan(ref64)), f"{op}: NaN where the reference has none (or not)"
    top = float(np.finfo(got.dtype).max)
    beyond = np.isfinite(ref64) & (np.abs(ref64) > top)  # the exact answer overflows the output dtype
    overflowed = (np.sign(got64) == np.sign(ref64)) & (np.abs(got64) >= top * (1 - tol))
    assert overflowed[beyond].all(), f"{op}: an answer beyond the {got.dtype} range did not overflow to inf"
    finite = np.isfinite(ref64) & ~beyond
    scale = 1.0 + (np.max(np.abs(ref64[finite])) if finite.any() else 0.0)
    error = np.max(np.abs(got64[finite] - ref64[finite]), initial=0.0)
    bound = tol * scale + logit_rounding(op, inputs, attrs, got.dtype)
    assert error <= bound, f"{op}: max error {error:.3g} > {bound:.3g} ({got.dtype})"


def snapshot(values: tuple) -> list[Any]:
    return [np.array(v, copy=True) if isinstance(v, np.ndarray) and v.dtype.kind != "O" else None for v in values]


def check_unmodified(op: str, before: list[Any], inputs: tuple, out: Any) -> None:
    for old, new in zip(before, inputs):
        if old is not None and not (isinstance(out, np.ndarray) and np.may_share_memory(new, out)):
            assert np.array_equal(old, new, equal_nan=old.dtype.kind in "fc"), f"{op}: an input was modified"


def run_fuzzed_call(op: str, inputs: tuple, attrs: tuple, out: Any, preferred: str | None, memory: int | None) -> None:
    """One call; with `memory`, the CPU has that many bytes (a plan made then is not kept)."""
    if memory is None:
        return _run_fuzzed_call(op, inputs, attrs, out, preferred)
    real = capacity.capacity
    capacity.capacity = lambda device: memory
    try:
        _run_fuzzed_call(op, inputs, attrs, out, preferred)
    finally:
        capacity.capacity = real
        DISPATCHER.plans.clear()  # plans made for the tiny device must not serve later calls


def _run_fuzzed_call(op: str, inputs: tuple, attrs: tuple, out: Any, preferred: str | None) -> None:
    schema = REGISTRY.ops[op]
    names = (*schema.inputs, *schema.attrs, "out")
    if isinstance(out, np.ndarray) and out.flags.writeable and out.dtype.kind == "f":
        out[...] = np.nan  # poisoned: an unwritten element shows
    before = snapshot(inputs)
    policy = KernelPolicy({op: preferred} if preferred else {}, validate=REGISTRY)
    try:
        with warnings.catch_warnings(), xrt.kernel_policy(policy):
            warnings.simplefilter("ignore")
            got = DISPATCHER.run(op, inputs, attrs, out)
    except Exception as exc:
        check_error(exc, op, names)
        return
    OUTCOMES[op]["ran"] += 1
    if out is not None:
        assert got is out or np.shares_memory(np.asarray(got), np.asarray(out)), f"{op}: result is not `out`"
    arrays_in, attrs_in, out_in = normalize_call(schema, inputs, attrs, out)
    ctx = build_context(schema, arrays_in, attrs_in, out_in, policy)  # the attributes as the kernel saw them
    if op not in NO_REFERENCE_CHECK:
        check_answer(op, got, arrays_in, tuple(ctx.attrs[n] for n in schema.attrs))
    written = WRITTEN_INPUTS.get(op, set())
    check_unmodified(op, [b if n not in written else None for n, b in zip(schema.inputs, before)], inputs, out)


@pytest.mark.parametrize("op", OPS)
def test_every_op_returns_the_reference_or_a_library_error(op):
    @fuzz_settings(OP_EXAMPLES)
    @given(call=op_calls(op))
    def fuzz(call: tuple) -> None:
        run_fuzzed_call(op, *call)

    OUTCOMES[op].clear()
    fuzz()
    print(f"{op}: {len(find_templates(op))} valid templates; outcomes {dict(OUTCOMES[op])}")
    if find_templates(op):  # the fuzzer must reach the kernels, not only the argument checks
        assert OUTCOMES[op]["ran"] >= 0.05 * sum(OUTCOMES[op].values()), f"{op}: too few calls ran: {OUTCOMES[op]}"


# -- front-end functions (xrt.ops.*) ---------------------------------------------------------------------------
FRONT_ENDS = sorted(xrt.ops.__all__)


@st.composite
def front_end_calls(draw: st.DrawFn, name: str) -> dict[str, Any]:
    """Keyword arguments for `xrt.ops.<name>`: arrays where the op takes tensors, anything elsewhere."""
    seed(draw)
    params = inspect.signature(getattr(xrt.ops, name)).parameters
    dims = tuple(draw(st.lists(st.integers(0, 5), min_size=1, max_size=3)))
    dtype = draw(dtypes(floats_only=draw(st.booleans())))
    kwargs = {}
    for param in params.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        has_default = param.default is not param.empty
        if has_default and draw(st.integers(0, 2)) == 0:
            continue
        if not has_default or (param.default is None and draw(st.booleans())):
            kwargs[param.name] = draw(argument(dims, dtype))
        else:
            kwargs[param.name] = draw(attribute(param.default, has_default))
    return kwargs


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.xfail(reason=FRONT_END_GAPS[n])) if n in FRONT_END_GAPS else n
        for n in FRONT_ENDS
    ],
)
def test_every_front_end_function_returns_or_raises_a_library_error(name):
    function = getattr(xrt.ops, name)
    known = (name, *REGISTRY.ops)

    @fuzz_settings(300)
    @given(kwargs=front_end_calls(name))
    def fuzz(kwargs: dict[str, Any]) -> None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                function(**kwargs)
        except Exception as exc:
            assert isinstance(exc, XpuRuntimeError), f"{name}: raised {type(exc).__name__}: {exc}"
            assert not isinstance(exc, LaunchError), f"{name}: a kernel crashed: {exc}"
            assert any(op in str(exc) for op in known), f"{name}: the message names no op: {exc}"
            assert len(str(exc)) < 20_000

    fuzz()


# -- the public functions of the package ---------------------------------------------------------------------
def _enter(manager: Any) -> None:
    with manager:
        pass


def _log(max_records: Any) -> None:
    try:
        xrt.enable_dispatch_logging(max_records)
    finally:
        xrt.disable_dispatch_logging()


def _set_policy(value: Any) -> None:
    try:
        xrt.set_kernel_policy(value)
    finally:
        xrt.clear_kernel_policy()


def _profile(max_events: Any, range_name: Any, path: Any) -> None:
    with xrt.profiler(max_events) as prof, xrt.record_range(range_name):
        xrt.ops.sum(np.arange(3.0))
    prof.summary()
    prof.chrome_trace()
    if isinstance(path, str) and path.startswith(("/", "~", "..")):
        return  # arbitrary absolute paths stay untouched
    with contextlib.chdir(_FUZZ_DIR):
        prof.export_chrome_trace(path)


def _policy_file(content: bytes, suffix: str) -> None:
    path = os.path.join(_FUZZ_DIR, f"policy{suffix}")
    with open(path, "wb") as file:
        file.write(content)
    KernelPolicy.from_file(path)


def _returned(value: Any) -> None:
    """A returns_output kernel giving back `value`: the call returns the op's output or raises LaunchError."""
    registry = Registry()
    registry.register_op(REGISTRY.ops["softmax"])
    registry.register_backend(REGISTRY.backends[CPU_BACKEND])
    registry.register_kernel(kernel("softmax", "own", backend=CPU_BACKEND, returns_output=True)(lambda args: value))
    x = np.ones((2, 3), np.float32)
    got = Dispatcher(registry).run("softmax", (x,), (-1,))
    assert type(got) is np.ndarray and got.shape == x.shape and got.dtype == x.dtype, got


def _tuning_entry(content: bytes) -> None:
    """A tuning-cache file of any content: read as a dict or ignored with a warning, never an error."""
    cache = tuning_cache.TuningCache(os.path.join(_FUZZ_DIR, "tuning"))
    key = tuning_cache.key("matmul", dtypes="float32", shape=(8, 8))
    entry = cache.path(key)
    entry.parent.mkdir(parents=True, exist_ok=True)
    entry.write_bytes(content)
    assert cache.get(key) is None or isinstance(cache.get(key), dict)


def _declare(op: Any, name: Any, backend: Any, hint: str, value: Any) -> None:
    spec = xrt.kernel(op, name, backend=backend, **{hint: value})(lambda args: None)
    registry = Registry()
    registry.register_kernel(spec)  # unknown op: a library error


@st.composite
def seeded_arguments(draw: st.DrawFn) -> list[Any]:
    seed(draw)
    return draw(st.lists(argument((2, 3), np.dtype("float32")), max_size=3))


_FUZZ_DIR = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"xrt-fuzz-{os.getpid()}")
HINTS = ("dtypes", "conditions", "priority", "fused", "tensor_cores", "deterministic", "returns_output",
         "min_compute_capability", "launch_config", "workspace_bytes", "doc")  # fmt: skip
op_names = st.sampled_from(sorted(REGISTRY.ops)) | python_values
policy_values = st.one_of(
    python_values,
    st.sampled_from(["matmul=blocked", "matmul=blocked,strict=true", "strictt=1", "sum=auto", "=", ",,", "a=b=c"]),
    st.dictionaries(st.sampled_from(["matmul", "strict", "preferences", "sync", "math_mode", "x"]), python_values),
)
dtype_sets = st.sets(st.sampled_from(["float32", "bfloat16", "float99", "fp32", "", "FLOAT32"]))
API_CALLS: dict[str, tuple[Callable[..., Any], st.SearchStrategy]] = {
    "KernelPolicy": (lambda kw: KernelPolicy(**kw), st.fixed_dictionaries(
        {}, optional={"preferences": policy_values, "strict": python_values, "math_mode": python_values,
                      "deterministic": python_values, "sync": python_values, "validate": python_values,
                      "matmul": python_values})),
    "KernelPolicy.from_string": (KernelPolicy.from_string, python_values | st.text(max_size=40)),
    "KernelPolicy.from_dict": (KernelPolicy.from_dict, policy_values),
    "KernelPolicy.from_file": (lambda a: _policy_file(*a), st.tuples(
        st.binary(max_size=60) | st.sampled_from([b'{"matmul": "blocked"}', b"[" * 50_000, b'{"a": {"b": 1}}',
                                                  b'matmul = "blocked"', b"a = [" * 40_000]),
        st.sampled_from([".json", ".toml", ".TOML", ".Toml", ".JSON", ""]))),
    "TensorSpec": (lambda kw: TensorSpec(**kw), st.fixed_dictionaries(
        {"shape": python_values | st.lists(st.integers(-3, 5) | python_values, max_size=4)},
        optional={"dtype": python_values | st.sampled_from(["float32", "bfloat16", "float99", ""]),
                  "strides": python_values | st.lists(st.integers(-3, 5), max_size=4),
                  "device": python_values, "ptr": python_values, "itemsize": python_values})),
    "returns_output": (_returned, python_values | st.builds(lambda n: np.ones((n, 3), np.float32), st.integers(0, 3))
                       | st.just((np.ones((2, 3), np.float32),))),
    "TuningCache.get": (_tuning_entry, st.binary(max_size=200) | st.sampled_from([
        b"[" * 100_000 + b"]" * 100_000, b'{"format": 1, "key": "x", "value": {}}', b"\xff\xfe", b"{" * 5000])),
    "set_kernel_policy": (_set_policy, policy_values),
    "kernel_policy": (lambda v: _enter(xrt.kernel_policy(v)), policy_values),
    "explain": (lambda a: xrt.explain(a[0], *a[1], policy=a[2], show=False), st.tuples(
        op_names, seeded_arguments(), policy_values | st.none())),
    "enable_dispatch_logging": (_log, python_values),
    "profiler": (lambda a: _profile(*a), st.tuples(st.integers(-2, 5) | python_values, python_values,
                                                   st.text(max_size=8) | python_values)),
    "Registry.kernel": (lambda a: default_registry().kernel(*a), st.tuples(op_names, python_values)),
    "Registry.kernels_for": (lambda op: default_registry().kernels_for(op), op_names),
    "kernel": (lambda a: _declare(*a), st.tuples(op_names, python_values | st.text(max_size=8), python_values,
                                                 st.sampled_from(HINTS), python_values | dtype_sets)),
    "MathMode.parse": (xrt.MathMode.parse, python_values),
    "SyncPolicy.parse": (xrt.SyncPolicy.parse, python_values),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(API_CALLS))
def test_public_functions_return_or_raise_a_library_error(name):
    function, strategy = API_CALLS[name]
    os.makedirs(_FUZZ_DIR, exist_ok=True)

    @fuzz_settings(300)
    @given(value=strategy)
    def fuzz(value: Any) -> None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                function(value)
        except Exception as exc:
            assert isinstance(exc, XpuRuntimeError), f"{name}: raised {type(exc).__name__}: {exc}"
            assert len(str(exc)) < 20_000, f"{name}: a {len(str(exc))}-character message"

    fuzz()


# -- the CLI -------------------------------------------------------------------------------------------------
shape_texts = st.sampled_from(["3x4", "4x5", "2x3x4", "4", "scalar", "", "0x3", "x", "-1x2", "3xx4", "1e3"])
dtype_texts = st.sampled_from([*NUMERIC, *OTHER, "bfloat16", "float", "nope"])
attr_texts = st.sampled_from(["axis=-1", "axis=(0,1)", "keepdims=true", "normalized_shape=4", "eps=1e-5", "=",
                              "axis", "is_causal=yes", "scale=none", "nope=1", "axis=[0"])  # fmt: skip


@st.composite
def cli_argv(draw: st.DrawFn) -> list[str]:
    """A command line: a known command with drawn options (valid and not), or junk."""
    command = draw(st.sampled_from(["explain", "explain", "explain", "kernels", "info", "nope", "--version"]))
    argv = [command]
    if command == "kernels" and draw(st.booleans()):
        argv.append(draw(st.sampled_from(sorted(REGISTRY.ops)) | st.text(max_size=6)))
    if command == "explain":
        argv.append(draw(st.sampled_from(sorted(REGISTRY.ops)) | st.text(min_size=1, max_size=6)))
        for _ in range(draw(st.integers(0, 3))):
            argv += ["--shape", draw(shape_texts)]
        for _ in range(draw(st.integers(0, 2))):
            argv += ["--dtype", draw(dtype_texts)]
        if draw(st.booleans()):
            argv += ["--attr", draw(attr_texts)]
        if draw(st.booleans()):
            argv += ["--policy", draw(st.sampled_from(["matmul=blocked", "strictt=1", "sum=nope", ",", "x" * 5000]))]
    argv += draw(st.lists(st.text(max_size=4), max_size=1))
    return [a.replace("\x00", "") for a in argv]


def run_cli(argv: list[str], environ: dict[str, str] | None = None) -> tuple[int, str]:
    """Run `xpuruntime argv` in this process; its exit code and everything it printed."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main(argv)
    return code, out.getvalue() + err.getvalue()


@fuzz_settings(400)
@given(argv=cli_argv(), env_policy=st.none() | st.sampled_from(["sum=numpy", "strictt=1", "x=y", "\xff"]))
def test_cli_never_prints_a_traceback(argv, env_policy):
    with pytest.MonkeyPatch.context() as patch:
        if env_policy is not None:
            patch.setenv(policy.ENV_POLICY, env_policy)
        with contextlib.suppress(XpuRuntimeError):  # a bad one raises at every use: the CLI must say so
            policy.environment_policy(reload=True)
        try:
            code, output = run_cli(argv)
        finally:
            patch.undo()
            policy.environment_policy(reload=True)
    assert code in (0, 1, 2), f"exit code {code} for {argv}"
    assert "Traceback" not in output, f"xpuruntime {argv} printed a traceback:\n{output}"


@fuzz_settings(12)
@given(
    iterations=st.sampled_from(["1", "0", "x", "-2"]),
    size=st.sampled_from(["small", "huge"]),
    trace=st.none() | st.sampled_from(["", ".", "trace.json", "missing/trace.json", "trace.json/"]),
)
def test_cli_demo_never_prints_a_traceback(iterations, size, trace, tmp_path_factory):
    folder = tmp_path_factory.mktemp("demo")
    argv = ["demo", "--iterations", iterations, "--size", size]
    if trace is not None:
        argv += ["--trace", trace if trace in ("", ".") else str(folder / trace)]
    code, output = run_cli(argv)
    assert code in (0, 1, 2) and "Traceback" not in output, f"{argv}: {output}"
    assert not [p for p in folder.rglob("*.tmp")], "a temporary trace file was left behind"
