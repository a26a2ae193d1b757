"""`xpuruntime cache`: info, list and clear over a real tuning folder filled by autotune on the CPU, with stale
and corrupt entries beside the ones in use."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from cli_runner import run_cli, table_rows, wide_plain_output  # noqa: F401 (wide_plain_output: a fixture)

import xpuruntime as xrt
from xpuruntime import autotune
from xpuruntime.runtime import tuning_cache

pytestmark = pytest.mark.usefixtures("wide_plain_output")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache folder holding one autotune winner for a matmul (CPU), one entry written under another
    torch version, and one corrupt file."""
    monkeypatch.setenv(tuning_cache.ENV_CACHE_DIR, str(tmp_path))
    monkeypatch.setattr(tuning_cache, "_default", None)
    autotune.STORE.memory.clear()
    xrt.default_dispatcher().plans.clear()  # an earlier test's autotune plan would skip the tuning
    a, b = np.random.default_rng().random((48, 40), np.float32), np.random.default_rng().random((40, 24), np.float32)
    with xrt.kernel_policy(matmul="autotune"):
        xrt.ops.matmul(a, b)
    stale = tuning_cache.key("softmax", dtypes="float16", shape=(4096,), arch=(9, 0))
    tuning_cache.put(stale, {"kernel": "triton"})
    path = tuning_cache.default_cache().path(stale)
    entry = json.loads(path.read_text())
    key = json.loads(entry["key"])
    key["versions"]["torch"] = "0.0.1"
    entry["key"] = tuning_cache.canonical(key)
    path.write_text(json.dumps(entry))
    (tmp_path / "tuning" / "softmax" / "0123.json").write_text('{"format": 1, "key": ')
    yield tmp_path
    autotune.STORE.memory.clear()


def test_info_counts_entries_per_kind_and_flags_the_unusable_ones(capsys, cache):
    code, out, _ = run_cli(capsys, "cache", "info")
    assert code == 0 and str(cache) in out
    rows = {r[0]: r for r in table_rows(out)}
    assert rows["matmul"][1:4] == ["1", "0", "cpu"]
    assert rows["softmax"][1:4] == ["2", "2", "sm90"]
    assert rows["all"][1:3] == ["3", "2"]
    assert "entries are used under: xpuruntime" in out and "compiled C++ extension: " in out
    assert run_cli(capsys, "cache")[1] == out  # info is the default


def test_list_says_what_was_tuned_for_which_device_and_what_won(capsys, cache):
    code, out, _ = run_cli(capsys, "cache", "list")
    assert code == 0
    rows = table_rows(out)
    [matmul] = [r for r in rows if r[0] == "matmul"]
    assert matmul[1].startswith("float32[48x40] float32[40x24]") and matmul[2] == "cpu"
    assert "(of " in matmul[3] and " timed)" in matmul[3] and matmul[4] == "in use"
    states = sorted(r[4] for r in rows if r[0] == "softmax")
    assert (
        states[0].startswith("corrupt")
        and states[1] == f"stale: torch 0.0.1 -> {tuning_cache.library_version('torch')}"
    )
    assert [r[0] for r in table_rows(run_cli(capsys, "cache", "list", "--stale")[1])] == ["softmax", "softmax"]
    assert [r[0] for r in table_rows(run_cli(capsys, "cache", "list", "--kind", "matmul")[1])] == ["matmul"]


def test_clear_removes_what_it_is_asked_to_and_says_how_much(capsys, cache):
    code, out, _ = run_cli(capsys, "cache", "clear", "--stale")
    assert code == 0 and "removed 2 tuning cache entries" in out
    assert [e.kind for e in tuning_cache.entries()] == ["matmul"]
    (cache / "native" / "build-x").mkdir(parents=True)
    (cache / "native" / "xpuruntime_native_0.so").write_bytes(b"\0" * 2048)
    (cache / "native" / "build-x" / "obj.o").write_bytes(b"\0" * 10)
    assert re.search(r"compiled C\+\+ extension: [2-9]\d* file\(s\)", run_cli(capsys, "cache", "info")[1])
    code, out, _ = run_cli(capsys, "cache", "clear", "--native")
    assert code == 0 and "removed 1 tuning cache entries" in out
    assert re.search(r"removed [2-9]\d* compiled C\+\+ extension file\(s\)", out)
    assert tuning_cache.entries() == [] and not (cache / "native").exists()


def test_a_cleared_entry_is_tuned_again_in_the_same_process(capsys, cache, monkeypatch):
    calls = []
    monkeypatch.setattr(autotune, "time_candidates", lambda *a: calls.append(1) or {"numpy_blas": 1.0, "blocked": 2.0})
    a = np.random.default_rng().random((48, 40), np.float32)
    b = np.random.default_rng().random((40, 24), np.float32)
    run_cli(capsys, "cache", "clear")
    autotune.STORE.memory.clear()
    with xrt.kernel_policy(matmul="autotune"):
        xrt.default_dispatcher().plans.clear()
        xrt.ops.matmul(a, b)
    assert calls == [1]  # the removed file was not served from the in-memory layer


def test_an_empty_or_missing_folder_is_no_error(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv(tuning_cache.ENV_CACHE_DIR, str(tmp_path / "never-made"))
    code, out, _ = run_cli(capsys, "cache", "info")
    assert code == 0 and "not created yet" in out
    assert run_cli(capsys, "cache", "clear")[0] == 0 and run_cli(capsys, "cache", "list")[0] == 0
