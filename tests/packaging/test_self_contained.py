"""The repository stands alone: nothing in it cites a design file or a tracker that is not in
it, and every page it points to under docs/ (or links to from a markdown file) exists."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.conftest import ROOT

# a design document kept elsewhere, a numbered section of one, an issue or pull request
EXTERNAL = [
    re.compile(r"\bDESIGN(\.md\b|\s*§)"),
    re.compile(r"§\s*\d"),
    re.compile(r"(?i)\b(issues?|tickets?|bugs?|pr|pull request)\s*#?\d+\b"),
    re.compile(r"(?<![\w&#/}])#\d+\b"),  # not cron's `{dow}#5` (nth weekday)
    re.compile(r"(?i)\b(github|gitlab|bitbucket)\.(com|org)/[^\s/]+/[^\s/]+/(issues|pulls?|merge_requests)\b"),
    re.compile(r"(?i)\bjira\b"),
]
DOC_REF = re.compile(r"\bdocs/[\w./-]+\.md\b")
MD_LINK = re.compile(r"\]\(([^)#\s]+)(#[^)]*)?\)")
SKIP_SUFFIXES = {".png", ".jpg", ".gz", ".whl", ".pyc"}


def repository_files() -> list[Path]:
    """Tracked and untracked files, minus what .gitignore excludes (.venv, caches, build)."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                         cwd=ROOT, capture_output=True, check=True)
    files = [ROOT / name for name in out.stdout.decode().split("\0") if name]
    return [f for f in files if f.is_file() and f.suffix not in SKIP_SUFFIXES]


def test_the_file_list_covers_the_repository():
    names = {f.relative_to(ROOT).as_posix() for f in repository_files()}
    assert {"README.md", "pyproject.toml", "common/keys.py", "lua/claim.lua", "docs/keys.md",
            "bench/RESULTS.md", "tests/conftest.py"} <= names
    assert not any(n.startswith((".venv/", ".git/")) for n in names)


def test_no_file_cites_an_outside_design_document_or_tracker():
    found = []
    for path in repository_files():
        text = path.read_text(errors="replace")
        for lineno, line in enumerate(text.splitlines(), 1):
            for pattern in EXTERNAL:
                m = pattern.search(line)
                if m:
                    where = f"{path.relative_to(ROOT)}:{lineno}"
                    found.append(f"{where}: {m.group(0)!r} in {line.strip()[:90]!r}")
    assert not found, "references to something outside the repository:\n" + "\n".join(found)


def test_every_docs_page_cited_exists():
    cited = {}
    for path in repository_files():
        for ref in DOC_REF.findall(path.read_text(errors="replace")):
            cited.setdefault(ref, path.relative_to(ROOT).as_posix())
    assert "docs/keys.md" in cited and "docs/time.md" in cited
    missing = {ref: where for ref, where in cited.items() if not (ROOT / ref).is_file()}
    assert not missing, missing


def test_markdown_links_point_to_files_that_exist():
    broken = []
    for path in repository_files():
        if path.suffix != ".md":
            continue
        for target, _ in MD_LINK.findall(path.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (path.parent / target).exists():
                broken.append(f"{path.relative_to(ROOT)} -> {target}")
    assert not broken, broken
