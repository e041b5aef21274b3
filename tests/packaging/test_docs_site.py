"""The docs site builds with `mkdocs build --strict` (mkdocs.yml: every page in the nav, every
link and anchor resolved, the API reference generated from the docstrings), and the check can
fail: a page left out of the nav aborts the build. Built from a copy of the tree, so nothing is
written into the checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow
TREE = ("docs", "duetime", "common", "scheduler", "worker", "lua")


def _build(root: Path) -> subprocess.CompletedProcess[str]:
    mkdocs = Path(sys.executable).parent / "mkdocs"
    return subprocess.run([str(mkdocs), "build", "--strict", "-d", str(root / "site")], cwd=root,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True,
                          text=True, timeout=300)


def test_the_docs_site_builds_strictly_and_an_omitted_page_fails_it(tmp_path: Path):
    pytest.importorskip("mkdocs")
    shutil.copy2(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    for name in TREE:
        shutil.copytree(ROOT / name, tmp_path / name,
                        ignore=shutil.ignore_patterns("__pycache__", "screenshots"))
    (tmp_path / "docs" / "screenshots").mkdir()  # pages link the console's pictures by name
    for png in (ROOT / "docs" / "screenshots").glob("*"):
        shutil.copy2(png, tmp_path / "docs" / "screenshots" / png.name)
    ok = _build(tmp_path)
    assert ok.returncode == 0, ok.stderr[-3000:]
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    assert "enqueue" in api and "current_run" in api  # the reference came from the docstrings
    assert (tmp_path / "site" / "tutorial" / "index.html").is_file()

    (tmp_path / "docs" / "orphan.md").write_text("# Not in the nav\n")
    broken = _build(tmp_path)
    assert broken.returncode != 0
    assert "orphan.md" in broken.stderr and "not included in the \"nav\"" in broken.stderr
