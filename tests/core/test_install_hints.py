"""Install hints: from a source checkout they reinstall the checkout with the extra that brings what is missing,
elsewhere they name that extra's packages from xpuruntime's own metadata; every argument in double quotes, which
every shell takes."""

from __future__ import annotations

import re
import shlex

import pytest

from xpuruntime import install


def test_a_checkout_hint_reinstalls_the_checkout_with_the_extra():
    root = install.checkout()
    if root is None:
        pytest.skip("xpuruntime runs from an installed copy here")
    assert install.pip_hint("bench") == f'pip install -e "{root}[bench]"'
    assert shlex.split(install.pip_hint("torch"))[-1] == f"{root}[torch]"


def test_an_installed_copy_names_the_extras_packages(monkeypatch):
    monkeypatch.setattr(install, "checkout", lambda: None)
    assert install.extra_requirements("torch") == ["torch>=2.4", "triton>=3.0", "ninja>=1.11"]
    assert install.pip_hint("torch") == 'pip install "torch>=2.4" "triton>=3.0" "ninja>=1.11"'
    assert install.pip_hint("cuda").startswith('pip install "nvmath-python[cu13]>=1.0"')
    assert install.pip_hint("no-such-extra") == 'pip install "xpuruntime[no-such-extra]"'


@pytest.mark.parametrize("extra", ["torch", "cuda", "cuda12", "bench", "docs", "test"])
def test_every_extra_is_declared_and_every_hint_is_quoted(monkeypatch, extra):
    assert install.extra_requirements(extra), f"extra {extra!r} is not in xpuruntime's metadata"
    for hint in (
        install.pip_hint(extra),
        (monkeypatch.setattr(install, "checkout", lambda: None), install.pip_hint(extra))[1],
    ):
        arguments = hint.removeprefix("pip install ").removeprefix("-e ")
        assert re.fullmatch(r'("[^"]+" ?)+', arguments), hint  # brackets and >= never reach a shell unquoted


def test_the_test_extra_is_built_from_the_other_extras():
    test = install.extra_requirements("test")
    assert any(r.startswith("xpuruntime[") and {"torch", "bench", "docs"} <= set(r[11:-1].split(",")) for r in test)
    assert not any(r.startswith(("torch", "triton", "matplotlib")) for r in test)  # not listed twice
