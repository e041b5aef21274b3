"""`duetime web`: the operator console, server-rendered (Starlette, Jinja2, uvicorn; the `web`
extra). It reads through the same code as the CLI's `--json` views (common/inspect.py,
common/doctor.py, common/schedule_store.py, duetime/render.py) and acts through the same
transitions (common/admin.py). Read-only unless started with a write token."""
