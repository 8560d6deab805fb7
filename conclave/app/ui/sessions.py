"""Where the page finds sessions: the event log says which ran and how they ended, the transcripts
hold what was said.

The log is read once and then only what is appended to it (`tail.Follower`, which also notices a
rotated or truncated log), so listing sessions stays cheap however long the log grows. A session
whose events are gone (a rotated log, telemetry off) is still listed from its transcript's name.
Transcripts are opened only inside `transcripts.dir`: a session id comes from a URL, and the
`transcript` path an event names is checked the same way before it is read.

A follow-up's transcript names the session it followed up (`parent`) and its thread's first
session (`thread_id`): a session's page reads its thread back along those links, and finds its
follow-ups by the links of every transcript, each read once (a transcript is written once).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from conclave.app.tail import Follower, parse_line
from conclave.deliberation.threads import MAX_DEPTH, Link, ancestors, link_of, newest_transcript

RECENT = 100  # sessions the list shows
PREVIEW_CHARS = 200  # of a question in the list: RECENT rows of it keep the list small
_SESSION_EVENTS = (b'"session_start"', b'"session_end"')
_TRANSCRIPT_CACHE = 512


@dataclass(frozen=True, slots=True)
class SessionSummary:
    """One row of the list. `status` is the `session_end` status, or `running` before it."""

    session_id: str
    tool: str
    started: str  # ISO-8601 UTC
    status: str = "running"
    question: str | None = None  # a preview (`preview`): the whole question is on the session's page
    degraded_reasons: tuple[Mapping[str, Any], ...] = ()
    cost_usd: float | None = None
    max_cost_usd: float | None = None  # a dry run's bound on what the call would have cost
    duration_ms: float | None = None
    answers: int | None = None
    ok: int | None = None
    transcript: str | None = None
    thread_id: str | None = None  # known once its transcript is read
    parent: str | None = None  # the session it followed up (`follow_up_of`)

    @property
    def degraded(self) -> bool:
        return self.status == "degraded" or bool(self.degraded_reasons)

    @property
    def running(self) -> bool:
        return self.status == "running"


@dataclass(frozen=True, slots=True)
class Earlier:
    """The turns of a thread before one session, oldest first, each with its transcript, as far
    back as they can be read. `stopped` says why they stop short of the thread's first turn:
    `missing` (a transcript is gone), `cycle` (the links loop), `limit` (MAX_DEPTH turns)."""

    turns: tuple[tuple[SessionSummary, dict[str, Any]], ...] = ()
    stopped: str | None = None


class Sessions:
    """The sessions of one event log and one transcripts folder, as the page lists them."""

    def __init__(self, log: Path, transcripts: Path) -> None:
        self.log = log
        self.transcripts = transcripts
        self._follower = Follower(log, 0)
        self._known: dict[str, SessionSummary] = {}
        self._texts: dict[Path, dict[str, Any] | None] = {}
        self._links: dict[Path, Link | None] = {}

    def refresh(self) -> int:
        """Read what the log gained since the last call; returns the offset just after its last
        whole line (where a live stream of what happens next should start)."""
        inode = self._follower.inode
        lines = self._follower.poll()
        if self._follower.inode != inode:
            self._known.clear()  # a new log: what the old one said is gone (transcripts remain)
        for raw in lines:
            if any(marker in raw for marker in _SESSION_EVENTS):
                self._take(parse_line(raw))
        return self._follower.offset - len(self._follower.partial)

    def _take(self, event: dict[str, Any] | None) -> None:
        if event is None or not isinstance(event.get("session_id"), str):
            return
        sid, name = event["session_id"], event.get("event")
        if name == "session_start":
            self._known[sid] = _started(event)
        elif name == "session_end":
            self._known[sid] = _ended(self._known.get(sid), event)

    def recent(
        self, limit: int = RECENT, *, start: int = 0, transcribed: bool = False
    ) -> list[SessionSummary]:
        """The newest sessions first, from the `start`-th, each with its question when its
        transcript has one. `transcribed`: only sessions with a transcript, the ones that can be
        read whole (not one still running, nor a dry run)."""
        self.refresh()
        files = self._transcript_files()
        rows = {sid: row for sid, row in self._known.items() if not transcribed or sid in files}
        for sid, path in files.items():
            if sid not in rows:
                rows[sid] = _from_name(sid, path)
        newest = sorted(rows.values(), key=lambda s: s.started, reverse=True)[start : start + limit]
        return [self._with_link(self._with_question(row, files), files) for row in newest]

    def summary(self, session_id: str) -> SessionSummary | None:
        self.refresh()
        files = self._transcript_files()  # listed once, for the three lookups below
        found = self._known.get(session_id)
        if found is None and (path := files.get(session_id)) is not None:
            found = _from_name(session_id, path)
        return None if found is None else self._with_link(self._with_question(found, files), files)

    def transcript(self, session_id: str, files: Mapping[str, Path] | None = None) -> dict[str, Any] | None:
        """The session's transcript, parsed; None while it runs, or when there is none. `files`:
        the folder's listing, when the caller has one."""
        path = self._path(session_id, files)
        return None if path is None else self._read(path)

    def earlier(self, transcript: Mapping[str, Any], limit: int = MAX_DEPTH) -> Earlier:
        """The thread's turns before the session of `transcript` (which counts towards `limit`)."""
        files = self._transcript_files()

        ancestry = ancestors(transcript, lambda sid: self.transcript(sid, files), limit)
        turns = []
        for body in ancestry.transcripts:
            sid = str(body.get("session_id"))
            path = self._path(sid, files)
            assert path is not None  # the walk just read it there
            turns.append(
                (self._with_question(self._known.get(sid) or _from_name(sid, path), files), dict(body))
            )
        return Earlier(tuple(turns), ancestry.stopped)

    def follow_ups(self, session_id: str) -> list[str]:
        """The sessions that followed `session_id` up, oldest first."""
        files = self._transcript_files()
        # Only the files still there: a long-running page does not keep every deleted one's link.
        self._links = {path: self._links[path] for path in files.values() if path in self._links}
        found = [
            _from_name(sid, path)
            for sid, path in files.items()
            if (link := self._link(path)) is not None and link.parent == session_id
        ]
        return [row.session_id for row in sorted(found, key=lambda row: row.started)]

    def events(self, session_id: str) -> list[dict[str, Any]]:
        """Every event of one session, in order (what a running session can show)."""
        if not self.log.exists():
            return []
        with self.log.open("rb") as handle:
            parsed = (parse_line(raw) for raw in handle if raw.endswith(b"\n"))
            return [e for e in parsed if e is not None and e.get("session_id") == session_id]

    # -- transcripts --------------------------------------------------------------------------

    def _transcript_files(self) -> dict[str, Path]:
        """Session id -> its newest transcript (`<day>/<session>-<tool>-<time>-<n>.json`)."""
        found: dict[str, Path] = {}
        for path in sorted(self._transcript_paths()):
            parts = path.stem.rsplit("-", 3)
            if len(parts) == 4:
                found[parts[0]] = path
        return found

    def _transcript_paths(self) -> Iterator[Path]:
        if self.transcripts.is_dir():
            yield from self.transcripts.glob("*/*.json")

    def _path(self, session_id: str, files: Mapping[str, Path] | None) -> Path | None:
        """The session's transcript: the one its `session_end` names, else the newest by name (in
        `files`, or looked up by its own name: listing the folder per session costs its size)."""
        known = self._known.get(session_id)
        named = self._inside(known.transcript) if known and known.transcript else None
        if named is not None:
            return named
        if files is not None:
            return files.get(session_id)
        return newest_transcript(self.transcripts, session_id) if self.transcripts.is_dir() else None

    def _inside(self, named: str) -> Path | None:
        path = Path(named)
        try:
            inside = path.resolve().is_relative_to(self.transcripts.resolve())
        except OSError:
            return None
        return path if inside and path.is_file() else None

    def _read(self, path: Path) -> dict[str, Any] | None:
        """A transcript is written once, whole: each is parsed once and kept (up to a bound)."""
        if path not in self._texts:
            if len(self._texts) >= _TRANSCRIPT_CACHE:
                self._texts.clear()
            self._texts[path] = _load(path)
        return self._texts[path]

    def _link(self, path: Path) -> Link | None:
        """A transcript's place in its thread, read once: kept apart from the bounded `_texts`, so
        finding follow-ups reads each transcript once however many there are."""
        if path not in self._links:
            body = self._texts[path] if path in self._texts else _load(path)
            self._links[path] = None if body is None else link_of(body)
        return self._links[path]

    def _with_link(self, row: SessionSummary, files: Mapping[str, Path] | None) -> SessionSummary:
        path = None if row.running else self._path(row.session_id, files)
        link = None if path is None else self._link(path)
        return row if link is None else dataclasses.replace(row, thread_id=link.thread_id, parent=link.parent)

    def _with_question(self, row: SessionSummary, files: Mapping[str, Path] | None = None) -> SessionSummary:
        if row.running or (row.question is not None and row.status != "ended"):
            return row
        body = self.transcript(row.session_id, files) or {}
        arguments = body.get("arguments") or {}
        asked = arguments.get("question") or arguments.get("task")
        row = dataclasses.replace(row, question=preview(asked)) if isinstance(asked, str) else row
        return _from_result(row, body.get("result")) if row.status == "ended" else row


def _load(path: Path) -> dict[str, Any] | None:
    try:
        body = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return body if isinstance(body, dict) else None


def _started(event: Mapping[str, Any]) -> SessionSummary:
    asked = event.get("question") or event.get("task")  # only with telemetry.include_content
    return SessionSummary(
        session_id=event["session_id"],
        tool=str(event.get("tool", "?")),
        started=str(event.get("ts", "")),
        question=preview(asked) if isinstance(asked, str) else None,
    )


def preview(text: str, limit: int = PREVIEW_CHARS) -> str:
    """The start of `text` on one line, at most `limit` characters, cut after a whole word and
    marked with an ellipsis when cut. Kept short where it is read, so a huge question costs the
    list (and the memory of every session it knows) no more than a short one."""
    head = " ".join(text[: limit * 2].split())  # runs of whitespace and newlines as one space
    if len(head) <= limit:
        return head if len(text) <= limit * 2 else head + "…"
    cut = head[: limit + 1]
    space = cut.rfind(" ")
    cut = cut[:space] if space >= limit // 2 else cut[:limit]  # one very long word is cut inside it
    return cut.rstrip(" ,;:.-") + "…"


def _ended(start: SessionSummary | None, event: Mapping[str, Any]) -> SessionSummary:
    base = start or SessionSummary(event["session_id"], str(event.get("tool", "?")), str(event.get("ts", "")))
    usage = event.get("usage") if isinstance(event.get("usage"), dict) else {}
    reasons = event.get("degraded_reasons")
    return dataclasses.replace(
        base,
        status=str(event.get("status", "?")),
        cost_usd=(usage or {}).get("cost_usd"),
        max_cost_usd=event.get("max_cost_usd"),
        duration_ms=event.get("duration_ms"),
        answers=event.get("answers"),
        ok=event.get("ok"),
        degraded_reasons=tuple(r for r in reasons if isinstance(r, dict))
        if isinstance(reasons, list)
        else (),
        transcript=event.get("transcript") if isinstance(event.get("transcript"), str) else None,
    )


def _from_name(session_id: str, path: Path) -> SessionSummary:
    """A session known only by its transcript: its tool and time from the file's name, the rest
    when the transcript is read."""
    _, tool, clock, _ = path.stem.rsplit("-", 3)
    day = path.parent.name
    started = f"{day}T{clock[0:2]}:{clock[2:4]}:{clock[4:6]}.{clock[6:]}+00:00" if len(clock) == 12 else day
    return SessionSummary(session_id, tool, started, status="ended", transcript=str(path))


def _from_result(row: SessionSummary, result: Any) -> SessionSummary:
    """What the log would have said of a session known only by its transcript."""
    if not isinstance(result, dict):
        return row
    reasons = [r for r in result.get("degraded_reasons") or () if isinstance(r, dict)]
    usage = result.get("usage") if isinstance(result.get("usage"), dict) else {}
    return dataclasses.replace(
        row,
        status="degraded" if result.get("degraded") else "ok",
        degraded_reasons=tuple(reasons),
        cost_usd=(usage or {}).get("cost_usd"),
        duration_ms=result.get("latency_ms"),
    )
