"""Readers for the files in deploy/, shared by the deploy tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import ROOT

DEPLOY = ROOT / "deploy"
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
COMPOSE = DEPLOY / "compose" / "compose.yaml"
KUBERNETES = DEPLOY / "kubernetes"
SYSTEMD = DEPLOY / "systemd"
RULES = DEPLOY / "prometheus" / "duetime-rules.yml"


@dataclass
class Instruction:
    op: str  # FROM, RUN, COPY, ...
    args: str  # the rest of the (joined) line

    def exec_form(self) -> list[str]:
        """CMD/ENTRYPOINT in JSON (exec) form."""
        value = json.loads(self.args)
        assert isinstance(value, list) and all(isinstance(a, str) for a in value), self.args
        return value


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, op: str) -> list[Instruction]:
        return [i for i in self.instructions if i.op == op]

    def last(self, op: str) -> Instruction | None:
        found = self.all(op)
        return found[-1] if found else None


def dockerfile(path: Path = DOCKERFILE) -> dict[str, Stage]:
    """The Dockerfile's stages by name, each with its instructions (comments dropped,
    continuation lines joined)."""
    lines: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        if raw.lstrip().startswith("#") or not raw.strip():
            continue
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        lines.append(pending + raw)
        pending = ""
    assert not pending, "a continuation line ends the Dockerfile"
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for line in lines:
        op, _, rest = line.strip().partition(" ")
        op, rest = op.upper(), rest.strip()
        if op == "FROM":
            base, _, name = rest.partition(" AS ")
            current = stages[name.strip()] = Stage(name.strip(), base.strip())
        elif current is not None:
            current.instructions.append(Instruction(op, rest))
    return stages


def effective(stages: dict[str, Stage], name: str, op: str) -> Instruction | None:
    """An instruction a stage inherits from the stage it is built FROM, unless it sets its own."""
    stage = stages[name]
    own = stage.last(op)
    if own is not None or stage.base not in stages:
        return own
    return effective(stages, stage.base, op)


def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def kubernetes_objects() -> list[tuple[str, dict[str, Any]]]:
    """(file name, object) for every object of every manifest."""
    out = []
    for path in sorted(KUBERNETES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((path.name, doc))
    return out


def systemd_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """A unit file: section → key → values (systemd keys may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"{path.name}: {line!r} outside a section"
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: not key=value: {line!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def option(argv: list[str], name: str) -> str:
    """The value of `--name VALUE` in a command line."""
    assert argv.count(name) == 1, (name, argv)
    return argv[argv.index(name) + 1]


def duetime_help(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """`duetime ARGV --help`: click parses every option name of ARGV (an unknown or renamed
    one fails) before it prints the help, so a command line that passes is one duetime takes."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "duetime", *argv, "--help"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)



def objects_of_kind(kind: str) -> list[dict[str, Any]]:
    return [o for _, o in kubernetes_objects() if o["kind"] == kind]
