"""`conclave tail`: the pure filter and formatter, then the command as a subprocess (filters, raw
JSON, the backlog size, and `--follow` picking up appended lines)."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from conclave.app.tail import Filters, Follower, format_event, matches

TS = "2025-05-02T09:30:01.250000+00:00"
EVENTS: list[dict[str, Any]] = [
    {
        "ts": TS,
        "event": "session_start",
        "session_id": "s-aaaa1111",
        "tool": "confer",
        "providers": ["alpha", "beta"],
        "dry_run": False,
    },
    {
        "ts": TS,
        "event": "provider_call",
        "session_id": "s-aaaa1111",
        "provider": "alpha",
        "kind": "openai",
        "model": "m-a",
        "status": "ok",
        "attempts": 1,
        "latency_ms": 1234.5,
        "cost_usd": 0.00042,
        "usage": {"input_tokens": 10, "output_tokens": 5},
    },
    {
        "ts": TS,
        "event": "provider_call",
        "session_id": "s-aaaa1111",
        "provider": "beta",
        "kind": "anthropic",
        "model": "m-b",
        "status": "error",
        "attempts": 3,
        "latency_ms": 80.0,
        "code": "server_error",
        "http_status": 500,
    },
    {
        "ts": TS,
        "event": "fetch_blocked",
        "session_id": "s-bbbb2222",
        "reason": "private_address",
        "detail": "10.0.0.1 is private",
        "host": "intranet",
    },
    {
        "ts": TS,
        "event": "session_end",
        "session_id": "s-aaaa1111",
        "tool": "confer",
        "status": "degraded",
        "duration_ms": 2500.0,
        "usage": {"cost_usd": 0.00042},
    },
    {
        "ts": TS,
        "event": "breaker_open",
        "provider": "beta",
        "consecutive_failures": 5,
        "cooldown_seconds": 30,
    },
]


def conclave(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "conclave", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def logdir(tmp_path: Path) -> Path:
    (tmp_path / "config.yaml").write_text("telemetry: {path: logs/events.ndjson}\n", encoding="utf-8")
    (tmp_path / "logs").mkdir()
    lines = [json.dumps(event) for event in EVENTS]
    (tmp_path / "logs" / "events.ndjson").write_text(
        "\n".join(lines) + "\nnot json at all\n", encoding="utf-8"
    )
    return tmp_path


# ---------------------------------------------------------------- matches


def test_no_filter_matches_everything() -> None:
    assert all(matches(event, Filters()) for event in EVENTS)


def test_a_session_filter_matches_the_id_or_a_prefix_of_it() -> None:
    assert [e["event"] for e in EVENTS if matches(e, Filters(sessions=("s-aaaa",)))] == [
        "session_start",
        "provider_call",
        "provider_call",
        "session_end",
    ]
    assert not matches(EVENTS[5], Filters(sessions=("s-aaaa1111",))), "no session_id: no match"


def test_a_provider_filter_matches_the_provider_or_the_session_start_list() -> None:
    chosen = [e["event"] for e in EVENTS if matches(e, Filters(providers=("beta",)))]
    assert chosen == ["session_start", "provider_call", "breaker_open"]


def test_filters_combine_and_each_accepts_alternatives() -> None:
    both = Filters(sessions=("s-aaaa1111",), events=("provider_call",), providers=("beta",))
    assert [e.get("provider") for e in EVENTS if matches(e, both)] == ["beta"]
    either = Filters.parse(None, "fetch_blocked, breaker_open", None)
    assert [e["event"] for e in EVENTS if matches(e, either)] == ["fetch_blocked", "breaker_open"]


# ---------------------------------------------------------------- format_event


def test_a_provider_call_line_shows_status_latency_and_cost() -> None:
    line = format_event(EVENTS[1])
    assert line.startswith("09:30:01.250Z  provider_call")
    assert "s-aaaa1111" in line and "alpha" in line
    assert "ok 1.23 s $0.000420" in line and "tokens=10/5" in line


def test_a_failed_provider_call_line_shows_its_code_and_attempts() -> None:
    line = format_event(EVENTS[2])
    assert "error 80 ms" in line and "attempts=3" in line and "code=server_error http_status=500" in line


def test_a_fetch_blocked_line_shows_the_reason() -> None:
    line = format_event(EVENTS[3])
    assert "fetch_blocked" in line and "private_address" in line and "host=intranet" in line


def test_a_session_end_line_shows_status_duration_and_cost() -> None:
    line = format_event(EVENTS[4])
    assert "tool=confer degraded 2.50 s $0.000420" in line


def test_an_unknown_event_shows_its_scalar_fields() -> None:
    line = format_event(
        {"ts": TS, "event": "rpc_error", "code": -32603, "method": "confer", "data": {"x": 1}}
    )
    assert "rpc_error" in line and "code=-32603" in line and "method=confer" in line and "data" not in line


def test_colour_only_when_asked() -> None:
    assert "\x1b[" in format_event(EVENTS[3], colour=True)
    assert "\x1b[" not in format_event(EVENTS[3], colour=False)


def test_a_long_session_id_is_shortened_but_still_a_usable_prefix() -> None:
    event = {"ts": TS, "event": "session_start", "session_id": "s-0123456789abcdef01234567"}
    shown = format_event(event).split()[2]
    assert shown.endswith("…") and event["session_id"].startswith(shown.rstrip("…"))


# ---------------------------------------------------------------- the follower


def test_the_follower_returns_only_whole_new_lines_and_survives_truncation(tmp_path: Path) -> None:
    path = tmp_path / "events.ndjson"
    path.write_bytes(b'{"a": 1}\n')
    follower = Follower(path, offset=path.stat().st_size)
    assert follower.poll() == []
    with path.open("ab") as handle:
        handle.write(b'{"b": 2}\n{"c": ')
    assert follower.poll() == [b'{"b": 2}']
    with path.open("ab") as handle:
        handle.write(b"3}\n")
    assert follower.poll() == [b'{"c": 3}']
    path.write_bytes(b'{"d": 4}\n')  # truncated and rewritten, as a rotation would
    assert follower.poll() == [b'{"d": 4}']


# ---------------------------------------------------------------- the command


def test_tail_prints_one_readable_line_per_event_skipping_garbage(logdir: Path) -> None:
    result = conclave("tail", cwd=logdir)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[1] for line in lines] == [e["event"] for e in EVENTS]
    assert "\x1b[" not in result.stdout


def test_tail_filters_by_session_event_and_provider(logdir: Path) -> None:
    result = conclave(
        "tail", "--session", "s-aaaa", "--event", "provider_call", "--provider", "alpha", cwd=logdir
    )
    assert result.returncode == 0
    assert len(result.stdout.splitlines()) == 1 and "alpha" in result.stdout


def test_tail_json_prints_the_raw_lines(logdir: Path) -> None:
    result = conclave("tail", "--json", "--session", "s-bbbb2222", cwd=logdir)
    assert result.returncode == 0
    assert result.stdout == json.dumps(EVENTS[3]) + "\n"


def test_tail_lines_limits_the_backlog(logdir: Path) -> None:
    result = conclave("tail", "--lines", "2", "--json", cwd=logdir)
    assert [json.loads(line)["event"] for line in result.stdout.splitlines()] == [
        "session_end",
        "breaker_open",
    ]
    assert conclave("tail", "--lines", "many", cwd=logdir).returncode == 2


def test_tail_without_a_log_says_so_and_exits_1(tmp_path: Path) -> None:
    result = conclave("tail", cwd=tmp_path)
    assert result.returncode == 1
    assert "no event log at .conclave/events.ndjson" in result.stderr


class Reader:
    """Lines from a pipe, read in a thread so the test can wait with a timeout."""

    def __init__(self, stream: Any) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: Any) -> None:
        for line in stream:
            self.lines.put(line)

    def next(self) -> str:
        return self.lines.get(timeout=20)


def follow(cwd: Path, *args: str) -> subprocess.Popen[str]:
    # A suite started in the background by a non-interactive shell (`.ci/run &`) ignores SIGINT,
    # and an ignored signal stays ignored across exec: the follower would never see the Ctrl-C
    # `stop` sends. A handled signal is reset to its default at exec, so the child gets that.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "conclave", "tail", "--follow", *args],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        signal.signal(signal.SIGINT, previous)


def stop(process: subprocess.Popen[str]) -> tuple[int, str]:
    """Ctrl-C, as a user would; a follow stops cleanly with status 0."""
    process.send_signal(signal.SIGINT)
    try:
        _, err = process.communicate(timeout=20)
    finally:
        process.kill()
    return process.returncode, err


def test_tail_follow_picks_up_an_appended_line_and_stops_cleanly_on_ctrl_c(logdir: Path) -> None:
    process = follow(logdir, "--event", "breaker_open,breaker_closed", "--json")
    reader = Reader(process.stdout)
    assert json.loads(reader.next())["event"] == "breaker_open"
    closed = {"ts": TS, "event": "breaker_closed", "provider": "beta"}
    with (logdir / "logs" / "events.ndjson").open("a", encoding="utf-8") as handle:
        handle.write(json.dumps({"ts": TS, "event": "fetch", "host": "x"}) + "\n")  # filtered out
        handle.write(json.dumps(closed) + "\n")
    assert json.loads(reader.next()) == closed
    status, err = stop(process)
    assert status == 0 and "Traceback" not in err


def test_tail_follow_waits_for_a_missing_log_with_a_note(tmp_path: Path) -> None:
    process = follow(tmp_path)
    reader = Reader(process.stdout)
    assert process.stderr is not None
    assert "waiting for .conclave/events.ndjson" in process.stderr.readline()
    (tmp_path / ".conclave").mkdir()
    line = json.dumps({"ts": TS, "event": "session_start", "session_id": "s-new", "tool": "confer"})
    (tmp_path / ".conclave" / "events.ndjson").write_text(line + "\n", encoding="utf-8")
    assert "session_start" in reader.next()
    status, _ = stop(process)
    assert status == 0
