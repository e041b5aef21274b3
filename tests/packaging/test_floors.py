"""The declared dependency ranges are true: no import of a private module of redis-py (one
such import made `import duetime` fail on redis-py 5.3, 6.4 and 7.0, all inside the declared
range), constraints/floors.txt pins every dependency at its declared lower bound (`make
test-floors` runs the fast lane there), and duetime installs beside arq, which pins
redis<6: either both import and a job of each runs, or pip refuses at install time."""

from __future__ import annotations

import ast
import re
import textwrap
import tomllib
from pathlib import Path

import pytest
from packaging.version import Version

from duetime.embedded import EmbeddedServer
from tests.conftest import ROOT
from tests.packaging.test_wheel import Venv

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
FLOORS = ROOT / "constraints" / "floors.txt"
SOURCES = ("common", "worker", "scheduler", "duetime")


def _floors() -> dict[str, str]:
    pins = {}
    for line in FLOORS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[name.strip().lower()] = Version(version.strip())
    return pins


def test_floors_match_pyproject():
    """Every dependency has a floor, pinned at exactly the `>=` bound pyproject declares."""
    declared = dict(_bound(dep) for dep in PYPROJECT["project"]["dependencies"])
    pins = _floors()
    extras = PYPROJECT["project"]["optional-dependencies"]
    floored = {_bound(d)[0] for extra in FLOORED_EXTRAS for d in extras[extra]}
    assert {k: v for k, v in pins.items() if k not in floored} == declared


# extras whose floors `make test-floors` installs and uses too (docs: it builds the site; the
# others: their tests run there): each of their dependencies is pinned in
# constraints/floors.txt at its declared bound
FLOORED_EXTRAS = ("docs", "dev", "calendars", "otel", "sentry", "outbox")


def _bound(dep: str) -> tuple[str, Version]:
    m = re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*>=\s*([0-9][0-9A-Za-z.]*)", dep)
    assert m, f"dependency {dep!r} has no plain >= lower bound"
    return m.group(1).lower(), Version(m.group(3))


def test_floored_extras_are_pinned_and_installed():
    """The floored extras' bounds are pinned in floors.txt, and the floors lane installs those
    extras (so their integration tests there run at the floors)."""
    extras = PYPROJECT["project"]["optional-dependencies"]
    declared = dict(_bound(d) for extra in FLOORED_EXTRAS for d in extras[extra])
    pins = _floors()
    assert {name: pins.get(name) for name in declared} == declared
    base = {_bound(d)[0] for d in PYPROJECT["project"]["dependencies"]}
    assert set(pins) == base | set(declared)  # nothing pinned that nothing declares
    makefile = (ROOT / "Makefile").read_text()
    install = re.search(r"FLOORS_VENV\)/bin/pip install .*-e '\.\[([^\]]*)\]'", makefile)
    assert install, "the floors lane's install line"
    assert set(FLOORED_EXTRAS) <= set(install.group(1).split(","))


def test_no_private_module_of_redis_py_is_imported():
    """`redis._parsers` and its like change between releases without notice."""
    bad = []
    for folder in SOURCES:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                bad += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names
                        if n.startswith("redis.") and any(p.startswith("_") for p in n.split("."))]
    assert bad == []


# what a user's process with both libraries does: one duetime run and one arq job
_BOTH = textwrap.dedent('''
    import asyncio, sys
    import arq, arq.connections, arq.worker
    import duetime
    from duetime.worker.runtime import Worker, WorkerConfig

    url, namespace = sys.argv[1], sys.argv[2]
    app = duetime.App(redis_url=url, namespace=namespace)

    @app.task(name="beside.arq")
    def add(a, b):
        return a + b

    async def arq_add(ctx, a, b):
        return a + b

    async def main():
        run_id = app.enqueue(add, [2, 3])
        worker = Worker(app.registry, url, app.keys, WorkerConfig(queues=["default"]))
        running = asyncio.create_task(worker.run(handle_signals=False))
        got = await app.await_result(run_id, 60)
        worker.stop()
        await running
        settings = arq.connections.RedisSettings.from_dsn(url)
        pool = await arq.create_pool(settings)
        job = await pool.enqueue_job("arq_add", 4, 5, _queue_name=namespace + ":arq")
        w = arq.worker.Worker(functions=[arq.worker.func(arq_add, name="arq_add")],
                              redis_settings=settings, burst=True, queue_name=namespace + ":arq",
                              handle_signals=False)
        await w.async_run()
        print("results", got, await job.result(timeout=30))

    asyncio.run(main())
''')


@pytest.mark.slow
def test_duetime_installs_beside_arq_or_pip_refuses(tmp_path: Path, wheel: Path):
    v = Venv.create(tmp_path / "venv", wheel)
    got = v.pip_install(wheel, "arq")
    if got.returncode != 0:  # refused at install time: acceptable, but it must be a resolution
        assert "ResolutionImpossible" in got.stderr or "conflict" in got.stderr.lower(), \
            got.stderr[-3000:]
        return
    versions = v.run(v.python, "-c", "import importlib.metadata as m; "
                     "print(m.version('redis'), m.version('arq'))", cwd=v.root)
    redis_version = versions.stdout.split()[0]
    server = EmbeddedServer("redis").start()
    try:
        (tmp_path / "both.py").write_text(_BOTH)
        ran = v.run(v.python, tmp_path / "both.py", server.url, f"t{tmp_path.name[-8:]}",
                    cwd=tmp_path, timeout=180)
    finally:
        server.stop()
    assert ran.returncode == 0, (redis_version, ran.stderr[-3000:])
    assert "results 5 9" in ran.stdout, (redis_version, ran.stdout[-2000:])
