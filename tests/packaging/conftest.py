"""The wheel the packaging tests install: built once a run (tests/packaging/test_wheel.py and
test_floors.py install the same build)."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _source_copy(dest: Path) -> Path:
    """What the build reads, copied out of the repository, so building leaves no `build/` or
    egg-info behind in the source tree."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, dest / name)
    for folder in set(PYPROJECT["tool"]["setuptools"]["package-dir"].values()):
        shutil.copytree(ROOT / folder, dest / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def build_wheel(dest: Path) -> Path:
    """duetime's wheel, built from a copy of the source into `dest` (`pip wheel --no-deps`)."""
    work = dest.with_name(f"{dest.name}.build-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)  # a build of this process that failed half-way
    work.mkdir()
    src = _source_copy(work / "src")
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                          str(work / "dist"), str(src)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    (work / "dist").rename(dest)
    shutil.rmtree(work)
    (wheel,) = dest.glob("duetime-*.whl")
    return wheel


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built once a run, however many test processes ask: under the temporary
    directory the run's xdist processes share, behind a file lock (the first to come builds it,
    the others wait for it and use it). Read only: a test that installs it copies nothing."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # this run's, shared by its processes
    dest = root / "duetime-wheel"
    with (root / "duetime-wheel.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = list(dest.glob("duetime-*.whl"))
        return found[0] if found else build_wheel(dest)
