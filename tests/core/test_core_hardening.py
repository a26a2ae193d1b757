"""Regression tests for what a hostile user found: each reproducer now raises a clear library error (or
works), and the bounded structures (profiler, fingerprints, registry listeners) stay bounded."""

from __future__ import annotations

import gc
import json
import os
import stat

import numpy as np
import pytest
from conftest import make_toy_registry

import xpuruntime as xrt
from xpuruntime import policy
from xpuruntime.cli import main
from xpuruntime.errors import (
    ArgumentError,
    DTypeError,
    PolicyError,
    RegistrationError,
    UnknownOpError,
    XpuRuntimeError,
)
from xpuruntime.policy import KernelPolicy
from xpuruntime.profiling import Profiler
from xpuruntime.registry import Backend, KernelSpec, Registry, kernel

rng = np.random.default_rng(5)


def noop(args) -> None:
    """A launch that does nothing."""


# -- 1. unknown op or option names in policies ------------------------------------------------------------
@pytest.mark.parametrize(
    "make",
    [
        lambda: KernelPolicy.from_string("matmul=blocked,strictt=true"),
        lambda: KernelPolicy.from_string("matmul=blocked,strictt=true", validate=False),
        lambda: KernelPolicy.from_dict({"matmul": "blocked", "determinstic": True}),
        lambda: KernelPolicy.from_dict({"preferences": {"matmul": "blocked"}, "Strict": "1"}),
        lambda: KernelPolicy(math_modes="tf32"),
    ],
)
def test_misspelt_policy_option_is_an_error_with_a_suggestion(make):
    with pytest.raises(PolicyError, match=r"unknown policy option .* Did you mean '(strict|deterministic|math_mode)'"):
        make()


def test_misspelt_op_name_is_an_error_with_a_suggestion():
    with pytest.raises(UnknownOpError, match=r"unknown op or policy option 'matmull'\. Did you mean 'matmul'"):
        KernelPolicy.from_dict({"matmull": "blocked"})


def test_environment_policy_with_a_misspelt_option_fails_every_call(monkeypatch):
    monkeypatch.setenv(policy.ENV_POLICY, "matmul=blocked,strictt=true")
    a = rng.standard_normal((3, 5)).astype(np.float32)
    for _ in range(2):
        with pytest.raises(PolicyError, match=r"\$XPURUNTIME_POLICY: unknown policy option 'strictt'"):
            xrt.ops.matmul(a, a.T)


def test_environment_policy_with_an_unknown_op_fails_naming_its_source(monkeypatch, tmp_path):
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"atention": "chunked"}))
    monkeypatch.setenv(policy.ENV_POLICY_FILE, str(path))
    with pytest.raises(UnknownOpError, match=r"policy file .*policy.json: unknown op .*Did you mean 'attention'"):
        xrt.ops.sum(rng.standard_normal(4))


def test_options_and_known_ops_still_parse():
    p = KernelPolicy.from_string("matmul=blocked,strict=true,deterministic=0,sync=full_sync,math_mode=tf32")
    assert p.strict and p.preferences == {"matmul": "blocked"} and p.math_mode is xrt.MathMode.TF32


# -- 2. kernel declarations are validated at registration -----------------------------------------------
@pytest.mark.parametrize(
    ("hints", "field"),
    [
        ({"conditions": lambda ctx: None}, "conditions"),
        ({"conditions": (None,)}, "conditions"),
        ({"priority": "high"}, "priority"),
        ({"priority": True}, "priority"),
        ({"priority": float("nan")}, "priority"),
        ({"dtypes": "float32"}, "dtypes"),
        ({"dtypes": 32}, "dtypes"),
        ({"dtypes": (np.float32,)}, "dtypes"),
        ({"fused": "yes"}, "fused"),
        ({"deterministic": None}, "deterministic"),
        ({"min_compute_capability": 8}, "min_compute_capability"),
        ({"min_compute_capability": (8, "0")}, "min_compute_capability"),
        ({"launch_config": 3}, "launch_config"),
        ({"workspace_bytes": 1024}, "workspace_bytes"),
        ({"doc": 5}, "doc"),
    ],
)
def test_bad_kernel_hint_is_refused_naming_the_field(hints, field):
    registry = make_toy_registry()
    with pytest.raises(RegistrationError, match=f"field '{field}'"):
        registry.register_kernel(kernel("toy", "k", backend="cpu", **hints)(noop))
    assert registry.kernels_for("toy") == []


@pytest.mark.parametrize("name", ["", "auto", "autotune", "AUTO", "a,b", "a=b", "a/b", " k", 42, None])
def test_bad_or_reserved_kernel_name_is_refused(name):
    with pytest.raises(RegistrationError, match="field 'name'"):
        kernel("toy", name, backend="cpu")(noop)


def test_non_callable_launch_is_refused():
    with pytest.raises(RegistrationError, match="field 'launch'"):
        kernel("toy", "k", backend="cpu")(42)
    with pytest.raises(RegistrationError, match="field 'launch'"):
        xrt.register_kernel("matmul", "my_kernel", backend="cpu")("not a function")
    assert "my_kernel" not in xrt.default_registry().kernels["matmul"]


def test_register_kernel_refuses_what_is_not_a_kernel_spec():
    with pytest.raises(RegistrationError, match="expected a KernelSpec"):
        make_toy_registry().register_kernel(noop)


def test_kernel_spec_made_directly_is_validated_too():
    with pytest.raises(RegistrationError, match="field 'dtypes'"):
        KernelSpec("toy", "k", "cpu", noop, dtypes="float32")


def test_a_list_of_conditions_and_a_list_of_dtypes_are_taken_as_a_tuple_and_a_set():
    spec = kernel("toy", "k", backend="cpu", conditions=[lambda ctx: None], dtypes=["float32"])(noop)
    assert isinstance(spec.conditions, tuple) and spec.dtypes == frozenset({"float32"})


# -- 3. norms with non-floating dtypes ----------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.int32, np.int8, np.uint64, np.bool_, np.complex64, object])
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_norm_of_a_non_floating_dtype_is_a_dtype_error(op, dtype):
    x = np.ones((2, 8), dtype)
    with pytest.raises(DTypeError, match=f"{op}: argument 'x' expected a floating dtype"):
        getattr(xrt.ops, op)(x, 8)


def test_explain_rms_norm_of_int32_from_the_cli_has_no_traceback(capsys):
    code = main(["explain", "rms_norm", "--shape", "2x8", "--dtype", "int32", "--attr", "normalized_shape=8"])
    out, err = capsys.readouterr()
    assert code == 2
    assert "Traceback" not in out + err
    assert "rms_norm: argument 'x' expected a floating dtype" in err


# -- 4. undecodable and deeply nested policy files ------------------------------------------------------------
@pytest.mark.parametrize(
    ("suffix", "content", "message"),
    [
        (".json", b"\xff\xfe\x00\x01binary\x80", "not UTF-8"),
        (".json", '{"matmul": "blocked"}'.encode("utf-16"), "not UTF-8"),
        (".json", b"[" * 100_000 + b"]" * 100_000, "nested more than"),
        (".json", b'{"a": ' * 5000 + b"1" + b"}" * 5000, "nested more than"),
        (".toml", b"a = " + b"[" * 100_000 + b"]" * 100_000, "nested more than"),
        (".toml", b"\x80\x81", "not UTF-8"),
    ],
)
def test_undecodable_or_deep_policy_file_is_a_policy_error(tmp_path, monkeypatch, suffix, content, message):
    path = tmp_path / f"policy{suffix}"
    path.write_bytes(content)
    with pytest.raises(PolicyError, match=message):
        KernelPolicy.from_file(path)
    monkeypatch.setenv(policy.ENV_POLICY_FILE, str(path))  # through the environment: every call says so
    with pytest.raises(PolicyError, match=message):
        xrt.ops.sum(rng.standard_normal(3))


def test_bad_policy_file_through_the_environment_gives_the_cli_one_line(tmp_path, monkeypatch, capsys):
    path = tmp_path / "policy.json"
    path.write_bytes(b"\xff\xfe\x00")
    monkeypatch.setenv(policy.ENV_POLICY_FILE, str(path))
    code = main(["explain", "sum", "--shape", "4"])
    out, err = capsys.readouterr()
    assert code == 2 and "Traceback" not in out + err and "not UTF-8" in err


def test_policy_file_with_a_utf8_bom_reads(tmp_path):
    path = tmp_path / "policy.json"
    path.write_text('{"matmul": "blocked"}', encoding="utf-8-sig")
    assert KernelPolicy.from_file(path) == KernelPolicy(matmul="blocked")


# -- 5. the profiler is bounded -------------------------------------------------------------------------------
def test_profiler_keeps_the_newest_events_and_counts_the_dropped(tmp_path):
    x = rng.standard_normal((3, 4))
    with xrt.profiler(max_events=5) as prof:
        for _ in range(12):
            with prof.range("step"):
                xrt.ops.sum(x)
        xrt.ops.softmax(x)
    assert len(prof.ops) == 5 and prof.dropped_ops == 8
    assert len(prof.ranges) == 5 and prof.dropped_ranges == 7
    assert prof.dropped_events == 15
    rows = {row["op"]: row for row in prof.summary()}
    assert rows["sum"]["calls"] == 12 and rows["sum"]["dropped"] == 8  # totals count every dispatch
    assert rows["softmax"]["calls"] == 1 and rows["softmax"]["dropped"] == 0
    trace = json.loads(prof.export_chrome_trace(tmp_path / "t.json").read_text())
    assert trace["otherData"]["dropped_events"] == 15
    assert any("15 oldest events dropped" in e["name"] for e in trace["traceEvents"])


def test_profiler_is_bounded_by_default():
    with xrt.profiler() as prof:
        pass
    assert 0 < prof.max_events <= 1_000_000


@pytest.mark.parametrize("bad", [0, -1, None, 2.5, "10", True])
def test_profiler_bound_must_be_a_positive_int(bad):
    with pytest.raises(ArgumentError, match=r"profiler: argument 'max_events' expected an int in \[1, "):
        xrt.profiler(max_events=bad).__enter__()


# -- 6. trace paths are checked first, temporary files cleaned -------------------------------------------------
def _profiled() -> Profiler:
    with xrt.profiler() as prof:
        xrt.ops.sum(rng.standard_normal(4))
    return prof


@pytest.mark.parametrize(
    ("make_path", "message"),
    [
        (lambda tmp: tmp, "is a folder"),
        (lambda tmp: "", "expected a file path"),
        (lambda tmp: tmp / "missing" / "t.json", "does not exist"),
        (lambda tmp: 42, "expected a file path"),
    ],
)
def test_export_chrome_trace_refuses_bad_paths_and_leaves_nothing(tmp_path, make_path, message):
    prof = _profiled()
    with pytest.raises(ArgumentError, match=message):
        prof.export_chrome_trace(make_path(tmp_path))
    assert list(tmp_path.iterdir()) == []


def _read_only_folder(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    if os.access(folder, os.W_OK):  # root writes anyway
        folder.chmod(0o700)
        pytest.skip("running as a user that may write into read-only folders")
    return folder


def test_export_chrome_trace_into_an_unwritable_folder(tmp_path):
    folder = _read_only_folder(tmp_path)
    try:
        with pytest.raises(ArgumentError, match="cannot be written"):
            _profiled().export_chrome_trace(folder / "t.json")
        assert list(folder.iterdir()) == []
    finally:
        folder.chmod(0o700)


def test_export_chrome_trace_cleans_its_temporary_file_when_the_rename_fails(tmp_path, monkeypatch):
    def fail(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(ArgumentError, match="No space left"):
        _profiled().export_chrome_trace(tmp_path / "t.json")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("make_arg", "message"),
    [(lambda tmp: str(tmp), "is a folder"), (lambda tmp: "", "expected a file path"),
     (lambda tmp: str(tmp / "no" / "t.json"), "does not exist")],
)  # fmt: skip
def test_demo_trace_path_is_checked_before_any_work(tmp_path, capsys, monkeypatch, make_arg, message):
    import xpuruntime.cli.demo as demo

    monkeypatch.setattr(demo, "forward", lambda *a: pytest.fail("the demo ran before checking --trace"))
    code = main(["demo", "--iterations", "1", "--trace", make_arg(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 2 and "Traceback" not in out + err
    assert f"xpuruntime demo: error: --trace: argument 'path' {message}" in err or message in err
    assert not any(p.name.endswith(".tmp") for p in tmp_path.rglob("*"))


# -- 7. raw Python exceptions become library errors --------------------------------------------------------------
@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda: xrt.set_kernel_policy(42), PolicyError, "expected a KernelPolicy, a policy string, a mapping"),
        (lambda: xrt.explain("sum", rng.standard_normal(3), policy=42, show=False), PolicyError, "got 42"),
        (lambda: xrt.explain(None, rng.standard_normal(3), show=False), UnknownOpError, "op names are strings"),
        (lambda: xrt.explain(["sum"], rng.standard_normal(3), show=False), UnknownOpError, "op names are strings"),
        (lambda: KernelPolicy.from_dict({"preferences": "x"}), PolicyError, "'preferences' must be a mapping"),
        (lambda: KernelPolicy.from_dict(["matmul"]), PolicyError, "expected a mapping"),
        (lambda: KernelPolicy.from_dict({1: "blocked"}), PolicyError, "non-empty strings"),
        (lambda: KernelPolicy.from_string(None), PolicyError, "expected a string"),
        (lambda: KernelPolicy(validate="yes"), PolicyError, "argument 'validate'"),
        (
            lambda: xrt.ops.attention(*(rng.standard_normal((2, 3, 4)),) * 3, dropout_p=np.zeros(2)),
            ArgumentError,
            "attention: argument 'dropout_p' expected 0.0",
        ),
        (lambda: xrt.enable_dispatch_logging(max_records=-1), ArgumentError, "argument 'max_records'"),
        (lambda: xrt.enable_dispatch_logging(max_records=None), ArgumentError, "argument 'max_records'"),
        (lambda: xrt.enable_dispatch_logging(max_records=1.5), ArgumentError, "argument 'max_records'"),
        (lambda: xrt.ops.layer_norm(rng.standard_normal((2, 1)), True), ArgumentError, "'normalized_shape'"),
        (lambda: xrt.ops.rms_norm(rng.standard_normal((2, 1)), (True,)), ArgumentError, "'normalized_shape'"),
        (lambda: xrt.ops.sum("abc"), DTypeError, "sum: argument 'x' expected a floating, integer or bool dtype"),
    ],
)
def test_raw_python_exceptions_became_library_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()
    assert not xrt.dispatch_logging_enabled()


def test_an_error_never_echoes_a_huge_policy_string_in_full():
    spec = "x" * 100_000
    for make in (lambda: KernelPolicy.from_string(spec), lambda: KernelPolicy.from_string(f"matmul={spec}"),
                 lambda: KernelPolicy.from_string(f"{spec}=blocked"), lambda: xrt.set_kernel_policy(spec)):  # fmt: skip
        with pytest.raises(XpuRuntimeError) as info:
            make()
        assert len(str(info.value)) < 2_000


def test_max_records_still_bounds_the_log():
    xrt.enable_dispatch_logging(max_records=3)
    for _ in range(5):
        xrt.ops.sum(rng.standard_normal(3))
    assert len(xrt.get_dispatch_logs()) == 3


# -- 8. slow leaks --------------------------------------------------------------------------------------------
def test_fingerprints_of_dropped_policies_are_forgotten():
    gc.collect()
    before = len(policy._fingerprints)
    for index in range(2_000):
        KernelPolicy(toy=f"k{index}", validate=False)
    gc.collect()
    assert len(policy._fingerprints) <= before + 1


def test_equal_policies_share_a_fingerprint_while_either_lives():
    a = KernelPolicy(matmul="blocked", strict=True)
    assert KernelPolicy.from_string("strict=1,matmul=blocked").fingerprint is a.fingerprint
    assert KernelPolicy(matmul="gemv").fingerprint is not a.fingerprint


def test_a_fingerprint_held_by_a_plan_key_is_never_given_to_other_content():
    registry = make_toy_registry({"name": "a"}, {"name": "b"})
    dispatcher = xrt.Dispatcher(registry)
    x = rng.standard_normal(4).astype(np.float32)
    with xrt.kernel_policy(KernelPolicy(toy="b", validate=False)):
        np.testing.assert_array_equal(dispatcher.run("toy", (x,)), x + 1)
    gc.collect()
    with xrt.kernel_policy(KernelPolicy(toy="a", validate=False)):  # new content: must not hit b's plan
        np.testing.assert_array_equal(dispatcher.run("toy", (x,)), x + 0)
    with xrt.kernel_policy(KernelPolicy(toy="b", validate=False)):  # old content: b's plan again
        np.testing.assert_array_equal(dispatcher.run("toy", (x,)), x + 1)
    assert dispatcher.plans.stats().hits == 1


def test_dropped_dispatchers_leave_no_listener_references_even_without_registry_changes():
    registry = make_toy_registry({"name": "a"})
    for _ in range(2_000):
        xrt.Dispatcher(registry)
    gc.collect()
    xrt.Dispatcher(registry)  # registering a listener prunes the dead ones
    assert len(registry._listeners) <= 2


def test_listeners_still_hear_changes():
    registry = Registry()
    registry.register_backend(Backend("cpu", "cpu", empty=lambda *a: None))
    heard = []
    registry.on_change(heard.append)
    registry.register_op(make_toy_registry().ops["toy"])
    registry.register_kernel(kernel("toy", "k", backend="cpu")(noop))
    assert heard == ["toy"]


# -- found by the API fuzz test -------------------------------------------------------------------------------
def _big_endian(a: np.ndarray) -> np.ndarray:
    return a.astype(a.dtype.newbyteorder(">"))


@pytest.mark.parametrize(("dtype", "out_dtype"), [(np.float32, ">f4"), (np.uint64, ">u8"), (np.int32, ">i8")])
def test_sum_into_a_non_native_byte_order_output(dtype, out_dtype):
    x = _big_endian(rng.integers(0, 5, (3, 4)).astype(dtype))
    out = np.empty(3, out_dtype)
    assert xrt.ops.sum(x, axis=1, out=out) is out
    np.testing.assert_array_equal(out, x.astype(np.float64).sum(axis=1))


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_softmax_and_chunked_attention_of_non_native_byte_order_arrays(dtype):
    x = _big_endian(rng.standard_normal((3, 4)).astype(dtype))
    ref = np.exp(x.astype(np.float64) - x.astype(np.float64).max(-1, keepdims=True))
    np.testing.assert_allclose(xrt.ops.softmax(x), ref / ref.sum(-1, keepdims=True), rtol=2e-3, atol=1e-3)
    q, k, v = (_big_endian(rng.standard_normal(s).astype(dtype)) for s in ((1, 1), (1, 1, 1), (5, 1, 1)))
    with xrt.kernel_policy(attention="chunked", strict=True):
        got = xrt.ops.attention(q, k, v)
    np.testing.assert_allclose(got, np.broadcast_to(v.astype(np.float64), (5, 1, 1)), rtol=2e-3)


def test_gemv_writes_an_unaligned_output():
    a, b = rng.standard_normal((1, 4)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)
    raw = np.empty(4 * 3 + 1, np.uint8)
    out = raw[1:].view(np.float32).reshape(1, 3)
    assert not out.flags.aligned
    with xrt.kernel_policy(matmul="gemv", strict=True):
        xrt.ops.matmul(a, b, out=out)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-5)


class _FailingIndex:
    def __index__(self) -> int:
        raise ValueError("no")


@pytest.mark.parametrize("bad", [np.array(2.5), _FailingIndex(), 2**70])
def test_odd_buffer_bounds_are_argument_errors(bad):
    with pytest.raises(ArgumentError, match="max_records"):
        xrt.enable_dispatch_logging(bad)


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda: xrt.MathMode.parse("x" * 100_000), PolicyError),
        (lambda: xrt.SyncPolicy.parse(_FailingIndex()), PolicyError),
        (lambda: KernelPolicy(strict=_FailingIndex()), PolicyError),
        (lambda: KernelPolicy.from_dict({"preferences": np.array([])}), PolicyError),
        (lambda: xrt.default_registry().kernels_for(_FailingIndex()), UnknownOpError),
        (lambda: xrt.record_range(42).__enter__(), ArgumentError),
    ],
)
def test_odd_values_in_the_public_api_are_library_errors(call, error):
    with pytest.raises(error) as info:
        call()
    assert len(str(info.value)) < 2_000
