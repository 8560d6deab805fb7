"""The event log's own mechanics (timestamps, redaction of serialized lines, what is written), and
what a confer writes to it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest

from conclave.app.runtime import open_runtime
from conclave.app.sim import Reply, Scenario, SimPanel
from conclave.deliberation.confer import confer
from conclave.obs.redact import REDACTED, Redactor
from conclave.obs.telemetry import Telemetry, UtcStamp, session
from conclave.schema.config import Config
from tests.support import read_events

SECRET = "configured-0123456789-secret"  # no credential shape: only the configured value can catch it


def isoformat_of(ns: int) -> str:
    seconds, nanos = divmod(ns, 1_000_000_000)
    moment = datetime.fromtimestamp(seconds, UTC).replace(microsecond=nanos // 1000)
    return moment.isoformat(timespec="microseconds")


@pytest.mark.parametrize(
    "instants",
    [
        [0, 999_999_999, 1_000_000_000],  # the epoch, and the first second boundary
        [1_764_000_000_123_456_789, 1_764_000_000_999_999_000, 1_764_000_001_000_001_000],
        [
            1_764_000_059_500_000_000,
            1_764_000_060_000_000_000,
            1_764_000_059_999_000_000,
        ],  # a clock step back
        [1_767_225_599_999_999_999, 1_767_225_600_000_000_000],  # a new year
    ],
)
def test_a_stamp_is_what_isoformat_writes_across_second_boundaries(instants: list[int]) -> None:
    clock = iter(instants)
    stamp = UtcStamp(lambda: next(clock))

    assert [stamp() for _ in instants] == [isoformat_of(ns) for ns in instants]


def test_an_event_line_carries_a_utc_timestamp_its_session_and_no_content(tmp_path: Path) -> None:
    path = tmp_path / "events.ndjson"
    telemetry = Telemetry(path)
    before = datetime.now(UTC)
    with session("s-abc"):
        telemetry.emit("session_start", tool="confer", question="a question that must not be logged")
        telemetry.flush()
    after = datetime.now(UTC)
    telemetry.close()

    (event,) = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    stamped = datetime.fromisoformat(event["ts"])
    assert stamped.utcoffset() is not None and stamped.utcoffset().total_seconds() == 0
    assert before <= stamped <= after
    assert event["ts"].endswith("+00:00") and len(event["ts"].split(".")[1]) == len("123456+00:00")
    assert event["session_id"] == "s-abc"
    assert event["event"] == "session_start"
    assert "question" not in event


def test_an_event_keeps_a_session_it_names_itself_has_none_outside_one_and_keeps_content_when_asked(
    tmp_path: Path,
) -> None:
    path = tmp_path / "events.ndjson"
    telemetry = Telemetry(path, include_content=True)
    telemetry.emit("rpc_error", code=-32700)
    with session("s-bound"):
        telemetry.emit("fetch", session_id="s-named", url="https://example.org/")
        telemetry.emit("session_start", tool="confer", question="kept: include_content is on")
    telemetry.close()

    outside, named, bound = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert "session_id" not in outside and outside["code"] == -32700
    assert named["session_id"] == "s-named"
    assert bound["session_id"] == "s-bound" and bound["question"] == "kept: include_content is on"
    assert list(bound)[:2] == ["ts", "session_id"] and list(bound)[-1] == "event"


def test_every_line_of_a_batch_is_redacted_when_the_batch_is_written(tmp_path: Path) -> None:
    """The sink redacts a session's lines together as it writes them: a secret, a sensitive
    field and a credential shape in different lines of one batch must all go, and every other
    line must come out as it went in."""
    path = tmp_path / "events.ndjson"
    telemetry = Telemetry(path, secrets=[SECRET])
    with session("s-batch"):
        telemetry.emit("session_start", tool="confer")
        started = path.read_bytes()  # written at once: the page shows the session running
        telemetry.emit("provider_call", provider="m1", error=f"echoed {SECRET}")
        telemetry.emit("provider_call", provider="m2", headers={"X-Api-Key": "k-0123456789"})
        telemetry.emit("provider_call", provider="m3", error="upstream said: Bearer abcdefgh12345678")
        written_before_the_session_ended = path.read_bytes()
        telemetry.emit("session_end", tool="confer", status="ok")
    telemetry.close()

    assert b'"session_start"' in started
    assert written_before_the_session_ended == started  # one batch, or this test proves nothing
    raw = path.read_bytes()
    assert SECRET.encode() not in raw and b"k-0123456789" not in raw and b"abcdefgh12345678" not in raw
    start, echoed, headers, shaped, end = [orjson.loads(line) for line in raw.splitlines()]
    assert echoed["error"] == "echoed [REDACTED]"
    assert headers["headers"] == {"X-Api-Key": "[REDACTED]"}
    assert shaped["error"] == "upstream said: [REDACTED]"
    assert (start["event"], start["tool"], end["event"], end["status"]) == (
        "session_start",
        "confer",
        "session_end",
        "ok",
    )
    assert {e["session_id"] for e in (start, echoed, headers, shaped, end)} == {"s-batch"}


def test_a_configured_secret_is_masked_in_a_line_that_also_holds_non_ascii_text() -> None:
    line = orjson.dumps({"text": f"Schlüssel: {SECRET} — ende", "note": "ok"})

    redacted = orjson.loads(Redactor([SECRET]).json_bytes(line))

    assert redacted == {"text": "Schlüssel: [REDACTED] — ende", "note": "ok"}


def test_a_secret_in_an_encoded_spelling_is_masked_too() -> None:
    encoded = SECRET.encode().hex()
    line = orjson.dumps({"echo": f"key as hex {encoded}"})

    redacted = Redactor([SECRET]).json_bytes(line)

    assert encoded.encode() not in redacted
    assert orjson.loads(redacted) == {"echo": "key as hex [REDACTED]"}


def test_a_line_with_nothing_to_redact_comes_back_as_the_same_bytes() -> None:
    line = orjson.dumps({"event": "provider_call", "provider": "m1", "text": "Grüße, no secrets here"})

    assert Redactor([SECRET]).json_bytes(line) is line


@pytest.mark.parametrize(
    ("shape", "credential"),
    [
        ("Bearer abcdefgh12345678", "abcdefgh12345678"),
        ("BEARER\tabcdefgh12345678", "abcdefgh12345678"),
        ("AIza" + "x" * 35, "x" * 35),
        ("AIza" + "B7c6" * 9, "B7c6" * 9),
        ("https://h/p?key=zzz", "zzz"),
        ("https://h/p?a=1&key=Q1w2", "Q1w2"),
        ("sk-" + "A1b2" * 5, "A1b2" * 5),
        ("xai-" + "Q9w8" * 6, "Q9w8" * 6),
    ],
)
def test_a_credential_shape_in_any_case_of_its_trigger_is_masked(shape: str, credential: str) -> None:
    """Each shape alone in a line: json_bytes looks for some triggers only where a rare byte
    of theirs (z, x, =) occurs, so each must be caught with no other trigger beside it."""
    line = orjson.dumps({"error": f"upstream said: {shape} (end)"})

    redacted = orjson.loads(Redactor().json_bytes(line))

    assert credential not in redacted["error"]
    assert "[REDACTED]" in redacted["error"]
    assert redacted["error"].endswith("(end)")


@pytest.mark.anyio
@pytest.mark.parametrize("include_content", [True, False])
async def test_an_answer_is_on_its_provider_call_event_redacted_only_when_content_is_included(
    make_config: Callable[..., Config], events_path: Path, tmp_path: Path, include_content: bool
) -> None:
    answer = f"Option 2. (The key I was sent: {SECRET}.)"
    async with SimPanel() as panel:
        panel.set_scenario("m-a", Scenario(replies=(Reply(text=answer),)))
        entry = {
            "kind": "openai",
            "model": "m-a",
            "base_url": panel.base_url("openai"),
            "api_key_env": "A_KEY",
        }
        config = make_config(
            {"a": entry},
            env={"A_KEY": SECRET},
            telemetry={"path": str(events_path), "include_content": include_content},
            transcripts={"dir": str(tmp_path / "transcripts")},
        )
        async with open_runtime(config) as rt:
            result = await confer(rt, {"question": "Which option?"})

    assert result.answers[0].text == answer
    (call,) = [e for e in read_events(events_path) if e["event"] == "provider_call"]
    if include_content:
        assert call["text"] == f"Option 2. (The key I was sent: {REDACTED}.)"
    else:
        assert "text" not in call
    assert SECRET not in events_path.read_text()
