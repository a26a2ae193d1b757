"""The C++ extension as a user meets it (issue 26 item 2, issue 27 item 6): a library is loaded only if it
was published complete (stamped with its size and SHA-256, written under a temporary name, fsynced,
renamed) and its stamp checks out, and what is loaded is exactly the checked bytes; anything else (a
truncated copy, which dlopen turned into a bus error, garbage, a link, a FIFO) is removed and rebuilt with
one warning. The first build says so on stderr with its expected duration, a failed build is a warning
carrying the compiler's message, and `xpuruntime info` shows the extension's status.

Builds here use a fake compiler (fails at once) or a fake build that copies an already built library, so
the tests take seconds, not the minutes of a real compile; the real build is shared with the other
extension tests. Everything that loads a library runs in a child process with a timeout and a memory
limit: a crash fails the test."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from guarded import SRC, assert_clean, describe, run_guarded

from xpuruntime.cli import main
from xpuruntime.runtime import extension
from xpuruntime.runtime.cache_folder import CacheFolder

pytest.importorskip("torch")
needs_compiler = pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "c++")) is None, reason="no C++ compiler: the extension cannot build"
)
CHILD_MEMORY = 6 << 30  # PyTorch, and the build's own child process, live within it


@pytest.fixture
def fake_compiler(tmp_path: Path) -> str:
    """A C++ 'compiler' that answers version queries and fails every compile with a message."""
    path = tmp_path / "bin" / "c++"
    path.parent.mkdir()
    path.write_text(
        "#!/bin/sh\n"
        'case "$*" in *-dump*|*--version*|-v) echo "13.2.0"; exit 0;; esac\n'
        'echo "hot_path.cpp:1:1: error: simulated compiler failure" >&2\n'
        "exit 1\n"
    )
    path.chmod(0o755)
    return str(path)


def an_elf_library() -> bytes:
    """The bytes of a real shared library (NumPy's core), truncated like the issue's reproducer."""
    import numpy._core._multiarray_umath as core

    return Path(core.__file__).read_bytes()


FAILING_BUILDS = textwrap.dedent(
    """
    import json, sys, warnings
    warnings.simplefilter("always")
    from xpuruntime.runtime import extension
    library = extension._library()
    for phase in ("fresh", "truncated"):
        print(f"-- {phase}", file=sys.stderr, flush=True)
        extension._state = extension._State()
        if phase == "truncated":
            with open(sys.argv[1], "rb") as f:
                library.write_bytes(f.read()[:100_000])
        module = extension.load()
        print(json.dumps({"loaded": module is not None, "status": extension.status(), "left": library.exists()}))
    """
)


def test_a_failed_build_warns_with_the_compiler_message_and_nothing_broken_is_loaded(fake_compiler, tmp_path):
    """A fresh cache folder, then one holding a truncated library (the issue's `head -c 100000` of a built
    library, which dlopen turned into a bus error): each build says so, fails with the compiler's message,
    and nothing is loaded."""
    source = tmp_path / "elf.so"
    source.write_bytes(an_elf_library())
    done = run_guarded(
        FAILING_BUILDS, args=(str(source),), timeout=180, memory=CHILD_MEMORY,
        env={"XPURUNTIME_CACHE_DIR": str(tmp_path / "cache"), "CXX": fake_compiler, extension.ENV_SWITCH: "1"},
    )  # fmt: skip
    assert_clean(done)  # before the publish protocol: a bus error (exit 135 / SIGBUS) for the truncated one
    failed = {"loaded": False, "status": "failed: hot_path.cpp:1:1: error: simulated compiler failure", "left": False}
    assert [json.loads(line) for line in done.stdout.strip().splitlines()[-2:]] == [failed, failed]
    fresh, truncated = done.stderr.split("-- truncated")
    for phase, err in (("fresh", fresh), ("truncated", truncated)):
        assert err.count("is not a complete build") == (phase == "truncated"), err
        assert err.count("building the C++ extension") == 1 and f"about {extension.BUILD_TIME}" in err, err
        assert "NativeExtensionWarning: xpuruntime: the C++ extension failed to build" in err, err
        assert "The compiler said:\nhot_path.cpp:1:1: error: simulated compiler failure" in err, err


def _info(monkeypatch, cache: Path) -> str:
    monkeypatch.setenv("XPURUNTIME_CACHE_DIR", str(cache))
    monkeypatch.setenv("COLUMNS", "1000")  # one line per table row
    monkeypatch.setattr(extension, "_state", extension._State())
    out = io.StringIO()
    with contextlib.redirect_stdout(out), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["info"]) == 0
    line = next(line for line in out.getvalue().splitlines() if line.startswith("C++ extension:"))
    return line


def test_info_shows_the_extension_status(monkeypatch, tmp_path):
    monkeypatch.delenv(extension.ENV_SWITCH, raising=False)
    cache = tmp_path / "cache"
    assert f"not built yet: built on first use (about {extension.BUILD_TIME}, once)" in _info(monkeypatch, cache)
    library = extension._library()
    folder, parts = CacheFolder(cache), (extension.FOLDER, library.name)
    extension._record_failure(folder, parts, "x.cpp:3:1: error: no such header")
    assert "failed to build last time (x.cpp:3:1: error: no such header); tried again on first use" in _info(
        monkeypatch, cache
    )
    folder.write(parts, extension._stamped(b"\x7fELF pretend library"))
    assert f"built ({library}); loaded on first use" in _info(monkeypatch, cache)
    folder.write(parts, b"\x7fELF pretend library")  # no stamp
    assert "is not a complete build (20 bytes, too short to hold a stamp); rebuilt on first use" in _info(
        monkeypatch, cache
    )
    monkeypatch.setenv(extension.ENV_SWITCH, "0")
    assert "disabled by XPURUNTIME_NATIVE=0" in _info(monkeypatch, cache)
    monkeypatch.delenv(extension.ENV_SWITCH)
    state = extension._State()
    state.building, state.build_started = True, time.time() - 5
    monkeypatch.setattr(extension, "_state", state)
    assert extension.status().startswith("building (for 5 s")


def test_the_stamp_catches_every_truncation_and_flipped_byte():
    library = np.random.default_rng(0).bytes(4096)
    stamped = extension._stamped(library)
    assert extension._unstamped(stamped) == (library, None)
    for size in (0, 1, 100, 4096, len(stamped) - 1):
        assert extension._unstamped(stamped[:size])[1] is not None, size
    for index in (0, 2048, 4095, len(library) + 3, len(stamped) - 1):
        flipped = bytearray(stamped)
        flipped[index] ^= 0x40
        assert extension._unstamped(bytes(flipped))[1] is not None, index


# -- with a real build ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def built_library() -> bytes:
    """The real library (built once for every extension test, in the default cache folder)."""
    module = extension.load()
    if module is None:
        pytest.skip(f"the extension did not build here: {extension.status()}")
    data = CacheFolder(extension._library().parent.parent).read(
        (extension.FOLDER, extension._library().name), "library", limit=None
    )
    library, problem = extension._unstamped(data)
    assert problem is None and module.__file__ == str(extension._library())
    return library


LOAD_COPY = textwrap.dedent(
    """
    import json, sys
    from xpuruntime.runtime import extension
    good = sys.argv[1]
    # a "build" that copies the real library into the build folder: the real publish, check and load follow
    extension._BUILD = "import shutil, sys; shutil.copy(%r, sys.argv[2] + '/' + sys.argv[1] + '.so')" % good
    module = extension.load()
    from xpuruntime.arguments import python_plan_key
    call = ("op", 1, (2, 0.5), (None, 3.0), None)
    ok = module is not None and module.plan_key(*call) == python_plan_key(*call)
    print(json.dumps({"loaded": module is not None, "works": ok, "status": extension.status()}))
    """
)


@needs_compiler
def test_a_published_library_is_loaded_from_its_checked_bytes_without_a_build(built_library, tmp_path):
    cache = tmp_path / "cache"
    CacheFolder(cache).write((extension.FOLDER, extension._library().name), extension._stamped(built_library))
    env = {"XPURUNTIME_CACHE_DIR": str(cache), extension.ENV_SWITCH: "1"}
    done = run_guarded(LOAD_COPY, args=(str(tmp_path / "no-build.so"),), env=env, memory=CHILD_MEMORY, timeout=180)
    assert_clean(done)
    assert json.loads(done.stdout.splitlines()[-1]) == {"loaded": True, "works": True, "status": "built and loaded"}
    assert "building" not in done.stderr and "Warning" not in done.stderr, done.stderr


CORRUPTER = textwrap.dedent(
    """
    import os, random, sys, time
    folder, name = sys.argv[1], sys.argv[2]
    path = os.path.join(folder, name)
    rng = random.Random(0)
    outside = os.path.join(os.path.dirname(folder), "outside.so")
    open(outside, "wb").write(b"\\x7fELF outside the cache")
    print("ready", flush=True)
    while True:
        action = rng.randrange(8)
        try:
            if action == 0 and os.path.isfile(path):  # truncate in place
                with open(path, "r+b") as f:
                    f.truncate(rng.randrange(1, 400_000))
            elif action == 1 and os.path.isfile(path):  # flip bytes in place
                with open(path, "r+b") as f:
                    f.seek(rng.randrange(0, 300_000))
                    f.write(os.urandom(64))
            elif action == 2:
                os.replace(os.path.join(folder, "junk"), path) if os.path.exists(os.path.join(folder, "junk")) else open(
                    os.path.join(folder, "junk"), "wb").write(os.urandom(5000))
            elif action == 3:
                os.unlink(path)
            elif action == 4:
                os.unlink(path); os.symlink("/dev/zero" if rng.random() < 0.5 else outside, path)
            elif action == 5:
                os.unlink(path); os.mkfifo(path)
            elif action == 6:
                os.unlink(path); os.mkdir(path)
            elif action == 7 and os.path.isdir(path) and not os.path.islink(path):
                os.rmdir(path)
        except OSError:
            pass
        time.sleep(rng.random() * 0.01)
    """
)


def _start_corrupter(folder: Path, name: str) -> subprocess.Popen:
    folder.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", CORRUPTER, str(folder), name], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_the_publish_protocol_never_hands_over_corrupt_bytes_while_another_process_corrupts_them(tmp_path):
    """Hundreds of check-or-publish rounds against a process that truncates, flips, replaces, links and
    deletes the published file: every library handed to the loader is exactly the good one."""
    good = b"\x7fELF" + np.random.default_rng(1).bytes(300_000)  # never loaded here: any bytes serve
    folder = CacheFolder(tmp_path / "cache")
    name = extension._library().name
    parts = (extension.FOLDER, name)
    corrupter = _start_corrupter(tmp_path / "cache" / extension.FOLDER, name)
    handed, published = 0, 0
    try:
        deadline = time.time() + 30  # a busy machine: rounds, not seconds, make the test
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # each rebuild warns once; the point here is what gets loaded
            while time.time() < deadline and min(handed, published) < 30:
                checked = extension._checked_library(folder, parts)
                if checked is None:
                    with contextlib.suppress(OSError):  # the corrupter may hold the name as a folder
                        folder.write(parts, extension._stamped(good))
                        published += 1
                else:
                    assert checked == good
                    handed += 1
    finally:
        corrupter.kill()
        corrupter.wait()
    assert handed >= 30 and published >= 30, (handed, published)
    assert (tmp_path / "cache" / "outside.so").read_bytes() == b"\x7fELF outside the cache"


@needs_compiler
def test_building_and_loading_while_another_process_corrupts_the_cache_never_crashes(built_library, tmp_path):
    good = tmp_path / "good.so"
    good.write_bytes(built_library)
    cache = tmp_path / "cache"
    env = {"XPURUNTIME_CACHE_DIR": str(cache), extension.ENV_SWITCH: "1", "PYTHONPATH": SRC}
    corrupter = _start_corrupter(cache / extension.FOLDER, extension._library().name)
    try:  # from an empty cache: it builds (a copy of the real library), publishes, checks and loads
        done = run_guarded(LOAD_COPY, args=(str(good),), env=env, memory=CHILD_MEMORY, timeout=180)
    finally:
        corrupter.kill()
        corrupter.wait()
    assert done.returncode == 0, describe(done)  # never a crash, whatever the corrupter did
    outcome = json.loads(done.stdout.splitlines()[-1])  # loaded and working, or refused with a reason
    assert outcome["works"] or (not outcome["loaded"] and outcome["status"].startswith("failed")), outcome
