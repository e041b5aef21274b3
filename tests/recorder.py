"""A stand-in for a module's structlog logger, for tests that read what was logged (structlog's
own capture does not see loggers cached by an earlier `logs.configure` in the same process)."""

from __future__ import annotations

from typing import Any


class Recorder:
    """Stands in for a module's structlog logger: keeps (level, event, fields)."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def _add(self, level: str, event: str, **kw: Any) -> None:
        self.lines.append((level, event, kw))

    def debug(self, event: str, **kw: Any) -> None:
        self._add("debug", event, **kw)

    def info(self, event: str, **kw: Any) -> None:
        self._add("info", event, **kw)

    def warning(self, event: str, **kw: Any) -> None:
        self._add("warning", event, **kw)

    def error(self, event: str, **kw: Any) -> None:
        self._add("error", event, **kw)

    def exception(self, event: str, **kw: Any) -> None:
        self._add("error", event, **kw)

    def is_enabled_for(self, level: int) -> bool:
        return True

    def events(self, event: str) -> list[dict[str, Any]]:
        return [kw for _, e, kw in self.lines if e == event]
