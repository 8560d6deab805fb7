"""Telemetry: one JSON object per line, appended to `telemetry.path`, never to stdout.

structlog builds each event (contextvars supply `session_id`, bound once per session),
a redaction step removes secrets, content fields are dropped unless
`telemetry.include_content` is on, and orjson renders the line. Event shapes live in
`schemas/events/`.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import structlog
from structlog.contextvars import bound_contextvars, merge_contextvars
from structlog.typing import EventDict, WrappedLogger

from conclave.redact import Redactor

CONTENT_FIELDS = frozenset(
    {"question", "context", "system", "prompt", "messages", "text", "answer", "content", "task"}
)


class _NdjsonSink:
    """Appends whole lines with one write each on an O_APPEND descriptor (atomic per line)."""

    def __init__(self, path: Path | None) -> None:
        self._fd: int | None = None
        self._lock = threading.Lock()
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def msg(self, line: bytes) -> None:
        if self._fd is not None:
            with self._lock:
                os.write(self._fd, line)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class Telemetry:
    """The event log. `Telemetry(None)` discards events (used by `--no-telemetry` paths)."""

    def __init__(
        self,
        path: str | Path | None,
        *,
        include_content: bool = False,
        secrets: Iterable[str] = (),
    ) -> None:
        self.path = Path(path) if path is not None else None
        self._sink = _NdjsonSink(self.path)
        self._redactor = Redactor(secrets)
        self._include_content = include_content
        self._log = structlog.wrap_logger(
            self._sink,
            processors=[merge_contextvars, _stamp, self._scrub, _render],
            wrapper_class=structlog.BoundLogger,
        )

    def emit(self, event: str, **fields: Any) -> None:
        self._log.msg(event, **fields)

    @property
    def redactor(self) -> Redactor:
        return self._redactor

    def close(self) -> None:
        self._sink.close()

    def _scrub(self, _logger: WrappedLogger, _name: str, event: EventDict) -> EventDict:
        if not self._include_content:
            for name in CONTENT_FIELDS.intersection(event):
                del event[name]
        scrubbed: EventDict = self._redactor.value(event)
        return scrubbed


@contextlib.contextmanager
def session(session_id: str) -> Iterator[None]:
    """Bind `session_id` to every event emitted in this context (and tasks started in it)."""
    with bound_contextvars(session_id=session_id):
        yield


def _stamp(_logger: WrappedLogger, _name: str, event: EventDict) -> EventDict:
    stamped: EventDict = {"ts": datetime.now(UTC).isoformat(timespec="microseconds"), **event}
    return stamped


def _render(_logger: WrappedLogger, _name: str, event: EventDict) -> bytes:
    return orjson.dumps(event, option=orjson.OPT_APPEND_NEWLINE, default=str)
