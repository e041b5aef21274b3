"""Each peer gets its own virtualenv under bench/.venvs/<peer>/, created here with
`python3 -m venv` and `pip install <pinned packages>` from PyPI. Nothing of the peers is copied
into the project: the adapters in bench/peers/ only import them.

    .venv/bin/python -m bench.peer_venvs [peer ...]     # create/refresh, print versions
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
VENVS = BENCH / ".venvs"

# Pinned versions: the newest each registry served when the harness was written.
PINS: dict[str, list[str]] = {
    "rq": ["rq==2.12.0"],
    "arq": ["arq==0.28.0"],
    "celery": ["celery[redis]==5.7.0"],
    "dramatiq": ["dramatiq[redis]==2.2.1"],
    "huey": ["huey==3.5.4", "redis"],
    "saq": ["saq[redis]==0.26.4", "typing_extensions"],
    "taskiq": ["taskiq==0.13.0", "taskiq-redis==1.2.4"],
    # W5 only: schedule stores in Redis for the peers whose core keeps schedules in code
    "redbeat": ["celery[redis]==5.7.0", "celery-redbeat==2.4.2"],
    "rqscheduler": ["rq==2.12.0", "rq-scheduler==0.14.0"],
}
# the distributions whose versions RESULTS.md reports
REPORTED = {
    "rq": ["rq", "redis"], "arq": ["arq", "redis"], "celery": ["celery", "kombu", "redis"],
    "dramatiq": ["dramatiq", "redis"], "huey": ["huey", "redis"], "saq": ["saq", "redis"],
    "taskiq": ["taskiq", "taskiq-redis", "redis"], "duetime": ["duetime", "redis", "hiredis"],
    "redbeat": ["celery", "celery-redbeat", "redis"], "rqscheduler": ["rq", "rq-scheduler", "redis"],
}


def python_of(system: str) -> str:
    """The interpreter an adapter runs under: duetime's own venv, or the peer's."""
    if system == "duetime":
        return sys.executable
    return str(VENVS / system / "bin" / "python")


def ensure(peer: str, log=print) -> str:
    """Create bench/.venvs/<peer> with its pins unless it already has exactly them."""
    venv = VENVS / peer
    marker = venv / "bench-pins.json"
    want = json.dumps(PINS[peer])
    if marker.exists() and marker.read_text() == want and (venv / "bin" / "python").exists():
        return python_of(peer)
    log(f"[venv] creating {venv} with {' '.join(PINS[peer])}")
    VENVS.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=300)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    res = subprocess.run([*pip, *PINS[peer]], capture_output=True, text=True, timeout=900)
    if res.returncode != 0:
        raise RuntimeError(f"pip install {' '.join(PINS[peer])} failed:\n{res.stderr[-3000:]}")
    marker.write_text(want)
    return python_of(peer)


def versions(system: str) -> dict[str, str]:
    code = ("import importlib.metadata as m, json, sys\n"
            "out = {}\n"
            "for d in sys.argv[1:]:\n"
            "    try: out[d] = m.version(d)\n"
            "    except m.PackageNotFoundError: out[d] = 'absent'\n"
            "print(json.dumps(out))")
    res = subprocess.run([python_of(system), "-c", code, *REPORTED[system]], capture_output=True,
                         text=True, timeout=60, check=True)
    return json.loads(res.stdout)


def main() -> None:
    peers = sys.argv[1:] or list(PINS)
    for p in peers:
        ensure(p)
        print(p, versions(p))


if __name__ == "__main__":
    main()
