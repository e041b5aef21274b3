"""The Dockerfile's own commands, run without Docker: its `wheel` and `duetime` stages are
replayed in a temporary directory standing for the image's filesystem, with a clean virtualenv
standing for the base image's Python. The wheel they build, installed the way they install it,
must give a working `duetime`, and every stage's ENTRYPOINT + CMD must be a command line duetime
takes. (No Docker daemon is needed or used; the base image's own files are not checked.)"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.deploy.files import Stage, dockerfile, effective, option

pytestmark = pytest.mark.slow

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
ABSOLUTE = re.compile(r"(?<![\w./-])/[\w.*-]+(?:/[\w.*-]*)*")


class Image:
    """A stage replayed on the host: container path /x is self.root/x."""

    def __init__(self, root: Path, python_bin: Path) -> None:
        self.root = root
        self.env = {"PATH": f"{python_bin}:/usr/bin:/bin", "HOME": str(root / "root"),
                    "LANG": "C.UTF-8"}
        for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CONFIG_FILE"):
            if name in os.environ:  # the machine's way to PyPI, nothing else of the test's env
                self.env[name] = os.environ[name]
        self.workdir = "/"
        self.ran: list[str] = []

    def host(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def rewrite(self, text: str) -> str:
        """Container paths in a command or value → where they are on the host."""
        return ABSOLUTE.sub(lambda m: str(self.host(m.group(0))), text)

    def replay(self, stage: Stage, images: dict[str, Image]) -> None:
        for ins in stage.instructions:
            if ins.op == "WORKDIR":
                self.workdir = ins.args
                self.host(ins.args).mkdir(parents=True, exist_ok=True)
            elif ins.op == "COPY":
                self.copy(shlex.split(ins.args), images)
            elif ins.op == "ENV":
                for pair in shlex.split(ins.args):
                    key, _, value = pair.partition("=")
                    if key == "PATH":
                        value = self.rewrite(value).replace("$PATH", self.env["PATH"])
                    self.env[key] = value
            elif ins.op == "RUN":
                self.run(ins.args)

    def copy(self, words: list[str], images: dict[str, Image]) -> None:
        source_root = ROOT  # the build context: the repository root
        if words[0].startswith("--from="):
            source_root = images[words.pop(0).split("=", 1)[1]].root
        *sources, dest = words
        target = self.host(dest if dest.startswith("/") else f"{self.workdir}/{dest}")
        for src in sources:
            path = source_root / src.lstrip("/")
            if path.is_dir():  # a directory's contents go into the destination
                shutil.copytree(path, target, dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target / path.name)

    def run(self, command: str) -> None:
        if "pip " not in command:
            # the only other RUN creates the image's user: not replayed on the host
            assert command.startswith("useradd "), f"a RUN line this test does not know: {command}"
            return
        out = subprocess.run(["bash", "-euc", self.rewrite(command)], cwd=self.host(self.workdir),
                             env=self.env, capture_output=True, text=True, timeout=900)
        assert out.returncode == 0, (command, out.stdout[-2000:], out.stderr[-3000:])
        self.ran.append(command)

    def exec(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        """An exec-form command line, resolved on the image's PATH, run in its WORKDIR."""
        return subprocess.run(argv, cwd=self.host(self.workdir), env=self.env, capture_output=True,
                              text=True, timeout=120, executable=shutil.which(argv[0], path=self.env["PATH"]))


def test_the_dockerfile_builds_and_installs_the_wheel_in_a_clean_virtualenv(tmp_path: Path):
    stages = dockerfile()
    assert {"wheel", "duetime", "app", "console"} <= stages.keys()
    base_python = tmp_path / "base-python"  # what python:X-slim gives: python and pip on PATH
    subprocess.run([sys.executable, "-m", "venv", str(base_python)], check=True, timeout=300)
    images: dict[str, Image] = {}
    for name in ("wheel", "duetime"):
        images[name] = Image(tmp_path / name, base_python / "bin")
        images[name].replay(stages[name], images)

    wheels = list((images["wheel"].host("/wheels")).glob("*.whl"))
    assert [w.name for w in wheels] == [f"duetime-{VERSION}-py3-none-any.whl"]
    image = images["duetime"]
    assert any("pip install" in c and ".whl" in c for c in image.ran), image.ran
    assert not image.host("/tmp/wheels").exists(), "the wheel is left in the image"
    # the runtime stage takes nothing from the build context: the installed wheel only
    for ins in stages["duetime"].all("COPY"):
        assert ins.args.startswith("--from=wheel "), ins.args

    out = image.exec(["duetime", "--version"])
    assert out.returncode == 0 and out.stdout.strip() == f"duetime {VERSION}", out.stderr
    where = image.exec(["python", "-c", "import duetime; print(duetime.__file__)"])
    assert Path(where.stdout.strip()).is_relative_to(image.host("/opt/duetime")), where

    # each stage's command line is one duetime takes, and the app it names imports
    for name in ("duetime", "app"):
        entry, cmd = effective(stages, name, "ENTRYPOINT"), effective(stages, name, "CMD")
        assert entry is not None and cmd is not None, name
        argv = entry.exec_form() + cmd.exec_form()
        assert argv[0] == "duetime", argv
        helped = image.exec([*argv, "--help"])
        assert helped.returncode == 0 and "Usage: duetime" in helped.stdout, (argv, helped.stderr)
    app_ref = option(effective(stages, "app", "CMD").exec_form(), "--app")  # type: ignore[union-attr]
    module, attr = app_ref.split(":")
    check = image.exec(["python", "-c", f"import {module} as m, duetime; "
                        f"assert isinstance(m.{attr}, duetime.App)"])
    assert check.returncode == 0, check.stderr

    # the console stage: the base image plus the web extra, on the same filesystem
    assert stages["console"].base == "duetime"
    image.replay(stages["console"], images)
    assert not image.host("/tmp/wheels").exists(), "the wheel is left in the console image"
    web = image.exec(["python", "-c", "import duetime.web.server, uvicorn"])
    assert web.returncode == 0, web.stderr
    argv = [*effective(stages, "console", "ENTRYPOINT").exec_form(),  # type: ignore[union-attr]
            *effective(stages, "console", "CMD").exec_form()]  # type: ignore[union-attr]
    assert argv[:2] == ["duetime", "web"] and option(argv, "--host") == "0.0.0.0", argv
    helped = image.exec([*argv, "--help"])
    assert helped.returncode == 0 and "Usage: duetime web" in helped.stdout, helped.stderr


def test_the_image_runs_as_an_unprivileged_user():
    stages = dockerfile()
    user = stages["duetime"].last("USER")
    assert user is not None
    uid, _, gid = user.args.partition(":")
    assert uid.isdigit() and int(uid) != 0 and (not gid or int(gid) != 0)
    (useradd,) = [i.args for i in stages["duetime"].all("RUN") if i.args.startswith("useradd ")]
    assert f"--uid {uid} " in useradd
    assert stages["app"].last("USER") is None or stages["app"].last("USER").args == user.args  # type: ignore[union-attr]
    # the entry point is the installed command, not a script of the repository
    assert effective(stages, "duetime", "ENTRYPOINT").exec_form() == ["duetime"]  # type: ignore[union-attr]


def test_the_build_context_ignore_file_lets_in_what_the_wheel_stage_copies():
    ignore = [line.strip() for line in
              (ROOT / "deploy" / "docker" / "Dockerfile.dockerignore").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    assert ignore[0] == "*"  # everything out, then what the build needs back in
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    copied = {src.rstrip("/") for ins in dockerfile()["wheel"].all("COPY")
              for src in shlex.split(ins.args)[:-1]}
    assert copied == allowed
    package_dirs = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
                       ["package-dir"].values())
    assert package_dirs <= copied, package_dirs - copied  # a new package folder needs a COPY
