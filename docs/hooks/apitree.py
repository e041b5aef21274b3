"""MkDocs hook: the API reference reads the package as it is installed.

The repository keeps `common/`, `scheduler/`, `worker/` and `lua/` as top-level folders that
are installed inside the one import package `duetime` (pyproject.toml's package-dir).
mkdocstrings reads source files, not the installed package, so this hook lays out that
package as a copy of its Python files under `.cache/apitree/duetime/` (a copy, not
symlinks: griffe resolves a symlink to the folder it points at) before the pages are rendered, and
mkdocs.yml points mkdocstrings at it."""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TREE = ROOT / ".cache" / "apitree"
# installed name inside `duetime` -> the repository's folder (pyproject.toml's package-dir)
MAPPED = {"common": "common", "scheduler": "scheduler", "worker": "worker", "lua": "lua"}


def on_startup(command: str, dirty: bool) -> None:
    """Before any plugin reads its configuration: mkdocstrings drops a `paths` entry that does
    not exist yet, so the tree must be there before its on_config (a clean checkout has none)."""
    pkg = TREE / "duetime"
    if TREE.exists():
        shutil.rmtree(TREE)
    keep = shutil.ignore_patterns("__pycache__", "static", "templates", "*.lua")
    shutil.copytree(ROOT / "duetime", pkg, ignore=keep)
    for name, folder in MAPPED.items():
        shutil.copytree(ROOT / folder, pkg / name, ignore=keep)
