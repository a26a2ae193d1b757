"""The on-disk cache cannot be turned against its user (issue 26, items 3, 5 and 9): no link inside the cache
folder leads a read, a write or a delete outside it; an entry that is a FIFO, a device, too large or nested
deeper than the JSON parser goes is ignored with a warning; `clear` deletes regular entry files only."""

from __future__ import annotations

import json
import os
import textwrap
import warnings
from pathlib import Path

import pytest
from guarded import assert_clean, run_guarded

from xpuruntime.errors import FileError
from xpuruntime.runtime import tuning_cache
from xpuruntime.runtime.cache_folder import CacheFolder
from xpuruntime.runtime.tuning_cache import TuningCache, TuningCacheWarning

KEY = tuning_cache.key("matmul", dtypes="float32", shape=(64, 64))


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(tuning_cache, "_warned", set())  # each test sees its own once-per-file warnings


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder outside the cache holding a file that must survive everything the cache does."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "victim.json").write_text("precious")
    return folder


def test_clear_does_not_delete_through_a_linked_op_folder(tmp_path, outside):
    cache = TuningCache(tmp_path / "cache")
    cache.put(KEY, {"BM": 64})
    (tmp_path / "cache" / "softmax").symlink_to(outside, target_is_directory=True)
    (tmp_path / "cache" / "matmul" / "link.json").symlink_to(outside / "victim.json")
    cache.clear()
    assert (outside / "victim.json").read_text() == "precious"
    assert [p.name for p in (tmp_path / "cache" / "matmul").iterdir()] == ["link.json"]  # links are left alone
    assert cache.get(KEY) is None


def test_put_does_not_write_through_a_linked_op_folder(tmp_path, outside):
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "matmul").symlink_to(outside, target_is_directory=True)
    cache = TuningCache(tmp_path / "cache")
    with pytest.warns(TuningCacheWarning, match="link"):
        cache.put(KEY, {"BM": 128})
    assert sorted(p.name for p in outside.iterdir()) == ["victim.json"]  # nothing written outside
    assert cache.get(KEY) == {"BM": 128}  # kept in memory


def test_put_over_a_linked_entry_replaces_the_link_not_its_target(tmp_path, outside):
    cache = TuningCache(tmp_path / "cache")
    entry = cache.path(KEY)
    entry.parent.mkdir(parents=True)
    entry.symlink_to(outside / "victim.json")
    cache.put(KEY, {"BM": 32})
    assert (outside / "victim.json").read_text() == "precious"
    assert not entry.is_symlink() and json.loads(entry.read_text())["value"] == {"BM": 32}


def test_get_does_not_read_through_links_inside_the_cache(tmp_path, outside):
    elsewhere = TuningCache(outside / "cache")
    elsewhere.put(KEY, {"BM": 256})  # a valid entry, outside the cache
    cache = TuningCache(tmp_path / "cache")
    entry = cache.path(KEY)
    entry.parent.mkdir(parents=True)
    entry.symlink_to(elsewhere.path(KEY))
    with pytest.warns(TuningCacheWarning, match="symbolic link"):
        assert cache.get(KEY) is None


def test_the_default_cache_follows_a_linked_root_but_no_link_below_it(tmp_path, outside, monkeypatch):
    real_root = tmp_path / "real-root"
    real_root.mkdir()
    (tmp_path / "root").symlink_to(real_root, target_is_directory=True)  # users move caches: allowed
    monkeypatch.setenv(tuning_cache.ENV_CACHE_DIR, str(tmp_path / "root"))
    tuning_cache.put(KEY, {"BM": 16})
    assert list(real_root.glob("tuning/matmul/*.json"))
    (real_root / "tuning").rename(tmp_path / "moved")
    (real_root / "tuning").symlink_to(outside, target_is_directory=True)  # a link inside the root: refused
    with pytest.warns(TuningCacheWarning):
        TuningCache().put(KEY, {"BM": 8})
    assert sorted(p.name for p in outside.iterdir()) == ["victim.json"]


def test_a_cache_folder_refuses_names_that_are_not_plain(tmp_path):
    folder = CacheFolder(tmp_path)
    for name in ("..", ".", "", "a/b", "x\0y"):
        with pytest.raises(FileError, match="not a plain name"):
            folder.write(("ops", name), b"x")


def test_an_entry_nested_deeper_than_the_parser_goes_is_corrupt(tmp_path):
    cache = TuningCache(tmp_path)
    entry = cache.path(KEY)
    entry.parent.mkdir(parents=True)
    entry.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.warns(TuningCacheWarning, match="is corrupt"):
        assert cache.get(KEY) is None
    cache.put(KEY, {"BM": 64})  # and the next put replaces it
    assert TuningCache(tmp_path).get(KEY) == {"BM": 64}


def test_an_oversized_entry_is_refused_unread(tmp_path):
    cache = TuningCache(tmp_path)
    entry = cache.path(KEY)
    entry.parent.mkdir(parents=True)
    with open(entry, "wb") as file:
        file.truncate(tuning_cache.MAX_ENTRY_BYTES + 1)  # sparse
    with pytest.warns(TuningCacheWarning, match="at most"):
        assert cache.get(KEY) is None


SPECIAL_ENTRIES = textwrap.dedent(
    """
    import os, sys, warnings
    from xpuruntime.runtime.tuning_cache import TuningCache, key
    warnings.simplefilter("ignore")
    root = sys.argv[1]
    k = key("matmul", dtypes="float32", shape=(64, 64))
    for kind in ("fifo", "device", "folder"):
        cache = TuningCache(os.path.join(root, kind))
        entry = cache.path(k)
        entry.parent.mkdir(parents=True)
        if kind == "fifo":
            os.mkfifo(entry)
        elif kind == "device":
            os.symlink("/dev/zero", entry)
        else:
            entry.mkdir()
        assert cache.get(k) is None, kind
        cache.put(k, {"BM": 64})  # a FIFO or link entry is replaced; a folder stays, the value is in memory
        assert TuningCache(os.path.join(root, kind)).get(k) in (None, {"BM": 64}), kind
        cache.clear()
    print("done")
    """
)


def test_special_files_as_entries_neither_block_nor_exhaust_memory(tmp_path):
    done = run_guarded(SPECIAL_ENTRIES, args=(str(tmp_path),), timeout=30, memory=1 << 30)
    assert_clean(done)
    assert done.stdout.strip() == "done"


def test_clear_keeps_links_and_special_files_and_leaves_no_temporaries(tmp_path):
    cache = TuningCache(tmp_path)
    cache.put(KEY, {"BM": 64})
    folder = cache.path(KEY).parent
    (folder / ".left.abc.tmp").write_text("a writer killed midway")
    os.mkfifo(folder / "pipe.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cache.clear()
    assert sorted(p.name for p in folder.iterdir()) == ["pipe.json"]
