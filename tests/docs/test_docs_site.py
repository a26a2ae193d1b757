"""The documentation site builds with warnings as errors (when the docs extra is installed), its API reference
shows every public name, and its table of environment variables names every variable the code reads."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "xpuruntime"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                            capture_output=True, text=True, timeout=600, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "WARNING" not in result.stderr, result.stderr[-3000:]
    return out


def test_the_site_builds_strictly_with_every_page(site):
    pages = {p.relative_to(ROOT / "docs").with_suffix("") for p in (ROOT / "docs").rglob("*.md")}
    for page in pages:
        built = site / ("index.html" if page.name == "index" else page / "index.html")
        assert built.is_file(), page


@pytest.mark.parametrize("package", ["xpuruntime", "xpuruntime.ops", "xpuruntime.onnx", "xpuruntime.pytorch",
                                     "xpuruntime.bench"])  # fmt: skip
def test_the_reference_shows_every_public_name(site, package):
    if package == "xpuruntime.pytorch":
        pytest.importorskip("torch")
    html = "".join(p.read_text() for p in (site / "reference").rglob("index.html"))
    ids = set(re.findall(r'id="(xpuruntime[\w.]*)"', html))
    names = {name.rsplit(".", 1)[-1] for name in ids}
    exported = [n for n in importlib.import_module(package).__all__ if n not in ("ops",)]
    missing = [n for n in exported if n not in names]
    assert not missing, f"{package}: not in the API reference: {missing}"


def test_every_environment_variable_the_code_reads_is_in_the_table():
    code = "\n".join(p.read_text() for p in SRC.rglob("*.py"))
    read = set(re.findall(r"""["'](XPURUNTIME_[A-Z0-9_]+)["']""", code))
    read |= set(re.findall(r"""environ(?:\.get)?\(?\[?["']([A-Z][A-Z0-9_]+)["']""", code))
    table = (ROOT / "docs" / "reference" / "environment.md").read_text()
    documented = set(re.findall(r"^\| `([A-Z][A-Z0-9_]+)` \|", table, re.M))
    assert {"XPURUNTIME_POLICY", "XPURUNTIME_CACHE_DIR", "TRITON_INTERPRET"} <= read
    assert read - {"COLUMNS"} <= documented, f"undocumented: {sorted(read - {'COLUMNS'} - documented)}"
    assert documented <= read, f"documented but never read: {sorted(documented - read)}"
