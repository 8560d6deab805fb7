"""Telemetry: one JSON object per line, appended to `telemetry.path`, never to stdout.

structlog builds each event (a context variable supplies `session_id`, bound once per session),
content fields are dropped unless `telemetry.include_content` is on, orjson renders the line,
and secrets are redacted from each batch of lines as it is written. Event shapes live in
`schemas/events/`.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar, Token
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import structlog
from structlog.typing import EventDict, WrappedLogger

from conclave.obs.redact import Redactor
from conclave.obs.tracing import NO_TRACER, Tracer, tracer_for

if TYPE_CHECKING:
    from conclave.schema.config import Config

# Moments someone is watching for: a session beginning (its page, live) and ending, an error.
_FLUSH_AFTER = frozenset({"session_start", "session_end", "rpc_error", "breaker_open"})
CONTENT_FIELDS = frozenset(
    {"question", "context", "system", "prompt", "messages", "text", "answer", "content", "task"}
)


class _NdjsonSink:
    """Appends whole lines to an O_APPEND descriptor, batched: a write per event cost more
    than building the event. A batch goes out when it passes FLUSH_BYTES, when FLUSH_SECONDS
    have passed since the last write, at the start and the end of every session, and at close, so
    `conclave tail --follow` lags by a fraction of a second at most while calls are running.
    Each write holds whole lines only, so concurrent writers never interleave inside a line.

    Secrets are redacted from each batch as it goes out, not from each line: on lines this short
    a scan costs as much per call as per byte. Nothing reads a line before its batch is
    written, and no redaction pattern can match across lines (each ends in `}`).
    """

    FLUSH_BYTES = 64 * 1024
    FLUSH_SECONDS = 0.2

    def __init__(self, path: Path | None, redactor: Redactor) -> None:
        self._fd: int | None = None
        self._redactor = redactor
        self._lock = threading.Lock()
        self._pending = bytearray()
        self._last_flush = time.monotonic()
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def msg(self, line: bytes) -> None:
        if self._fd is None:
            return
        with self._lock:
            self._pending += line
            now = time.monotonic()
            if len(self._pending) >= self.FLUSH_BYTES or now - self._last_flush >= self.FLUSH_SECONDS:
                self._flush_locked(now)

    def flush(self) -> None:
        with self._lock:
            self._flush_locked(time.monotonic())

    def _flush_locked(self, now: float) -> None:
        if self._fd is not None and self._pending:
            os.write(self._fd, self._redactor.json_bytes(bytes(self._pending)))
            self._pending.clear()
        self._last_flush = now

    def close(self) -> None:
        self.flush()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class UtcStamp:
    """ISO-8601 UTC timestamps with microseconds, as `datetime.now(UTC).isoformat(timespec=
    "microseconds")` writes them; the date and time of day are formatted once per second,
    since a datetime per event weighed on every event."""

    __slots__ = ("_clock_ns", "_second")

    def __init__(self, clock_ns: Callable[[], int] = time.time_ns) -> None:
        self._clock_ns = clock_ns
        self._second: tuple[int, str] = (-1, "")  # one tuple, swapped whole: safe across threads

    def __call__(self) -> str:
        seconds, nanos = divmod(self._clock_ns(), 1_000_000_000)
        second = self._second
        if second[0] != seconds:
            second = (seconds, datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S"))
            self._second = second
        return f"{second[1]}.{nanos // 1000:06d}+00:00"


class Telemetry:
    """The event log, and the tracer spans go to (`conclave.obs.tracing`). `Telemetry(None)` discards
    events (tests and benchmarks use it)."""

    def __init__(
        self,
        path: str | Path | None,
        *,
        include_content: bool = False,
        secrets: Iterable[str] = (),
        tracer: Tracer = NO_TRACER,
    ) -> None:
        self.path = Path(path) if path is not None else None
        self.tracer = tracer
        self._redactor = Redactor(secrets)
        self._sink = _NdjsonSink(self.path, self._redactor)
        self._include_content = include_content
        self._stamp = UtcStamp()
        # A concrete logger, not `wrap_logger`'s lazy proxy: the proxy builds a fresh logger per
        # event, each one a reference cycle left for the garbage collector.
        self._log = structlog.BoundLogger(self._sink, processors=[self._render], context={})

    @classmethod
    def for_config(cls, config: Config) -> Telemetry:
        """The event log `config.telemetry` describes, redacting the config's secrets."""
        return cls(
            config.telemetry.path if config.telemetry.enabled else None,
            include_content=config.telemetry.include_content,
            secrets=config.secrets.values(),
            tracer=tracer_for(config.telemetry.otel),
        )

    def emit(self, event: str, **fields: Any) -> None:
        if self.path is not None:  # no file: nothing to build
            self._log.msg(event, **fields)
            # Outside a session (a direct tool call, a server error) no session_end will come to
            # flush it, and the server may sit idle for hours: write it out now.
            if event in _FLUSH_AFTER or _SESSION_ID.get() is None:
                self._sink.flush()

    def flush(self) -> None:
        self._sink.flush()

    @property
    def include_content(self) -> bool:
        return self._include_content

    @property
    def redactor(self) -> Redactor:
        return self._redactor

    def close(self) -> None:
        self._sink.close()
        self.tracer.shutdown()

    def _render(self, _logger: WrappedLogger, _name: str, event: EventDict) -> bytes:
        """Stamp, add the bound session, drop content unless asked, and serialize: one
        processor for all of it, since each step as its own processor built one more copy of
        the event. The sink redacts the lines as it writes them out."""
        if not self._include_content and not CONTENT_FIELDS.isdisjoint(event):
            for name in CONTENT_FIELDS.intersection(event):
                del event[name]
        session_id = _SESSION_ID.get()
        if session_id is None or "session_id" in event:
            stamped = {"ts": self._stamp(), **event}
        else:
            stamped = {"ts": self._stamp(), "session_id": session_id, **event}
        trace_id = _TRACE_ID.get()
        if trace_id is not None:
            stamped["trace_id"] = trace_id
        return orjson.dumps(stamped, option=orjson.OPT_APPEND_NEWLINE, default=str)


# The session a task is working for; tasks started inside inherit it. Conclave's own variable
# (not structlog's contextvars, which copy the whole context to read one key): events read it
# several times per provider call.
_SESSION_ID: ContextVar[str | None] = ContextVar("conclave_session_id", default=None)
_ALREADY_BOUND = nullcontext()
# The caller's W3C trace (docs/telemetry.md#the-event-log): its events carry the trace id, so they
# can be found from it.
_TRACE_ID: ContextVar[str | None] = ContextVar("conclave_trace_id", default=None)
_TRACEPARENT: ContextVar[str | None] = ContextVar("conclave_traceparent", default=None)
_TRACEPARENT_FORM = re.compile(r"\A[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}")


def trace_id_of(traceparent: object) -> str | None:
    """The trace id of a W3C `traceparent` (version-traceid-parentid-flags), or None when it is
    not one: a malformed header is ignored, as the recommendation asks, never an error."""
    if not isinstance(traceparent, str):
        return None
    found = _TRACEPARENT_FORM.match(traceparent.strip())
    if found is None or found.group(1) == "0" * 32 or traceparent.startswith("ff"):
        return None
    return found.group(1)


@contextmanager
def traced(traceparent: object) -> Iterator[None]:
    """The caller's W3C trace for this context (and tasks started in it): its trace id on every
    event, and its `traceparent` for the call's workflow span to hang from. A malformed one is
    ignored."""
    trace_id = trace_id_of(traceparent)
    if trace_id is None or not isinstance(traceparent, str):
        yield
        return
    tokens = (_TRACE_ID.set(trace_id), _TRACEPARENT.set(traceparent.strip()))
    try:
        yield
    finally:
        _TRACE_ID.reset(tokens[0])
        _TRACEPARENT.reset(tokens[1])


def caller_traceparent() -> str | None:
    """The caller's `traceparent`, when the call came with a valid one."""
    return _TRACEPARENT.get()


def session(session_id: str) -> AbstractContextManager[object]:
    """Bind `session_id` to every event emitted in this context (and tasks started in it)."""
    if _SESSION_ID.get() == session_id:
        return _ALREADY_BOUND  # bound by an outer layer (the usual case for a provider call)
    return _Binding(session_id)


class _Binding:
    __slots__ = ("_session_id", "_token")

    def __init__(self, session_id: str) -> None:
        self._session_id = session_id
        self._token: Token[str | None] | None = None

    def __enter__(self) -> None:
        self._token = _SESSION_ID.set(self._session_id)

    def __exit__(self, *_exc: object) -> None:
        if self._token is not None:
            _SESSION_ID.reset(self._token)
