"""`make typecheck`: mypy --strict on the package as it is installed, from the repository's folders.

The repository keeps `common/`, `worker/`, `scheduler/` and `lua/` at the top; installed they are
`duetime.common`, `duetime.worker`, ... (pyproject.toml's `package-dir`). The editable install
maps them with an import hook that mypy cannot see, so from the repository mypy finds no
`duetime.common` at all. This lays out `build/typecheck/duetime/` as the installed package looks,
every entry a symlink into the repository (laid anew each run, in milliseconds, so a file added
or removed is seen), runs `mypy -p duetime` there with pyproject.toml's `[tool.mypy]`, and prints
each reported path as the file a developer opens (`duetime/common/codec.py` -> `common/codec.py`).
The incremental cache stays in `build/mypy-cache` between runs.

The same run checks `tests/typecheck/*.py`: user code that pins what mypy says of duetime's
public API (`assert_type`, and expected errors as `# type: ignore[code]`, which
`warn_unused_ignores` turns into a failure once the error disappears). They import `duetime`
as a user does, from the laid-out tree.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "build" / "typecheck"
MAPPED = ("common", "worker", "scheduler", "lua")  # subpackages of duetime kept as top-level folders
USER_CHECKS = ROOT / "tests" / "typecheck"
_PATH = re.compile(rf"^duetime/({'|'.join(MAPPED)})/", re.MULTILINE)


def lay_out() -> None:
    """build/typecheck/duetime/: duetime/*, plus common -> duetime/common and the others."""
    shutil.rmtree(TREE, ignore_errors=True)
    package = TREE / "duetime"
    package.mkdir(parents=True)
    for entry in sorted((ROOT / "duetime").iterdir()):
        if entry.name != "__pycache__" and entry.name not in MAPPED:
            (package / entry.name).symlink_to(os.path.relpath(entry, package))
    for folder in MAPPED:
        (package / folder).symlink_to(os.path.relpath(ROOT / folder, package), target_is_directory=True)


def main(argv: list[str]) -> int:
    lay_out()
    base = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
            "--cache-dir", str(ROOT / "build" / "mypy-cache")]
    # mypy takes a package or files, not both: the user checks are a second run (cached)
    user_checks = [os.path.relpath(f, TREE) for f in sorted(USER_CHECKS.glob("*.py"))]
    runs = [[*base, "-p", "duetime", *argv]] + ([[*base, *user_checks, *argv]] if user_checks else [])
    worst = 0
    for command in runs:
        done = subprocess.run(command, cwd=TREE, capture_output=True, text=True)
        sys.stdout.write(_PATH.sub(r"\1/", done.stdout).replace("../../tests/", "tests/"))
        sys.stderr.write(done.stderr)
        worst = max(worst, done.returncode)
    return worst

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
