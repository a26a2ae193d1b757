"""Every file xpuruntime reads goes through one checked opener (`xpuruntime.files`): regular files only (or
a link to one), never a FIFO (which would block forever), a device (/dev/zero would be read until memory runs
out) or a folder; size caps for policy and cache files; TOML policy files by suffix in any case (issue 26,
items 5 and 12). The readers are driven in a child process with a timeout and a memory limit, so a
regression fails here instead of hanging CI."""

from __future__ import annotations

import ast
import json
import os
import socket
import textwrap
from pathlib import Path

import pytest
from guarded import assert_clean, run_guarded

import xpuruntime as xrt
from xpuruntime import files, policy
from xpuruntime.errors import FileError, PolicyError, XpuRuntimeError


@pytest.fixture
def specials(tmp_path: Path) -> dict[str, Path]:
    """A FIFO, a folder, a socket, /dev/zero, a link to each, and a link to a regular file."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    folder = tmp_path / "folder.json"
    folder.mkdir()
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock"))
    regular = tmp_path / "regular.json"
    regular.write_text('{"matmul": "blocked"}')
    found = {"fifo": fifo, "folder": folder, "socket": tmp_path / "sock", "device": Path("/dev/zero")}
    for name, target in list(found.items()):
        link = tmp_path / f"link-to-{name}"
        link.symlink_to(target)
        found[f"link to {name}"] = link
    found["link to regular"] = tmp_path / "link-to-regular.json"
    found["link to regular"].symlink_to(regular)
    yield found
    sock.close()


KINDS = {"fifo": "FIFO", "folder": "a folder", "socket": "a socket", "device": "a character device"}


def test_the_opener_refuses_every_special_file_by_what_it_is(specials):
    for name, path in specials.items():
        if name == "link to regular":
            assert files.read_bytes(path, "policy file") == b'{"matmul": "blocked"}'
            continue
        with pytest.raises(FileError, match=KINDS[name.removeprefix("link to ")]) as caught:
            files.read_bytes(path, "policy file")
        assert isinstance(caught.value, OSError) and isinstance(caught.value, XpuRuntimeError)
        assert str(path) in str(caught.value)


def test_without_follow_a_link_is_refused_and_limits_refuse_large_files(specials, tmp_path):
    with pytest.raises(FileError, match="symbolic link"):
        files.read_bytes(specials["link to regular"], "cache file", follow=False)
    big = tmp_path / "big"
    big.write_bytes(b"x" * 101)
    with pytest.raises(FileError, match="is 101 bytes; a cache file is at most 100 bytes"):
        files.read_bytes(big, "cache file", limit=100)
    assert files.read_bytes(big, "cache file", limit=101) == b"x" * 101
    with pytest.raises(FileError, match="No such file") as caught:
        files.read_bytes(tmp_path / "missing", "cache file")
    assert caught.value.errno == 2  # ENOENT: callers tell "missing" from "refused"


def test_policy_files_name_the_special_file(specials):
    for name, path in specials.items():
        if name == "link to regular":
            assert KernelPolicyOf(path).preferences == {"matmul": "blocked"}
            continue
        with pytest.raises(PolicyError, match=f"policy file '{path}'.*{KINDS[name.removeprefix('link to ')]}"):
            xrt.KernelPolicy.from_file(path)


def KernelPolicyOf(path: Path) -> xrt.KernelPolicy:
    return xrt.KernelPolicy.from_file(path)


def test_policy_files_over_the_cap_are_refused_unread(tmp_path):
    path = tmp_path / "huge.json"
    with open(path, "wb") as f:
        f.truncate(policy.MAX_POLICY_FILE_BYTES + 1)  # sparse: no disk used
    with pytest.raises(PolicyError, match=f"at most {policy.MAX_POLICY_FILE_BYTES} bytes"):
        xrt.KernelPolicy.from_file(path)


@pytest.mark.parametrize("suffix", [".toml", ".TOML", ".Toml"])
def test_toml_policy_files_are_read_as_toml_whatever_the_suffix_case(tmp_path, suffix):
    path = tmp_path / f"policy{suffix}"
    path.write_text('matmul = "blocked"\nstrict = true\n')
    loaded = xrt.KernelPolicy.from_file(path)
    assert loaded.preferences == {"matmul": "blocked"} and loaded.strict


# Every reader of a file the user names, each given every special file, in one child process that must
# finish within the timeout and its memory limit.
READERS = textwrap.dedent(
    """
    import json, os, subprocess, sys, warnings
    import xpuruntime as xrt
    from xpuruntime.cli import main
    from xpuruntime.errors import XpuRuntimeError
    from xpuruntime.runtime.tuning_cache import TuningCache, key
    warnings.simplefilter("ignore")
    paths, scratch = json.loads(sys.argv[1]), sys.argv[2]
    results = {}
    for name, path in paths.items():
        got = {}
        try:
            xrt.KernelPolicy.from_file(path)
            got["policy"] = "read"
        except XpuRuntimeError as exc:
            got["policy"] = type(exc).__name__ + ": " + str(exc)
        os.environ["XPURUNTIME_POLICY_FILE"] = path
        from xpuruntime import policy
        policy.forget_environment()
        try:
            xrt.ops.sum(__import__("numpy").ones(3))
            got["env"] = "read"
        except XpuRuntimeError as exc:
            got["env"] = type(exc).__name__ + ": " + str(exc)
        del os.environ["XPURUNTIME_POLICY_FILE"]
        policy.forget_environment()
        got["run --inputs"] = main(["run", "--inputs", path, "--iterations", "0"])
        got["run model"] = main(["run", path, "--iterations", "0"])
        cache = TuningCache(os.path.join(scratch, "cache-" + name.replace(" ", "-")))
        k = key("matmul", dtypes="float32", shape=(8, 8))
        entry = cache.path(k)
        entry.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(path, entry)
        got["tuning cache"] = cache.get(k)
        results[name] = got
    print(json.dumps(results))
    """
)


def test_no_reader_blocks_or_runs_out_of_memory_on_a_special_file(specials, tmp_path):
    paths = json.dumps({k: str(v) for k, v in specials.items()})
    done = run_guarded(READERS, args=(paths, str(tmp_path / "scratch")), timeout=60)
    assert_clean(done)
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for name, got in results.items():
        if name == "link to regular":
            assert got["policy"] == got["env"] == "read"
            continue
        kind = KINDS[name.removeprefix("link to ")]
        assert got["policy"].startswith("PolicyError") and kind in got["policy"], got
        assert got["env"].startswith("PolicyError") and kind in got["env"], got
        assert got["run --inputs"] == 2 and got["run model"] == 2, got  # a one-line error, exit code 2
        assert got["tuning cache"] is None, got  # a link inside the cache: ignored with a warning
    assert "Traceback" not in done.stderr
    assert "not a regular file" in done.stderr  # the CLI said why


# -- the class, not the reproducers: no module reads a file around the checked opener --------------------------

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "xpuruntime"
READERS_BY_ATTRIBUTE = {"read_bytes", "read_text", "load_model"}  # Path.read_*, onnx.load_model
READING_MODULES = {"np": {"load", "fromfile"}, "numpy": {"load", "fromfile"}, "onnx": {"load"}, "tomllib": {"load"}}
# Known readers outside the opener, each with its owner; a fix removes its line (new readers are refused).
KNOWN_GAPS = {
    "pytorch/profiling.py": "helper torch-front: reads back the trace PyTorch's profiler just wrote",
    "bench/training.py": "reads the JSON results its own child processes wrote",
}


def _direct_reads(path: Path) -> list[str]:
    """Calls in `path` that open a file for reading without `xpuruntime.files`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id == "open":
            mode = (
                node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "mode"), None)
            )
            text = mode.value if isinstance(mode, ast.Constant) and isinstance(mode.value, str) else "r"
            if not set(text) & set("wax"):
                found.append(f"line {node.lineno}: open(...) for reading")
        elif isinstance(func, ast.Attribute) and func.attr in READERS_BY_ATTRIBUTE and not node.args:
            found.append(f"line {node.lineno}: .{func.attr}()")
        elif (
            isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
            and func.attr in READING_MODULES.get(func.value.id, ())
            and not (node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == "file")
        ):  # fmt: skip
            found.append(f"line {node.lineno}: {func.value.id}.{func.attr}(...)")
    return found


def test_every_file_the_library_reads_goes_through_the_checked_opener():
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "files.py" and path.parent == PACKAGE:
            continue
        reads = _direct_reads(path)
        if reads:
            offenders[str(path.relative_to(PACKAGE))] = reads
    new = {name: reads for name, reads in offenders.items() if name not in KNOWN_GAPS}
    assert not new, f"read these through xpuruntime.files (read_bytes / open_binary / open_fd): {new}"
