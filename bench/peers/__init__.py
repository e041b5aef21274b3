"""One adapter module per system, all with the same shape; see common.py for the contract.

The adapters run inside each system's own virtualenv (bench/.venvs/<peer>/, duetime: the
project's .venv), started by bench/peers_run.py as `python -m bench.peers.cli <system> <command>`.
Only the standard library and redis-py may be imported here and in common.py and cli.py.
"""

SYSTEMS = ("duetime", "rq", "arq", "celery", "dramatiq", "huey", "saq", "taskiq")
