"""`duetime web`: the operator console, server-rendered (Starlette, Jinja2, uvicorn; the `web`
extra). It reads through the same code as the CLI's `--json` views (duetime/ops/inspect.py,
duetime/ops/doctor.py, duetime/ops/schedule_listing.py, duetime/ops/render.py) and acts through the same
transitions (duetime/ops/admin.py). Read-only unless started with a write token."""
