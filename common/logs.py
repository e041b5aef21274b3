"""structlog setup: JSON lines when not on a terminal, readable lines on one.

Records of the standard `logging` module (a task's own `logging.getLogger(...)`, libraries)
go through the same processors, so they carry the same fields: inside a task, the worker binds
`run_id`, `task` and `attempt` (structlog's context variables) and every line logged there,
by structlog or by `logging`, has them.
"""

from __future__ import annotations

import contextvars
import logging
import sys
from collections.abc import Callable
from typing import Any

import structlog

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def configure(level: str = "INFO", json: bool | None = None) -> None:
    if json is None:
        json = not sys.stderr.isatty()
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    )
    numeric = logging.getLevelName(level.upper())
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    # the standard library's records: the same fields and rendering, on stderr
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info, renderer]))
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_duetime", False)]:
        root.removeHandler(old)
    handler._duetime = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(numeric)


def bind_run(run_id: str, task: str, attempt: int, **more: Any) -> None:
    """Fields every log line of the current context carries (the worker calls it in the
    context of each attempt; sync tasks' threads run in a copy of it)."""
    structlog.contextvars.bind_contextvars(run_id=run_id, task=task, attempt=attempt, **more)


def run_binder(*names: str) -> Callable[..., None]:
    """`bind_run` for a hot path: a function setting structlog's context variables `names`
    from its positional arguments, in order. The variables are looked up once, here (binding
    them through structlog makes them, then they are read back by name from a scratch
    context), so each call is one `ContextVar.set` per field: no keyword dict, no name
    formatting, no token mapping. The fields are the ones `bind_run` would bind, read by
    structlog's `merge_contextvars` and `get_contextvars` the same way."""
    def scratch() -> dict[str, contextvars.ContextVar[Any]]:
        structlog.contextvars.bind_contextvars(**dict.fromkeys(names))
        prefix = structlog.contextvars.STRUCTLOG_KEY_PREFIX
        return {v.name[len(prefix):]: v for v in contextvars.copy_context()
                if v.name.startswith(prefix)}

    found = contextvars.Context().run(scratch)  # nothing bound in the caller's context
    setters = tuple(found[n].set for n in names)
    if len(setters) == 4:  # the worker's: run_id, task, attempt, schedule
        s0, s1, s2, s3 = setters

        def bind4(a: Any, b: Any, c: Any, d: Any) -> None:
            s0(a)
            s1(b)
            s2(c)
            s3(d)

        return bind4

    def bind(*values: Any) -> None:
        for setter, value in zip(setters, values, strict=True):
            setter(value)

    return bind


def get(name: str) -> structlog.typing.FilteringBoundLogger:
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger(name)  # as configured
    return logger
