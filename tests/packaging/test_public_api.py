"""Everything a user meets is importable from `duetime`: the names of `__all__`, every
exception class the package defines (so `except duetime.X` works for whatever a public method
raises), the version, and `duetime --version`."""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import pkgutil
import subprocess
import sys
import tomllib

import duetime
from tests.conftest import ROOT


def test_every_name_in_all_resolves():
    assert len(set(duetime.__all__)) == len(duetime.__all__)
    for name in duetime.__all__:
        assert getattr(duetime, name, None) is not None, name
    namespace: dict[str, object] = {}
    exec("from duetime import *", namespace)
    assert set(duetime.__all__) <= set(namespace)


def _package_modules() -> list[str]:
    """Every module the wheel installs (subpackages come from their own folders, so each is
    walked on its own path; `__main__` runs the CLI when imported)."""
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    names = []
    for pkg in packages:
        names.append(pkg)
        names += [f"{pkg}.{m.name}" for m in pkgutil.iter_modules(importlib.import_module(pkg).__path__)
                  if not m.ispkg and m.name != "__main__"]
    return names


def test_every_exception_class_of_the_package_is_exported():
    modules = _package_modules()
    assert {"duetime.common.errors", "duetime.client.schedules", "duetime.common.time.spec",
            "duetime.worker.runtime", "duetime.scheduler.reaper", "duetime.embedded"} <= set(modules)
    defined = {}
    for name in modules:
        module = importlib.import_module(name)
        for obj in vars(module).values():
            if (inspect.isclass(obj) and issubclass(obj, BaseException)
                    and obj.__module__ == module.__name__):
                defined[f"{name}.{obj.__qualname__}"] = obj
    # the ones a user has to catch (or raise, from a task) today
    for known in ("InvalidState", "PartitionMismatch", "ScheduleNotFound", "InvalidSchedule",
                  "Retry", "Fatal", "RedisUnavailable", "ServerBinaryNotFound"):
        assert any(cls.__name__ == known for cls in defined.values()), known
    missing = [path for path, cls in defined.items() if not cls.__name__.startswith("_")
               and (getattr(duetime, cls.__name__, None) is not cls or cls.__name__ not in duetime.__all__)]
    assert not missing, f"exception classes not exported from duetime: {missing}"


def test_errors_raised_by_duetime_share_one_base_except_the_documented_ones():
    """`except duetime.DuetimeError` catches duetime's own errors; Retry, RateLimited, Fatal and
    Continue are raised by tasks (InvalidSchedule is a DuetimeError and a ValueError)."""
    exceptions = {n: getattr(duetime, n) for n in duetime.__all__
                  if inspect.isclass(getattr(duetime, n)) and issubclass(getattr(duetime, n), BaseException)}
    outside = {n for n, cls in exceptions.items() if not issubclass(cls, duetime.DuetimeError)}
    assert outside == {"Retry", "RateLimited", "Fatal", "Continue"}
    assert issubclass(duetime.InvalidSchedule, ValueError)


def test_version_is_the_installed_distributions():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert duetime.__version__ == importlib.metadata.version("duetime") == declared


def test_cli_version_option():
    out = subprocess.run([sys.executable, "-m", "duetime", "--version"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"duetime {duetime.__version__}"
