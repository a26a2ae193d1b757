"""Every Python code block of the README and of the documentation pages runs on its own, as a reader would paste
it (blocks that need a CUDA device skip without one), and CI runs the README's test command."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import xpuruntime as xrt

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
CUDA_CODE = re.compile(r"""device="cuda"|\.cuda\(\)""")


def needs_gpu(code: str) -> bool:
    """Whether a block's code (comments aside) puts data on a CUDA device."""
    return bool(CUDA_CODE.search("\n".join(line.split("#")[0] for line in code.splitlines())))


def python_blocks() -> list:
    blocks = []
    for page in PAGES:
        for index, code in enumerate(re.findall(r"```py(?:thon)?\n(.*?)```", page.read_text(), re.S)):
            name = f"{page.relative_to(ROOT)}[{index}]"
            marks = [pytest.mark.gpu] if needs_gpu(code) else []
            blocks.append(pytest.param(code, id=name, marks=marks))
    return blocks


RUNNER = """
import contextlib, io, json, sys, traceback, warnings
warnings.simplefilter("ignore")
results = {}
for name, code in json.load(sys.stdin):
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, name, "exec"), {"__name__": "__main__"})  # a namespace of its own
        results[name] = None
    except BaseException:
        results[name] = traceback.format_exc()[-3000:]
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def block_results(tmp_path_factory) -> dict[str, str | None]:
    """Every block run once, in one interpreter (importing torch per block would cost seconds each), each block
    in a fresh namespace from a fresh folder: a missing import or an undefined name fails its own block."""
    has_cuda = any(d.kind == "cuda" for d in xrt.devices())
    blocks = [(p.id, p.values[0]) for p in python_blocks() if has_cuda or not needs_gpu(p.values[0])]
    package_root = str(Path(xrt.__file__).resolve().parent.parent)  # works installed or from a PYTHONPATH=src tree
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-c", RUNNER], input=json.dumps(blocks), cwd=tmp_path_factory.mktemp("blocks"),
                            env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("code", python_blocks())
def test_each_code_block_runs_on_its_own(code, request, block_results):
    name = request.node.callspec.id
    if name not in block_results:
        pytest.skip("needs a CUDA device")
    assert block_results[name] is None, block_results[name]


def test_the_readme_shows_the_tour_and_a_kernel_of_ones_own():
    code = "\n".join(re.findall(r"```python\n(.*?)```", README, re.S))
    assert "xrt.ops.matmul" in code and "register_kernel" in code and "export_chrome_trace" in code


def test_ci_runs_the_readme_test_command():
    commands = re.findall(r"```bash\n(.*?)\n```", README, re.S)
    test_command = next(c for c in commands if "pytest" in c)
    assert test_command in (ROOT / ".ci" / "run").read_text()
    assert any(c.endswith("xpuruntime demo") for c in commands)
