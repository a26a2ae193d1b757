"""KernelPolicy: construction, global / scoped / environment / file sources, threads and asyncio tasks."""

from __future__ import annotations

import asyncio
import json
import threading

import numpy as np
import pytest
from conftest import make_toy_registry

import xpuruntime as xrt
from xpuruntime import policy
from xpuruntime.abi import MathMode, SyncPolicy
from xpuruntime.dispatch import Dispatcher
from xpuruntime.errors import PolicyError, UnknownKernelError
from xpuruntime.policy import KernelPolicy


def test_policy_fields_equality_and_repr():
    p = KernelPolicy(matmul="blocked", attention="chunked", strict=True, math_mode="TF32", deterministic=True)
    assert dict(p.preferences) == {"attention": "chunked", "matmul": "blocked"}
    assert p.strict and p.deterministic and p.math_mode is MathMode.TF32 and p.sync is SyncPolicy.NO_SYNC
    assert p == KernelPolicy({"attention": "chunked"}, matmul="blocked", strict=True, math_mode="tf32",
                             deterministic=True)  # fmt: skip
    assert p.fingerprint != KernelPolicy(matmul="blocked").fingerprint
    assert repr(p) == ("KernelPolicy(attention='chunked', matmul='blocked', strict=True, math_mode='tf32', "
                       "deterministic=True)")  # fmt: skip
    assert KernelPolicy(matmul="auto").preferences == {}
    with pytest.raises(TypeError):
        p.preferences["matmul"] = "gemv"  # read-only view


def test_policy_round_trips_through_a_dict_and_json(tmp_path):
    p = KernelPolicy(matmul="blocked", strict=True, math_mode="bf16", sync="event_record")
    assert KernelPolicy.from_dict(p.to_dict()) == p
    path = tmp_path / "saved.json"
    path.write_text(json.dumps(p.to_dict()))
    assert KernelPolicy.from_file(path) == p


def test_bad_option_values_are_policy_errors():
    with pytest.raises(PolicyError, match="unknown math_mode 'fp8'"):
        KernelPolicy(math_mode="fp8")
    with pytest.raises(PolicyError, match="strict"):
        KernelPolicy(strict="maybe")
    with pytest.raises(PolicyError, match="must be a kernel name"):
        KernelPolicy(matmul=3)


def test_global_policy_set_get_clear():
    assert xrt.get_kernel_policy().preferences == {}
    xrt.set_kernel_policy(matmul="blocked")
    assert xrt.get_kernel_policy() == KernelPolicy(matmul="blocked")
    xrt.set_kernel_policy(KernelPolicy(attention="chunked"))
    assert dict(xrt.get_kernel_policy().preferences) == {"attention": "chunked"}
    xrt.set_kernel_policy("matmul=gemv,strict=true")
    assert xrt.get_kernel_policy().strict
    xrt.clear_kernel_policy()
    assert xrt.get_kernel_policy().preferences == {}
    with pytest.raises(PolicyError, match="either a KernelPolicy or keyword"):
        xrt.set_kernel_policy(KernelPolicy(), matmul="blocked")


def test_scoped_policy_layers_over_global_and_restores():
    xrt.set_kernel_policy(attention="chunked")
    with xrt.kernel_policy(matmul="blocked") as scoped:
        assert dict(scoped.preferences) == {"attention": "chunked", "matmul": "blocked"}
        with xrt.kernel_policy(matmul="gemv", strict=True):
            inner = xrt.get_kernel_policy()
            assert inner.preferences["matmul"] == "gemv" and inner.strict
        with xrt.kernel_policy(KernelPolicy(softmax="numpy")):  # an object replaces
            assert dict(xrt.get_kernel_policy().preferences) == {"softmax": "numpy"}
        assert xrt.get_kernel_policy() == scoped
    assert dict(xrt.get_kernel_policy().preferences) == {"attention": "chunked"}


def test_scoped_policy_restored_after_an_exception():
    with pytest.raises(RuntimeError), xrt.kernel_policy(matmul="blocked"):
        raise RuntimeError("boom")
    assert xrt.get_kernel_policy().preferences == {}


def test_policy_from_string():
    p = KernelPolicy.from_string(" matmul = blocked , attention=chunked,strict=yes,math_mode=bf16,sync=full_sync ")
    assert dict(p.preferences) == {"attention": "chunked", "matmul": "blocked"}
    assert p.strict and p.math_mode is MathMode.BF16 and p.sync is SyncPolicy.FULL_SYNC
    with pytest.raises(PolicyError, match="expected 'op=kernel'"):
        KernelPolicy.from_string("matmul")
    with pytest.raises(UnknownKernelError, match="Did you mean 'blocked'"):
        KernelPolicy.from_string("matmul=blockd")


def test_policy_from_environment(monkeypatch):
    monkeypatch.setenv(policy.ENV_POLICY, "matmul=blocked,deterministic=1")
    assert policy.environment_policy(reload=True) == KernelPolicy(matmul="blocked", deterministic=True)
    assert xrt.get_kernel_policy() == KernelPolicy(matmul="blocked", deterministic=True)
    xrt.set_kernel_policy(matmul="gemv")  # global beats environment
    assert xrt.get_kernel_policy().preferences["matmul"] == "gemv"
    xrt.clear_kernel_policy()  # ... and clearing returns to the environment's policy
    assert xrt.get_kernel_policy().preferences["matmul"] == "blocked"
    a = np.ones((5, 5), np.float32)
    assert xrt.default_dispatcher().plan("matmul", a, a).kernel.name == "blocked"
    monkeypatch.setenv(policy.ENV_POLICY, "matmul")
    with pytest.raises(PolicyError, match=r"\$XPURUNTIME_POLICY"):
        policy.environment_policy(reload=True)


def test_policy_from_toml_and_json_files(tmp_path, monkeypatch):
    toml = tmp_path / "policy.toml"
    toml.write_text('strict = true\nmath_mode = "tf32"\n[preferences]\nmatmul = "blocked"\n')
    assert KernelPolicy.from_file(toml) == KernelPolicy(matmul="blocked", strict=True, math_mode="tf32")
    js = tmp_path / "policy.json"
    js.write_text(json.dumps({"attention": "chunked", "deterministic": True}))
    assert KernelPolicy.from_file(js) == KernelPolicy(attention="chunked", deterministic=True)
    monkeypatch.setenv(policy.ENV_POLICY_FILE, str(js))
    assert policy.environment_policy(reload=True) == KernelPolicy(attention="chunked", deterministic=True)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("bad.toml", "matmul = ", "is malformed"),
        ("bad.json", "{not json", "is malformed"),
        ("list.json", "[1, 2]", "expected a table/object"),
        ("unknown.json", '{"matmul": "cublasLT"}', "unknown kernel 'cublasLT' for op 'matmul'"),
    ],
)
def test_bad_policy_files_give_clear_errors(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(xrt.XpuRuntimeError, match=message):
        KernelPolicy.from_file(path)


def test_missing_policy_file(tmp_path):
    with pytest.raises(PolicyError, match="cannot read policy file"):
        KernelPolicy.from_file(tmp_path / "nope.toml")


def _eight_kernel_dispatcher() -> Dispatcher:
    return Dispatcher(make_toy_registry(*({"name": f"k{i}"} for i in range(8))))


def test_eight_threads_with_different_scoped_policies_get_their_own_kernels():
    dispatcher = _eight_kernel_dispatcher()
    barrier = threading.Barrier(8)
    errors: list[str] = []

    def worker(index: int) -> None:
        x = np.random.default_rng(index).standard_normal((3, 5))
        with xrt.kernel_policy(KernelPolicy(toy=f"k{index}", validate=False)):
            barrier.wait()
            for _ in range(300):
                y = dispatcher.run("toy", (x,))
                if not np.array_equal(y, x + index):
                    errors.append(f"thread {index} ran kernel {np.unique(y - x)}")
                    return

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert dispatcher.plans.stats().misses == 8  # one plan per (signature, policy), then hits
    assert xrt.get_kernel_policy().preferences == {}  # no scope leaked into this thread


def test_asyncio_tasks_with_different_scoped_policies_get_their_own_kernels():
    dispatcher = _eight_kernel_dispatcher()
    x = np.linspace(-1, 1, 12).reshape(3, 4)

    async def task(index: int) -> bool:
        with xrt.kernel_policy(KernelPolicy(toy=f"k{index}", validate=False)):
            ok = True
            for _ in range(20):
                await asyncio.sleep(0)  # interleave with the other tasks inside the scope
                ok &= np.array_equal(dispatcher.run("toy", (x,)), x + index)
            return ok

    async def main() -> list[bool]:
        return await asyncio.gather(*(task(i) for i in range(8)))

    assert asyncio.run(main()) == [True] * 8
