"""MCP resources: the past deliberations, read from the event log and the transcripts folder the
runtime's config names (docs/server.md#resources).

`conclave://sessions/{id}` is a session's transcript as JSON; `conclave://sessions/{id}/summary`
is the same session as Markdown (`ui.markdown`). `resources/list` lists the first form for every
session with a transcript, newest first; the second is reached through its template.

A session id comes from the client: it must match confer's `session_id` pattern, and it only ever
looks up the transcripts `ui.sessions.Sessions` found inside the folder, never a path built from
it. The page's modules (and through them aiohttp) load on the first resource request, not while a
starting server answers its first messages."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import unquote

import anyio
import anyio.to_thread
import orjson

from conclave.app.labels import status_label
from conclave.app.server.jsonrpc import INVALID_PARAMS, RpcError

if TYPE_CHECKING:
    from conclave.app.ui.sessions import Sessions, SessionSummary

PREFIX = "conclave://sessions/"
SUMMARY = "/summary"
RESOURCE_NOT_FOUND = -32002  # the handshake era's code; the stateless era says -32602 for it too
TITLE_CHARS = 80
JSON = "application/json"
MARKDOWN = "text/markdown"

TEMPLATES: tuple[dict[str, str], ...] = (
    {
        "uriTemplate": PREFIX + "{id}",
        "name": "session",
        "title": "A past deliberation's transcript",
        "description": "The whole transcript of a confer or coordinate session, as it was saved: "
        "its arguments, its result and every exchange with the models.",
        "mimeType": JSON,
    },
    {
        "uriTemplate": PREFIX + "{id}" + SUMMARY,
        "name": "session-summary",
        "title": "A past deliberation, summarized",
        "description": "A confer or coordinate session as Markdown: the question or task, each "
        "member's answer, the review, the synthesis and the totals.",
        "mimeType": MARKDOWN,
    },
)

T = TypeVar("T")


def parse(params: Mapping[str, Any]) -> tuple[str, str, bool]:
    """`(uri, session id, summary?)` of a `resources/read`; -32602 for anything that is not one
    of the two templates with a valid session id."""
    uri = params.get("uri")
    if not isinstance(uri, str):
        raise RpcError(INVALID_PARAMS, "Invalid params: resources/read needs a uri (a string)")
    rest = uri[len(PREFIX) :] if uri.startswith(PREFIX) else None
    summary = rest is not None and rest.endswith(SUMMARY)
    if rest is not None and summary:
        rest = rest[: -len(SUMMARY)]
    from conclave.deliberation.threads import SESSION_ID  # loaded on first use, as the page's code is

    # Split before decoding, so an encoded slash or dot-dot is part of the id, and refused there.
    session_id = unquote(rest) if rest is not None and "/" not in rest else None
    if session_id is None or not SESSION_ID.fullmatch(session_id):
        raise RpcError(
            INVALID_PARAMS,
            f"Invalid params: {uri!r} is not a Conclave resource "
            f"({PREFIX}{{id}} or {PREFIX}{{id}}{SUMMARY}, the id as confer's session_id)",
            {"uri": uri},
        )
    return uri, session_id, summary


class Library:
    """The sessions one server can show. `Sessions` reads files and is not thread-safe: it runs on
    a worker thread, one request at a time."""

    def __init__(self, log: Path, transcripts: Path) -> None:
        self._paths = (log, transcripts)
        self._sessions: Sessions | None = None
        self._lock = anyio.Lock()

    async def _run(self, work: Callable[[Sessions], T]) -> T:
        async with self._lock:
            return await anyio.to_thread.run_sync(self._work, work)

    def _work(self, work: Callable[[Sessions], T]) -> T:
        if self._sessions is None:
            from conclave.app.ui.sessions import Sessions

            self._sessions = Sessions(*self._paths)
        return work(self._sessions)

    async def page(self, start: int, size: int) -> tuple[list[dict[str, Any]], bool]:
        """One page of `resources/list`, and whether another follows it."""
        rows = await self._run(lambda sessions: sessions.recent(size + 1, start=start, transcribed=True))
        return [_listed(row) for row in rows[:size]], len(rows) > size

    async def read(self, params: Mapping[str, Any], *, not_found: int) -> dict[str, Any]:
        """A `resources/read` result; `not_found`: the error code of an id no transcript has."""
        uri, session_id, summary = parse(params)
        body = await self._run(lambda sessions: _contents(sessions, session_id, summary))
        if body is None:
            raise RpcError(
                not_found, f"Resource not found: {uri} (no transcript of that session)", {"uri": uri}
            )
        mime, text = body
        return {"contents": [{"uri": uri, "mimeType": mime, "text": text}]}


def _contents(sessions: Sessions, session_id: str, summary: bool) -> tuple[str, str] | None:
    transcript = sessions.transcript(session_id)
    if transcript is None:
        return None
    if not summary:
        return JSON, orjson.dumps(transcript, option=orjson.OPT_INDENT_2).decode()
    from conclave.app.ui.markdown import session_markdown
    from conclave.app.ui.model import from_transcript

    row = sessions.summary(session_id)
    return (MARKDOWN, session_markdown(from_transcript(row, transcript))) if row else None


def _listed(row: SessionSummary) -> dict[str, Any]:
    from conclave.app.ui.sessions import preview

    entry: dict[str, Any] = {"uri": PREFIX + row.session_id, "name": row.session_id}
    if row.question:
        entry["title"] = preview(row.question, TITLE_CHARS)
    entry["description"] = f"{row.tool}, {status_label(row.status)}, started {row.started}"
    entry["mimeType"] = JSON
    return entry
