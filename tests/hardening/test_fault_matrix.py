"""F7 item 1, the fault matrix: every wire format x every provider fault, through `confer` and
`coordinate`, on the simulated panel over loopback HTTP.

One panel member (`faulty`, of the cell's wire kind) misbehaves; three healthy members (one per
wire kind) answer normally. In `coordinate` the faulty member is one of the two critics. Each
cell asserts that:
- the call returns by its deadline (`anyio.fail_after(deadline + margin)` around it);
- the faulty member carries a precise status and error code (and the HTTP status, if any);
- every other member stands (`ok`, with its envelope in `coordinate`);
- `degraded` is true with exactly one reason, naming the faulty member (a fault that retrying
  cures leaves the result whole instead);
- the event log has one `provider_retry` per retry for retryable faults (none for the others,
  none for healthy members), and `breaker_open` for faults that count against the provider
  (`breakers.failure_threshold` is 1 here), after which the next call fails fast as
  `breaker_open` without reaching the panel.

`CELLS` is the matrix as data (`cell.id` is also the pytest id). The last test records the figure
"fault matrix: cells handled" (cells that passed / applicable cells) for `scripts/hardening`.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

from conclave.app.runtime import Runtime, open_runtime
from conclave.app.sim import NativeCall, Reply, Scenario, SimPanel
from conclave.app.sim.server import BASE_PATHS
from conclave.deliberation.confer import confer
from conclave.deliberation.coordinate import coordinate
from conclave.schema.config import Config
from conclave.schema.schemas import first_error
from tests.hardening.figures import record
from tests.support import read_events

pytestmark = pytest.mark.anyio

KINDS = ("openai", "anthropic", "gemini")
# A "+tags" / "+native" door is confer with the worker tool `verify` in that encoding: every
# healthy member makes one verify call first, and the faulty member's fault hits the follow-up
# request that carries its tool call and result back (the first request, for the faults that
# act on every request: hangs and a refused connection).
DOORS = ("confer", "coordinate", "confer+tags", "confer+native")
FAULTY = "faulty"
HEALTHY = ("h-openai", "h-anthropic", "h-gemini")
MAX_ATTEMPTS = 2
DEADLINE_SECONDS = 6.0  # the call's own timeout_seconds
MARGIN_SECONDS = 2.0  # what fail_after allows on top of it
ATTEMPT_TIMEOUT_SECONDS = 0.4  # limits.retry.attempt_timeout_seconds in the read-timeout cells
HUNG_MS = 5000.0  # a reply that never comes within one attempt
HINT_SECONDS = 0.02  # the short Retry-After the 429 cells send
PRICE = {"input_per_mtok": 1.0, "output_per_mtok": 4.0}

PROPOSAL = {"proposal": "Use PostgreSQL for the ledger.", "rationale": "Transactions.", "confidence": 0.7}
CRITIQUE = {"verdict": "accept", "issues": [{"severity": "minor", "description": "Naming."}]}
SYNTHESIS = {"answer": "PostgreSQL.", "confidence": 0.8, "resolved": ["storage"], "dissent": []}
GEMINI_DAILY_QUOTA = "GenerateRequestsPerDayPerProjectPerModel-FreeTier"
GOOD = Reply(model="<the door's good answer>")  # placeholder in a script, replaced per door


@dataclass(frozen=True, slots=True)
class Expect:
    """What the faulty member's answer and the event log must show."""

    status: str  # the answer's status
    code: str | None  # the answer's error code (None when it recovers)
    http_status: int | None  # error.status, when the fault came with one
    retried: bool  # MAX_ATTEMPTS - 1 provider_retry events, each with retry_code
    trips_breaker: bool  # breaker_open with failure_threshold 1, then fail-fast
    retry_code: str | None = None
    retry_delay: float | None = None  # the hinted delay each provider_retry must carry
    recovers: bool = False  # the member stands after its retry; the result is whole


@dataclass(frozen=True, slots=True)
class Cell:
    kind: str
    fault: str
    door: str
    expect: Expect | None  # None: not applicable
    replies: tuple[Reply, ...] = ()
    latency_ms: float | None = None
    refused: bool = False  # the member points at a closed loopback port
    not_applicable: str | None = None
    notes: str = field(default="", compare=False)

    @property
    def id(self) -> str:
        return f"{self.door}-{self.kind}-{self.fault}"


def _retrying(status: str, code: str, http: int | None, **extra: Any) -> Expect:
    return Expect(status, code, http, retried=True, trips_breaker=True, retry_code=code, **extra)


def _hinted_429(kind: str) -> Reply:
    # OpenAI and Anthropic send the hint as a header (retry-after-ms, as the SDKs read it);
    # Gemini puts it in the body as google.rpc.RetryInfo.
    if kind == "gemini":
        return Reply(status=429, retry_delay=f"{HINT_SECONDS}s")
    return Reply(status=429, headers={"retry-after-ms": str(int(HINT_SECONDS * 1000))})


def _uncurable_quota(kind: str) -> tuple[Reply, Expect, str]:
    if kind == "openai":
        return (
            Reply(status=429, error_type="insufficient_quota"),
            Expect("error", "insufficient_quota", 429, retried=False, trips_breaker=False),
            "429 insufficient_quota",
        )
    if kind == "anthropic":
        # Anthropic has no uncurable 429: an exhausted credit balance is 402 billing_error.
        return (
            Reply(status=402),
            Expect("error", "insufficient_quota", 402, retried=False, trips_breaker=False),
            "Anthropic's form: 402 billing_error (no uncurable 429 exists)",
        )
    # Gemini: 429 RESOURCE_EXHAUSTED whose QuotaFailure names a per-day quota (sticky until
    # midnight), even though it also carries a RetryInfo.
    return (
        Reply(status=429, quota_id=GEMINI_DAILY_QUOTA, retry_delay="3s"),
        Expect("error", "quota_exhausted", 429, retried=False, trips_breaker=False),
        "Gemini's form: 429 RESOURCE_EXHAUSTED with a per-day QuotaFailure",
    )


# What each simulated wire's in-stream error says: OpenAI an error chunk (no status: 502), Anthropic an
# `overloaded_error` event (529), Gemini an error chunk with its status (503).
IN_STREAM_ERROR = {"openai": ("server_error", 502), "anthropic": ("overloaded", 529), "gemini": ("unavailable", 503)}


def _cells_for(kind: str, door: str) -> list[Cell]:
    quota_reply, quota_expect, quota_note = _uncurable_quota(kind)
    return [
        Cell(
            kind,
            "429_retry_after",
            door,
            _retrying("error", "rate_limited", 429, retry_delay=HINT_SECONDS),
            replies=(_hinted_429(kind),),
            notes="always 429: retried after the hinted delay, then fails",
        ),
        Cell(
            kind,
            "429_retry_after_once",
            door,
            Expect(
                "ok",
                None,
                None,
                retried=True,
                trips_breaker=False,
                retry_code="rate_limited",
                retry_delay=HINT_SECONDS,
                recovers=True,
            ),
            replies=(_hinted_429(kind), GOOD),
            notes="one 429: retried after the hinted delay, then answers",
        ),
        Cell(kind, "429_insufficient_quota", door, quota_expect, replies=(quota_reply,), notes=quota_note),
        Cell(kind, "500", door, _retrying("error", "server_error", 500), replies=(Reply(status=500),)),
        Cell(kind, "503", door, _retrying("error", "unavailable", 503), replies=(Reply(status=503),)),
        Cell(kind, "529", door, _retrying("error", "overloaded", 529), replies=(Reply(status=529),)),
        Cell(
            kind,
            "read_timeout",
            door,
            _retrying("timeout", "timeout", None),
            latency_ms=HUNG_MS,
            notes=f"no answer within attempt_timeout_seconds={ATTEMPT_TIMEOUT_SECONDS}",
        ),
        Cell(
            kind,
            "connect_refused",
            door,
            _retrying("error", "connection_error", None),
            refused=True,
            notes="base_url points at a closed loopback port",
        ),
        Cell(
            kind,
            "connection_dropped",
            door,
            _retrying("error", "connection_dropped", None),
            replies=(Reply(fault="drop"),),
            notes="200 with a promised body cut off mid-way",
        ),
        Cell(
            kind,
            "malformed_json",
            door,
            Expect("error", "malformed_response", 200, retried=False, trips_breaker=True),
            replies=(Reply(fault="malformed"),),
        ),
        Cell(
            kind,
            "missing_fields",
            door,
            Expect("error", "malformed_response", 200, retried=False, trips_breaker=True),
            replies=(Reply(fault="missing_fields"),),
            notes="valid JSON without choices/content/candidates",
        ),
        Cell(
            kind,
            "in_stream_error",
            door,
            _retrying("error", *IN_STREAM_ERROR[kind]),
            replies=(Reply(fault="stream_error"),),
            notes="200, half the answer streamed, then the wire's error event (an overload)",
        ),
    ]


CELLS: list[Cell] = [cell for door in DOORS for kind in KINDS for cell in _cells_for(kind, door)]
APPLICABLE: list[Cell] = [c for c in CELLS if c.not_applicable is None]
NOT_APPLICABLE: list[Cell] = [c for c in CELLS if c.not_applicable is not None]


_HANDLED: dict[str, bool] = {}  # cell id -> passed, filled as the cells run


def matrix_counts() -> dict[str, int]:
    """Totals for the report: cells, applicable cells, not-applicable cells."""
    return {"cells": len(CELLS), "applicable": len(APPLICABLE), "not_applicable": len(NOT_APPLICABLE)}


# -- running one cell ------------------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port  # closed again: connecting to it is refused


def _model(name: str) -> str:
    return f"m-{name}"


CHECK = {"checks": [{"type": "math", "expression": "6*7", "expected": 42}]}


def _mode(door: str) -> str | None:
    """The worker tool encoding a door uses, or None for a door without worker tools."""
    return door.partition("+")[2] or None


def _tool_call(door: str) -> tuple[Reply, ...]:
    """The verify call a member makes first in a door with worker tools."""
    mode = _mode(door)
    if mode == "native":
        return (Reply(tool_calls=(NativeCall("verify", CHECK),)),)
    if mode == "tags":
        return (Reply(text=f"<tool_call>{json.dumps({'name': 'verify', 'args': CHECK})}</tool_call>"),)
    return ()


def _fault_after_a_call(cell: Cell) -> bool:
    return _mode(cell.door) is not None and cell.latency_ms is None and not cell.refused


def _good_reply(door: str, name: str) -> Reply:
    if door.startswith("confer"):
        return Reply()
    envelope = {"h-openai": PROPOSAL, "h-gemini": SYNTHESIS}.get(name, CRITIQUE)
    return Reply(text=json.dumps(envelope))


def _scenarios(cell: Cell) -> dict[str, Scenario]:
    healthy = {n: (*_tool_call(cell.door), _good_reply(cell.door, n)) for n in HEALTHY}
    scenarios = {_model(n): Scenario(replies=replies) for n, replies in healthy.items()}
    good = _good_reply(cell.door, FAULTY)
    replies = tuple(good if r is GOOD else r for r in cell.replies) or (good,)
    if _fault_after_a_call(cell):
        replies = (*_tool_call(cell.door), *replies)
    scenarios[_model(FAULTY)] = Scenario(replies=replies, latency_ms=cell.latency_ms)
    return scenarios


@pytest.fixture
async def panel() -> AsyncIterator[SimPanel]:
    async with SimPanel() as sim:
        yield sim


def _config(make_config: Callable[..., Config], panel: SimPanel, cell: Cell, tmp_path: Path) -> Config:
    kinds = {"h-openai": "openai", "h-anthropic": "anthropic", "h-gemini": "gemini", FAULTY: cell.kind}
    providers: dict[str, dict[str, Any]] = {}
    for name, kind in kinds.items():
        base_url = panel.base_url(kind)  # type: ignore[arg-type]
        if name == FAULTY and cell.refused:
            base_url = f"http://127.0.0.1:{_closed_port()}{BASE_PATHS[kind]}"  # type: ignore[index]
        providers[name] = {"kind": kind, "model": _model(name), "base_url": base_url, "price": PRICE}
    retry: dict[str, Any] = {"max_attempts": MAX_ATTEMPTS}
    if cell.latency_ms is not None:
        retry["attempt_timeout_seconds"] = ATTEMPT_TIMEOUT_SECONDS
    return make_config(
        providers,
        retry=retry,
        breakers={"failure_threshold": 1, "cooldown_seconds": 300},
        roles={
            "proposer": "h-openai",
            "critics": [FAULTY, "h-anthropic"],
            "synthesizer": "h-gemini",
            "synthesizer_fallbacks": ["h-openai"],
        },
        transcripts={"dir": str(tmp_path / "transcripts")},
    )


async def _call(rt: Runtime, door: str, **args: Any) -> dict[str, Any]:
    """One call through `door`, which must come back by its deadline with a valid result."""
    mode = _mode(door)
    if mode is not None:
        args = {"worker_tools": ["verify"], "worker_tool_mode": mode, **args}
    with anyio.fail_after(DEADLINE_SECONDS + MARGIN_SECONDS):
        if door.startswith("confer"):
            asked = {"question": "Which queue should we use?", "timeout_seconds": DEADLINE_SECONDS, **args}
            result = (await confer(rt, asked)).to_dict()
        else:
            debated = {"task": "Pick a database for the ledger.", "timeout_seconds": DEADLINE_SECONDS, **args}
            result = (await coordinate(rt, debated)).to_dict()
    error = first_error(f"{door.partition('+')[0]}.output.json", result)
    assert error is None, f"{error.message} at {list(error.absolute_path)}" if error else ""
    return result


def _members(door: str, result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every member's answer by provider name (coordinate: the final round's roles)."""
    if door.startswith("confer"):
        return {a["provider"]: a for a in result["answers"]}
    roles = [result["proposal"], *result["critiques"], result["synthesis"]]
    return {a["provider"]: a for a in roles if a is not None}


def _check_healthy(door: str, members: dict[str, dict[str, Any]]) -> None:
    for name in HEALTHY:
        answer = members[name]
        assert (answer["status"], answer["error"]) == ("ok", None), f"{name} did not stand: {answer}"
        if door == "coordinate":
            assert answer["envelope"] is not None
        if _mode(door) is not None:  # the verify hop ran, in the door's encoding
            assert answer["tool_mode"] == _mode(door)
            assert answer["inner_tool_calls"] == [
                {"hop": 1, "name": "verify", "status": "ok", "reason": None}
            ]
    if door == "coordinate":
        assert members["h-gemini"]["role"] == "synthesizer"
        assert "fallback_from" not in members["h-gemini"]


def _check_faulty(cell: Cell, expect: Expect, result: dict[str, Any], answer: dict[str, Any]) -> None:
    assert answer["status"] == expect.status, answer
    role = "critic" if cell.door == "coordinate" else None
    if expect.recovers:
        assert answer["error"] is None
        assert result["degraded"] is False and result["degraded_reasons"] == []
        return
    assert answer["error"]["code"] == expect.code, answer["error"]
    assert answer["error"]["message"], "the error must say what happened"
    assert answer["error"].get("status") == expect.http_status, answer["error"]
    assert result["degraded"] is True
    assert result["degraded_reasons"] == [
        {"provider": FAULTY, "role": role, "status": expect.status, "code": expect.code}
    ]


def _check_events(cell: Cell, expect: Expect, events: list[dict[str, Any]]) -> None:
    retries = [e for e in events if e["event"] == "provider_retry"]
    assert all(e["provider"] == FAULTY for e in retries), "a healthy member was retried"
    if expect.retried:
        assert len(retries) == MAX_ATTEMPTS - 1
        assert {e["code"] for e in retries} == {expect.retry_code}
        if expect.retry_delay is not None:
            assert {e["delay_seconds"] for e in retries} == {expect.retry_delay}
    else:
        assert retries == []
    opened = [e["provider"] for e in events if e["event"] == "breaker_open"]
    assert opened == ([FAULTY] if expect.trips_breaker else [])
    calls = [e for e in events if e["event"] == "provider_call" and e["provider"] == FAULTY]
    if _fault_after_a_call(cell):  # the tool call's request went through first
        assert (calls[0]["status"], calls[0]["attempts"]) == ("ok", 1)
        calls = calls[1:]
    assert len(calls) == 1
    assert calls[0]["status"] == ("ok" if expect.recovers else "error")
    assert calls[0]["attempts"] == (MAX_ATTEMPTS if expect.retried else 1)


@pytest.mark.parametrize(
    "cell",
    [
        pytest.param(
            c, id=c.id, marks=[pytest.mark.skip(reason=c.not_applicable)] if c.not_applicable else []
        )
        for c in CELLS
    ],
)
async def test_fault_cell(
    cell: Cell,
    panel: SimPanel,
    make_config: Callable[..., Config],
    events_path: Path,
    tmp_path: Path,
) -> None:
    expect = cell.expect
    assert expect is not None
    _HANDLED[cell.id] = False
    for model, scenario in _scenarios(cell).items():
        panel.set_scenario(model, scenario)
    async with open_runtime(_config(make_config, panel, cell, tmp_path)) as rt:
        result = await _call(rt, cell.door)
        members = _members(cell.door, result)
        _check_healthy(cell.door, members)
        _check_faulty(cell, expect, result, members[FAULTY])
        _check_events(cell, expect, read_events(events_path))
        if cell.refused:
            assert panel.calls(_model(FAULTY)) == 0
        elif cell.latency_ms is None:
            first = 1 if _fault_after_a_call(cell) else 0
            assert panel.calls(_model(FAULTY)) == first + (MAX_ATTEMPTS if expect.retried else 1)
        if expect.trips_breaker:
            # The breaker is open: the next call fails fast, without a request to the panel.
            before = panel.calls(_model(FAULTY))
            again = _members(cell.door, await _call(rt, cell.door))[FAULTY]
            assert (again["status"], again["error"]["code"]) == ("breaker_open", "breaker_open")
            assert panel.calls(_model(FAULTY)) == before
    _HANDLED[cell.id] = True


def test_the_matrix_covers_every_kind_fault_and_door() -> None:
    faults = {c.fault for c in CELLS}
    assert len(faults) == 12
    assert len(CELLS) == len(KINDS) * len(DOORS) * len(faults)
    assert len({c.id for c in CELLS}) == len(CELLS)
    assert NOT_APPLICABLE == [], "every fault applies now that answers stream"
    assert matrix_counts() == {"cells": 144, "applicable": 144, "not_applicable": 0}


@pytest.mark.parametrize(
    ("kind", "reply", "code"),
    [
        ("openai", Reply(status=429, headers={"retry-after": "30"}), "rate_limited"),
        ("gemini", Reply(status=503, retry_delay="30s"), "unavailable"),
    ],
)
async def test_a_retry_hint_beyond_the_deadline_keeps_the_providers_error_and_the_hint(
    kind: str, reply: Reply, code: str, panel: SimPanel, make_config: Callable[..., Config], tmp_path: Path
) -> None:
    cell = Cell(kind, "hint_beyond_deadline", "confer", None, replies=(reply,))
    for model, scenario in _scenarios(cell).items():
        panel.set_scenario(model, scenario)
    async with open_runtime(_config(make_config, panel, cell, tmp_path)) as rt:
        answer = _members("confer", await _call(rt, "confer"))[FAULTY]  # 30 s asked, 6 s left
    assert panel.calls(_model(FAULTY)) == 1, "no retry: the hint is past the deadline"
    assert (answer["status"], answer["error"]["code"]) == ("error", code)
    assert answer["error"]["retry_after_seconds"] == 30


def test_figure_cells_handled() -> None:
    """Last in the file: records how many applicable cells were handled (each cell's test passed)."""
    if set(_HANDLED) != {c.id for c in APPLICABLE}:
        pytest.skip("the figure needs every cell: run the whole file")
    handled = sum(_HANDLED.values())
    record(
        "fault matrix: cells handled",
        handled,
        total=len(APPLICABLE),
        target="== total",
        command=".venv/bin/pytest tests/hardening/test_fault_matrix.py",
        details={
            "failed": sorted(k for k, ok in _HANDLED.items() if not ok),
            "not_applicable": {c.id: c.not_applicable for c in NOT_APPLICABLE},
        },
    )
    native = [c.id for c in APPLICABLE if _mode(c.door) == "native"]
    record(
        "fault matrix: cells handled (native)",
        sum(_HANDLED[i] for i in native),
        total=len(native),
        target="== total",
        command=".venv/bin/pytest tests/hardening/test_fault_matrix.py -k native",
        details="confer with a native verify call per member; the fault hits the follow-up request",
    )
    assert handled == len(APPLICABLE)
