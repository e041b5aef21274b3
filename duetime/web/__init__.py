"""`duetime web`: the operator console, server-rendered (Starlette, Jinja2, uvicorn; the `web`
extra). It reads through the same code as the CLI's `--json` views (duetime/ops/inspect.py,
duetime/ops/doctor.py, duetime/ops/schedule_listing.py, duetime/ops/render.py) and acts through the same
transitions (duetime/ops/admin.py). Read-only unless started with a write token."""

from typing import Any

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    """`duetime.web.create_app`, the console's ASGI app (imported when first named: it needs
    the `web` extra)."""
    if name == "create_app":
        from duetime.web.server import create_app

        return create_app
    raise AttributeError(f"module 'duetime.web' has no attribute {name!r}")
