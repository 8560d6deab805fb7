"""`conclave tail`: read (and follow) the ndjson event log, filtered by session, event and provider.

The pure parts (`matches`, `format_event`, `Filters`) are what tests and the demo call directly; the
rest is file reading: the backlog (the last N matching lines), then, with `follow`, new lines as they
are appended, polling the file every 0.2 s and reopening it when it is replaced or truncated.
"""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

import orjson

from conclave.app.render import Style, fmt_cost, fmt_ms

POLL_SECONDS = 0.2
SESSION_SHORT = 20  # enough to tell sessions apart on a screen; filters accept any prefix

# Events that mean something went wrong (red) or deserves a look (yellow).
_ALARMS = frozenset(
    {
        "fetch_blocked",
        "breaker_open",
        "canary_leak",
        "worker_forged_tool_output",
        "egress_budget_exhausted",
        "worker_inner_validation_fail",
        "worker_hop_budget_exhausted",
        "role_envelope_invalid",
        "answer_invalid",
        "rpc_error",
        "state_backend_unavailable",
    }
)
_NOTICES = frozenset(
    {
        "provider_retry",
        "provider_stream_refused",
        "worker_tool_cost_warning",
        "breaker_closed",
        "state_backend_restored",
    }
)
_HEADER_FIELDS = frozenset({"ts", "event", "session_id", "provider", "role"})


@dataclass(frozen=True, slots=True)
class Filters:
    """Each field holds accepted values (any one may match); an empty field accepts everything.
    Filters of different fields combine: an event must pass every one."""

    sessions: tuple[str, ...] = ()
    events: tuple[str, ...] = ()
    providers: tuple[str, ...] = ()

    @classmethod
    def parse(cls, session: str | None, event: str | None, provider: str | None) -> Filters:
        """From CLI values; each may be a comma-separated list."""
        return cls(_split(session), _split(event), _split(provider))


def _split(value: str | None) -> tuple[str, ...]:
    return tuple(part.strip() for part in (value or "").split(",") if part.strip())


def matches(event: Mapping[str, Any], filters: Filters) -> bool:
    """Whether `event` passes every filter. A session filter matches an id or a prefix of it (so the
    short ids `tail` prints work); a provider filter matches `provider`, or one of `providers` on
    session_start."""
    if filters.events and event.get("event") not in filters.events:
        return False
    if filters.sessions and not _session_matches(event.get("session_id"), filters.sessions):
        return False
    return not filters.providers or bool(_providers_of(event) & set(filters.providers))


def _session_matches(session_id: Any, wanted: Sequence[str]) -> bool:
    return isinstance(session_id, str) and any(session_id.startswith(w) for w in wanted)


def _providers_of(event: Mapping[str, Any]) -> set[str]:
    names = {event["provider"]} if isinstance(event.get("provider"), str) else set()
    listed = event.get("providers")
    if isinstance(listed, list):
        names |= {n for n in listed if isinstance(n, str)}
    return names


# ---------------------------------------------------------------- one event, one line


def format_event(event: Mapping[str, Any], colour: bool = False) -> str:
    """One readable line: time, event, short session, provider/role, then the fields that matter."""
    style = Style(colour)
    name = str(event.get("event", "?"))
    columns = [
        style.dim(_clock(event.get("ts"))),
        _paint_name(name.ljust(26), name, style),
        style.dim(_short(event.get("session_id")).ljust(SESSION_SHORT)),
        _who(event).ljust(22),
        " ".join(_details(name, event, style)),
    ]
    return "  ".join(columns).rstrip()


def _clock(ts: Any) -> str:
    """The UTC time of day with milliseconds: the log's own clock, unambiguous across machines."""
    try:
        stamp = datetime.fromisoformat(str(ts))
    except ValueError:
        return str(ts)[:13].ljust(13)
    return stamp.strftime("%H:%M:%S.%f")[:12] + "Z"


def _paint_name(padded: str, name: str, style: Style) -> str:
    if name in _ALARMS:
        return style.bad(padded)
    if name in _NOTICES:
        return style.warn(padded)
    return style.bold(padded) if name.startswith("session_") else padded


def _short(session_id: Any) -> str:
    if not isinstance(session_id, str):
        return "-"
    return session_id if len(session_id) <= SESSION_SHORT else session_id[: SESSION_SHORT - 1] + "…"


def _who(event: Mapping[str, Any]) -> str:
    provider = event.get("provider")
    role = event.get("role")
    return f"{provider or '-'}/{role}" if role else str(provider or "-")


def _details(name: str, event: Mapping[str, Any], style: Style) -> list[str]:
    describe = _DESCRIBERS.get(name)
    if describe is None:
        return _generic(event)
    return describe(event, style)


def _generic(event: Mapping[str, Any]) -> list[str]:
    """An event this version does not know: its scalar fields, as key=value."""
    return [
        f"{key}={value}"
        for key, value in event.items()
        if key not in _HEADER_FIELDS and isinstance(value, str | int | float | bool)
    ]


def _pairs(event: Mapping[str, Any], *keys: str) -> list[str]:
    return [f"{key}={event[key]}" for key in keys if event.get(key) is not None]


def _provider_call(event: Mapping[str, Any], style: Style) -> list[str]:
    status = str(event.get("status"))
    parts = [style.status(status), fmt_ms(event.get("latency_ms")), fmt_cost(event.get("cost_usd"))]
    parts.append(f"model={event.get('reported_model') or event.get('model')}")
    usage = event.get("usage")
    if isinstance(usage, dict):
        parts.append(f"tokens={usage.get('input_tokens') or 0}/{usage.get('output_tokens') or 0}")
    if (event.get("attempts") or 1) > 1:
        parts.append(f"attempts={event['attempts']}")
    return parts + _pairs(event, "code", "http_status", "finish_reason")


def _provider_retry(event: Mapping[str, Any], _style: Style) -> list[str]:
    return [*_pairs(event, "attempt", "code", "http_status"), f"wait={event.get('delay_seconds')}s"]


def _breaker_open(event: Mapping[str, Any], _style: Style) -> list[str]:
    return [*_pairs(event, "consecutive_failures"), f"cooldown={event.get('cooldown_seconds')}s"]


def _fetch(event: Mapping[str, Any], _style: Style) -> list[str]:
    size = f"{event.get('bytes')} bytes"
    parts = [*_pairs(event, "host", "status"), size, fmt_ms(event.get("duration_ms"))]
    return parts + (["truncated"] if event.get("truncated") else []) + _pairs(event, "redirects")


def _fetch_blocked(event: Mapping[str, Any], style: Style) -> list[str]:
    return [style.bad(str(event.get("reason"))), *_pairs(event, "host", "detail")]


def _session_start(event: Mapping[str, Any], _style: Style) -> list[str]:
    parts = _pairs(event, "tool", "rounds")
    if isinstance(event.get("providers"), list):
        parts.append(f"providers={','.join(str(p) for p in event['providers'])}")
    if event.get("worker_tools"):
        parts.append(f"worker_tools={','.join(event['worker_tools'])}")
    return parts + (["dry_run"] if event.get("dry_run") else [])


def _session_end(event: Mapping[str, Any], style: Style) -> list[str]:
    status = str(event.get("status"))
    usage = event.get("usage") if isinstance(event.get("usage"), dict) else {}
    parts = [f"tool={event.get('tool')}", style.status(status) if status != "dry_run" else status]
    parts += [fmt_ms(event.get("duration_ms")), fmt_cost((usage or {}).get("cost_usd"))]
    if event.get("answers") is not None:
        parts.append(f"ok={event.get('ok')}/{event.get('answers')}")
    return parts


def _inner_call(event: Mapping[str, Any], style: Style) -> list[str]:
    status = str(event.get("status"))
    parts = [f"hop={event.get('hop')}", f"tool={event.get('tool')}", style.status(status)]
    return parts + _pairs(event, "reason") + [fmt_ms(event.get("duration_ms")), f"{event.get('bytes')} bytes"]


def _fields(*keys: str) -> Callable[[Mapping[str, Any], Style], list[str]]:
    def describe(event: Mapping[str, Any], _style: Style) -> list[str]:
        return _pairs(event, *keys)

    return describe


_DESCRIBERS: dict[str, Callable[[Mapping[str, Any], Style], list[str]]] = {
    "provider_call": _provider_call,
    "provider_retry": _provider_retry,
    "breaker_open": _breaker_open,
    "breaker_closed": _fields(),
    "provider_stream_refused": _fields("kind"),
    "fetch": _fetch,
    "fetch_blocked": _fetch_blocked,
    "session_start": _session_start,
    "session_end": _session_end,
    "worker_inner_call": _inner_call,
    "worker_inner_validation_fail": _fields("hop", "tool", "path", "message"),
    "worker_hop_budget_exhausted": _fields("hop", "limit"),
    "worker_tool_cost_warning": _fields("mode", "cap_usd", "observed_usd"),
    "egress_budget_exhausted": _fields("tool", "used_bytes", "max_bytes", "requests", "max_requests"),
    "role_envelope_invalid": _fields("round", "attempt", "final", "error"),
    "answer_invalid": _fields("attempt", "final", "error"),
    "vote": _fields("consensus", "reason", "not_counted"),
    "canary_leak": _fields("what"),
    "worker_forged_tool_output": _fields("action", "kinds", "echo", "model_call", "error"),
    "state_backend_unavailable": _fields("backend", "error", "fallback"),
    "state_backend_restored": _fields("backend", "outage_seconds"),
}


# ---------------------------------------------------------------- reading the file


def parse_line(line: bytes) -> dict[str, Any] | None:
    """An event object, or None for a line that is not one (a torn or foreign line is skipped)."""
    try:
        event = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return event if isinstance(event, dict) else None


def backlog(
    path: Path, filters: Filters, lines: int | None
) -> tuple[list[tuple[bytes, dict[str, Any]]], int]:
    """The last `lines` matching events (all when None) and the offset after the last whole line."""
    kept: collections.deque[tuple[bytes, dict[str, Any]]] = collections.deque(maxlen=lines)
    offset = 0
    with path.open("rb") as handle:
        for raw in handle:
            if not raw.endswith(b"\n"):
                break  # being written right now: `follow` picks it up once whole
            offset += len(raw)
            event = parse_line(raw)
            if event is not None and matches(event, filters):
                kept.append((raw.rstrip(b"\n"), event))
    return list(kept), offset


class Follower:
    """New whole lines appended to `path` since `offset`; reopens the file when it is replaced
    (a new inode) or truncated, so log rotation does not stall the tail."""

    def __init__(self, path: Path, offset: int) -> None:
        self.path = path
        self.offset = offset
        self.partial = b""
        self.inode = _inode(path)

    def poll(self) -> list[bytes]:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return []
        if stat.st_ino != self.inode or stat.st_size < self.offset:
            self.inode, self.offset, self.partial = stat.st_ino, 0, b""
        if stat.st_size == self.offset:
            return []
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            chunk = handle.read()
        self.offset += len(chunk)
        *whole, self.partial = (self.partial + chunk).split(b"\n")
        return [line for line in whole if line]


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except FileNotFoundError:
        return None


@dataclass
class TailOptions:
    filters: Filters
    json: bool = False
    lines: int | None = 20
    follow: bool = False
    colour: bool = False
    poll_seconds: float = POLL_SECONDS


def run_tail(path: Path, options: TailOptions, out: TextIO, err: TextIO) -> int:
    """The command: 0 when done (or stopped with Ctrl-C while following), 1 when there is no log."""
    show = _printer(options, out)
    try:
        if not path.exists():
            if not options.follow:
                print(f"conclave tail: no event log at {path} yet (nothing has run here)", file=err)
                return 1
            print(f"conclave tail: waiting for {path} to appear (Ctrl-C to stop)", file=err)
            _wait_for(path, options.poll_seconds)
            offset = 0
        else:
            shown, offset = backlog(path, options.filters, options.lines)
            for raw, event in shown:
                show(raw, event)
        if options.follow:
            _follow(Follower(path, offset), options, show)
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a follow ends: not an error
    except BrokenPipeError:
        _silence_stdout()  # the reader went away (`| head`): stop quietly
    return 0


def _printer(options: TailOptions, out: TextIO) -> Callable[[bytes, dict[str, Any]], None]:
    def show(raw: bytes, event: dict[str, Any]) -> None:
        text = raw.decode("utf-8", "replace") if options.json else format_event(event, options.colour)
        out.write(text + "\n")
        out.flush()  # a follower is read live, through pipes too

    return show


def _wait_for(path: Path, seconds: float) -> None:
    while not path.exists():
        time.sleep(seconds)


def _follow(follower: Follower, options: TailOptions, show: Callable[[bytes, dict[str, Any]], None]) -> None:
    while True:
        for raw, event in _matching(follower.poll(), options.filters):
            show(raw, event)
        time.sleep(options.poll_seconds)


def _matching(lines: Sequence[bytes], filters: Filters) -> Iterator[tuple[bytes, dict[str, Any]]]:
    for raw in lines:
        event = parse_line(raw)
        if event is not None and matches(event, filters):
            yield raw, event


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
