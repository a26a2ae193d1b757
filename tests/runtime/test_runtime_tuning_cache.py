"""The on-disk tuning cache: keys, atomic writes, killed writers, corrupt/stale files, concurrent processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from xpuruntime.runtime import tuning_cache
from xpuruntime.runtime.tuning_cache import TuningCache, TuningCacheWarning

SRC = str(Path(__file__).resolve().parents[2] / "src")


def random_config(rng: np.random.Generator) -> dict:
    return {"BM": int(rng.choice([64, 128, 256])), "BN": int(rng.choice([64, 128])), "warps": int(rng.integers(1, 9)),
            "ms": float(rng.uniform(0.01, 3.0))}  # fmt: skip


def make_key(**overrides) -> str:
    fields = dict(dtypes=("bfloat16", "bfloat16"), layout="nt", shape=(4097, 1000, 3), arch=(9, 0), source="k1")
    fields.update(overrides)
    return tuning_cache.key("matmul", **fields)


def test_key_parts_bucket_and_distinguish():
    base = json.loads(make_key())
    assert base["shape"] == [8192, 1024, 4] and base["arch"] == "sm90" and base["dtypes"] == ["bfloat16"] * 2
    assert "triton" in base["versions"] and "torch" in base["versions"]
    assert make_key() == make_key(shape=(5000, 1024, 4))  # same bucket
    for change in ({"shape": (4096, 1000, 3)}, {"arch": (8, 0)}, {"source": "k2"}, {"layout": "nn"},
                   {"dtypes": "float16"}, {"math_mode": "tf32"}):  # fmt: skip
        assert make_key(**change) != make_key(), change
    assert json.loads(make_key(shape=(4097,), bucket=False))["shape"] == [4097]
    assert tuning_cache.shape_bucket((0, 1, 2, 3, 1025)) == (0, 1, 2, 4, 2048)


def test_source_hash_accepts_text_and_functions():
    def kernel(x):
        return x + 1

    assert tuning_cache.source_hash(kernel) == tuning_cache.source_hash("    def kernel(x):\n        return x + 1\n")
    assert tuning_cache.source_hash("a") != tuning_cache.source_hash("b")


def test_round_trip_persists_across_instances(tmp_path):
    rng = np.random.default_rng()
    cache = TuningCache(tmp_path)
    keys = [make_key(variant=i) for i in range(5)]
    values = [random_config(rng) for _ in keys]
    assert all(cache.get(k) is None for k in keys)
    for k, v in zip(keys, values):
        cache.put(k, v)
    fresh = TuningCache(tmp_path)  # a new process would see the same
    assert [fresh.get(k) for k in keys] == values
    got = fresh.get(keys[0])
    got["BM"] = -1  # callers get copies: mutating one never changes the cache
    assert fresh.get(keys[0]) == values[0]
    with pytest.raises(TypeError, match="JSON-serializable"):
        cache.put(keys[0], {"fn": object()})


def test_environment_variable_moves_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(tuning_cache.ENV_CACHE_DIR, str(tmp_path / "c"))
    k = make_key()
    tuning_cache.put(k, {"BM": 128})
    assert tuning_cache.get(k) == {"BM": 128}
    assert list((tmp_path / "c" / "tuning").rglob("*.json")), "entry not under $XPURUNTIME_CACHE_DIR"
    monkeypatch.setenv(tuning_cache.ENV_CACHE_DIR, str(tmp_path / "d"))
    assert tuning_cache.get(k) is None


def test_corrupt_file_is_ignored_with_one_warning_and_then_replaced(tmp_path):
    k = make_key()
    TuningCache(tmp_path).put(k, {"BM": 64})
    path = TuningCache(tmp_path).path(k)
    path.write_bytes(os.urandom(37) + b"{")
    cache = TuningCache(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cache.get(k) is None
        assert cache.get(k) is None
        assert cache.get_or_tune(k, lambda: {"BM": 256}) == {"BM": 256}
    assert [w.category for w in caught] == [TuningCacheWarning]
    assert "corrupt" in str(caught[0].message) and str(path) in str(caught[0].message)
    assert TuningCache(tmp_path).get(k) == {"BM": 256}


@pytest.mark.parametrize(
    "entry",
    [
        {"format": 0, "value": {"BM": 1}},
        {"format": 1, "key": "another key", "value": {"BM": 1}},
        {"format": 1, "value": [1, 2]},
        [1, 2, 3],
    ],
)
def test_stale_or_malformed_entries_are_ignored_with_one_warning(tmp_path, entry):
    k = make_key()
    cache = TuningCache(tmp_path)
    path = cache.path(k)
    path.parent.mkdir(parents=True)
    if isinstance(entry, dict) and "key" not in entry:
        entry = {**entry, "key": k}
    path.write_text(json.dumps(entry))
    with pytest.warns(TuningCacheWarning) as caught:
        assert cache.get(k) is None
        assert cache.get(k) is None
    assert len(caught) == 1


WRITER = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, {src!r})
    from xpuruntime.runtime import tuning_cache
    cache = tuning_cache.TuningCache({dir!r})
    key = {key!r}
    mode = sys.argv[1]
    if mode == "hang-before-rename":
        real_replace = os.replace
        def stuck(*args, **kwargs):
            print("written", flush=True)
            time.sleep(600)
        os.replace = stuck
        cache.put(key, {{"BM": 999, "pad": "x" * 100000}})
    else:  # rewrite forever with values of changing size until killed
        i = 0
        print("written", flush=True)
        while True:
            i += 1
            cache.put(key, {{"i": i, "pad": "y" * (i % 5000) * 37}})
    """
)


def spawn_writer(tmp_path: Path, key: str, mode: str) -> subprocess.Popen:
    script = tmp_path / "writer.py"
    script.write_text(WRITER.format(src=SRC, dir=str(tmp_path / "cache"), key=key))
    proc = subprocess.Popen([sys.executable, str(script), mode], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "written"
    return proc


def test_writer_killed_before_rename_leaves_the_old_entry(tmp_path):
    k = make_key()
    TuningCache(tmp_path / "cache").put(k, {"BM": 64})
    proc = spawn_writer(tmp_path, k, "hang-before-rename")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a leftover temporary file must not even warn
        assert TuningCache(tmp_path / "cache").get(k) == {"BM": 64}
    assert list((tmp_path / "cache").rglob("*.tmp")), "the killed writer's temporary file should be left behind"


def test_writer_killed_at_random_moments_never_leaves_a_torn_entry(tmp_path):
    rng = np.random.default_rng()
    k = make_key()
    for _ in range(3):
        proc = spawn_writer(tmp_path, k, "loop")
        time.sleep(float(rng.uniform(0.05, 0.3)))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            value = TuningCache(tmp_path / "cache").get(k)
        assert value is not None and value["pad"] == "y" * (value["i"] % 5000) * 37


TUNER = textwrap.dedent(
    """
    import json, os, random, sys, time, warnings
    sys.path.insert(0, {src!r})
    warnings.simplefilter("error")
    from xpuruntime.runtime import tuning_cache
    cache = tuning_cache.TuningCache({dir!r})
    results = {{}}
    for n in range(1, 41):
        key = tuning_cache.key("softmax", dtypes="float32", shape=(n * 1000,), arch=(9, 0), source="s", bucket=False)
        def tune(n=n):
            time.sleep(random.uniform(0, 0.002))
            return {{"block": 1 << (n % 11), "by": os.getpid()}}
        results[key] = cache.get_or_tune(key, tune)
    print(json.dumps(results))
    """
)


def test_two_processes_tuning_at_once(tmp_path):
    script = tmp_path / "tuner.py"
    script.write_text(TUNER.format(src=SRC, dir=str(tmp_path / "cache")))
    procs = [subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]  # fmt: skip
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outputs]
    seen = [json.loads(out) for out, _ in outputs]
    pids = {p.pid for p in procs}
    cache = TuningCache(tmp_path / "cache")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for key, value in seen[0].items():
            stored = cache.get(key)
            assert stored is not None and stored["by"] in pids
            assert stored["block"] == value["block"] == seen[1][key]["block"]
    assert len(seen[0]) == 40


def test_an_unwritable_cache_folder_warns_once_and_keeps_results_in_memory(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should be")
    cache = TuningCache(blocker / "tuning")
    keys = [tuning_cache.key("matmul", dtypes="float32", shape=(n, 64)) for n in (100, 300, 900)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        values = [cache.get_or_tune(k, lambda n=n: {"block": n}) for n, k in enumerate(keys)]
        assert [cache.get(k) for k in keys] == values == [{"block": n} for n in range(3)]
    writes = [w for w in caught if "cannot be written" in str(w.message)]
    assert len(writes) == 1 and writes[0].category is TuningCacheWarning


def test_a_corrupt_file_warns_once_per_process_across_cache_instances(tmp_path, monkeypatch):
    k = tuning_cache.key("softmax", dtypes="float16", shape=(4096,))
    monkeypatch.setenv(tuning_cache.ENV_CACHE_DIR, str(tmp_path / "a"))
    monkeypatch.setattr(tuning_cache, "_default", None)
    path = tuning_cache.default_cache().path(k)
    path.parent.mkdir(parents=True)
    path.write_bytes(b'{"format": 1, "key": ')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for folder in ("a", "b", "a", "b", "a"):  # default_cache() follows the variable with new instances
            monkeypatch.setenv(tuning_cache.ENV_CACHE_DIR, str(tmp_path / folder))
            assert tuning_cache.get(k) is None
        assert TuningCache(tmp_path / "a" / "tuning").get(k) is None
    assert [w.category for w in caught] == [TuningCacheWarning], [str(w.message) for w in caught]
