"""Member fallbacks (docs/tools.md#member-fallbacks): a confer member whose call fails for good is
answered by the first of its entry's `fallbacks` not already asked, over real HTTP on loopback.
The failures are the providers' own error bodies (tests/fixtures/wire_samples.json) served by a
local server, or the simulated panel's bodies in each wire's shape; a transient error never calls
a fallback."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from conclave.app.render import render_confer
from conclave.app.runtime import open_runtime
from conclave.app.sim import Reply, Scenario, SimPanel
from conclave.core.errors import ConfigError
from conclave.deliberation.confer import confer
from conclave.schema.config import Config
from conclave.schema.schemas import first_error
from tests.support import SAMPLES, read_events

pytestmark = pytest.mark.anyio

QUESTION = "Which queue should a three-person team run?"


@contextlib.asynccontextmanager
async def sample_server() -> AsyncIterator[str]:
    """Answers every request under `/<sample>/` with that wire sample's status, headers and body,
    as the provider sent them; yields the server's root URL."""

    async def reply(request: web.Request) -> web.Response:
        sample = SAMPLES[request.match_info["sample"]]
        headers = {k: v for k, v in sample["headers"].items() if k.lower() != "content-type"}
        headers["content-type"] = "application/json"
        return web.Response(body=orjson.dumps(sample["body"]), status=sample["status"], headers=headers)

    app = web.Application()
    app.router.add_route("*", "/{sample}/{tail:.*}", reply)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.fixture
async def samples() -> AsyncIterator[str]:
    async with sample_server() as root:
        yield root


def members(panel: SimPanel, failing: dict[str, Any], **fallbacks: list[str]) -> dict[str, dict[str, Any]]:
    """`broken` (the `failing` entry, whose fallbacks are `fallbacks["broken"]`, default
    `[spare]`), two members that answer, and the spare, one per wire kind."""
    entries = {
        "broken": {**failing, "fallbacks": fallbacks.get("broken", ["spare"])},
        "beta": {"kind": "anthropic", "model": "m-beta", "base_url": panel.base_url("anthropic")},
        "gamma": {"kind": "gemini", "model": "m-gamma", "base_url": panel.base_url("gemini")},
        "spare": {"kind": "openai", "model": "m-spare", "base_url": panel.base_url("openai")},
    }
    for name, names in fallbacks.items():
        entries[name]["fallbacks"] = names
    return entries


def config_of(make_config: Callable[..., Config], entries: dict[str, Any], **kwargs: Any) -> Config:
    """The entries configured, with broken, beta and gamma on the panel (the rest stand by)."""
    config = make_config(entries, retry={"max_attempts": 2}, **kwargs)
    return replace(config, panel=("broken", "beta", "gamma"))


async def run(config: Config, **args: Any) -> dict[str, Any]:
    async with open_runtime(config) as rt:
        result = (await confer(rt, {"question": QUESTION, **args})).to_dict()
    error = first_error("confer.output.json", result)
    assert error is None, f"{error.message} at {list(error.absolute_path)}" if error else ""
    return result


def asked(panel: SimPanel, model: str) -> list[dict[str, Any]]:
    return [r.body for r in panel.received if r.model == model]


def assert_stood_in(result: dict[str, Any], code: str, message: str, events: Path) -> None:
    """`spare` answered for `broken`, whose error is kept with its code and its own words."""
    first = result["answers"][0]
    assert (first["provider"], first["model"], first["status"]) == ("spare", "m-spare", "ok")
    assert first["fallback_from"] == {
        "provider": "broken",
        "role": None,
        "status": "error",
        "code": code,
        "message": message,
    }
    assert "member_fallback" in first["warnings"] and "member_fallback" in result["warnings"]
    assert [a["provider"] for a in result["answers"]] == ["spare", "beta", "gamma"]
    assert result["degraded"] is False
    [event] = [e for e in read_events(events) if e["event"] == "member_fallback"]
    assert {k: event[k] for k in ("provider", "fallback", "status", "code")} == {
        "provider": "broken",
        "fallback": "spare",
        "status": "error",
        "code": code,
    }


# ---------------------------------------------------------------- each permanent failure, per wire


# The providers' own bodies, as captured (tests/fixtures/wire_samples.json).
REAL_BODIES = [
    ("openai", "openai_error_401", "auth_error"),
    ("openai", "openai_error_429_insufficient_quota", "insufficient_quota"),
    ("openai", "ollama_model_missing", "not_found"),  # an OpenAI-compatible server's 404
    ("gemini", "gemini_error_400_api_key_invalid", "auth_error"),
    ("gemini", "gemini_error_429_daily", "quota_exhausted"),
]


@pytest.mark.parametrize(("kind", "sample", "code"), REAL_BODIES, ids=[s for _, s, _ in REAL_BODIES])
async def test_a_member_that_fails_for_good_is_answered_by_its_fallback(
    make_config: Callable[..., Config],
    panel: SimPanel,
    samples: str,
    events_path: Path,
    kind: str,
    sample: str,
    code: str,
) -> None:
    broken = {"kind": kind, "model": "m-broken", "base_url": f"{samples}/{sample}"}
    result = await run(config_of(make_config, members(panel, broken)))
    message = SAMPLES[sample]["body"]["error"]["message"]
    assert_stood_in(result, code, message, events_path)
    [sent] = asked(panel, "m-spare")
    assert QUESTION in json.dumps(sent), "the fallback is asked the member's question"


# The simulated panel's bodies in each wire's shape (Anthropic's error types, Gemini's statuses).
SIMULATED = [
    ("anthropic", 402, "billing_error", "insufficient_quota"),
    ("anthropic", 401, "authentication_error", "auth_error"),
    ("anthropic", 403, "permission_error", "permission_denied"),
    ("anthropic", 404, "not_found_error", "not_found"),
    ("openai", 403, None, "permission_denied"),
    ("gemini", 404, None, "not_found"),
]


@pytest.mark.parametrize(
    ("kind", "status", "error_type", "code"), SIMULATED, ids=[f"{k}-{s}" for k, s, _, _ in SIMULATED]
)
async def test_each_wires_permanent_errors_call_the_fallback(
    make_config: Callable[..., Config],
    panel: SimPanel,
    events_path: Path,
    kind: str,
    status: int,
    error_type: str | None,
    code: str,
) -> None:
    message = f"refused for good ({code})"
    panel.set_scenario(
        "m-broken", Scenario(replies=(Reply(status=status, error_type=error_type, error_message=message),))
    )
    broken = {"kind": kind, "model": "m-broken", "base_url": panel.base_url(kind)}  # type: ignore[arg-type]
    result = await run(config_of(make_config, members(panel, broken)))
    assert_stood_in(result, code, message, events_path)
    # A permanent failure is not retried. Gemini's 404 is asked twice: a 404 on the stream's own
    # method reads as a server without it, so the plain method is tried, and says 404 too.
    tries = 2 if (kind, status) == ("gemini", 404) else 1
    assert len(asked(panel, "m-broken")) == tries


async def test_a_missing_key_calls_the_fallback(
    make_config: Callable[..., Config], panel: SimPanel, events_path: Path
) -> None:
    broken = {"kind": "openai", "model": "m-broken", "base_url": panel.base_url("openai")}
    config = config_of(make_config, members(panel, {**broken, "api_key_env": "BROKEN_KEY"}))
    result = await run(config)
    first = result["answers"][0]
    assert first["provider"] == "spare" and first["status"] == "ok"
    assert first["fallback_from"]["status"] == "skipped"
    assert first["fallback_from"]["code"] == "missing_api_key"
    assert "BROKEN_KEY" in first["fallback_from"]["message"], "the message names the variable to set"
    assert asked(panel, "m-broken") == []


async def test_transient_errors_never_call_a_fallback_and_an_open_breaker_does(
    make_config: Callable[..., Config], panel: SimPanel, events_path: Path
) -> None:
    """A 500 and a 429 that refills are retried; when the retries run out, the member's answer is
    that error. The failures open its breaker; the next call, refused by the breaker without
    reaching the provider, is answered by the fallback."""
    panel.set_scenario("m-broken", Scenario(replies=(Reply(status=500), Reply(text="Recovered."))))
    broken = {"kind": "openai", "model": "m-broken", "base_url": panel.base_url("openai")}
    config = config_of(make_config, members(panel, broken), breakers={"failure_threshold": 2})
    async with open_runtime(config) as rt:
        cured = (await confer(rt, {"question": QUESTION})).to_dict()
        assert cured["answers"][0]["provider"] == "broken" and cured["answers"][0]["status"] == "ok"

        panel.set_scenario("m-broken", Scenario(replies=(Reply(status=500),)))
        failed = (await confer(rt, {"question": QUESTION})).to_dict()
        assert failed["answers"][0]["provider"] == "broken"
        assert failed["answers"][0]["error"]["code"] == "server_error"

        panel.set_scenario("m-broken", Scenario(replies=(Reply(status=429, headers={"retry-after": "0"}),)))
        limited = (await confer(rt, {"question": QUESTION})).to_dict()
        assert limited["answers"][0]["error"]["code"] == "rate_limited"
        assert asked(panel, "m-spare") == [], "no transient error called the fallback"

        tripped = (await confer(rt, {"question": QUESTION})).to_dict()
    first = tripped["answers"][0]
    assert first["provider"] == "spare" and first["status"] == "ok"
    assert (first["fallback_from"]["status"], first["fallback_from"]["code"]) == (
        "breaker_open",
        "breaker_open",
    )


# ---------------------------------------------------------------- which fallback


async def test_a_fallback_already_on_the_panel_is_skipped_and_the_next_is_asked(
    make_config: Callable[..., Config], panel: SimPanel, samples: str, events_path: Path
) -> None:
    broken = {"kind": "openai", "model": "m-broken", "base_url": f"{samples}/openai_error_401"}
    entries = members(panel, broken, broken=["beta", "spare"])
    result = await run(config_of(make_config, entries))
    assert [a["provider"] for a in result["answers"]] == ["spare", "beta", "gamma"]
    assert len(asked(panel, "m-beta")) == 1, "beta answered once, as itself"


async def test_two_broken_members_never_share_a_fallback(
    make_config: Callable[..., Config], panel: SimPanel, samples: str, events_path: Path
) -> None:
    broken = {"kind": "openai", "model": "m-broken", "base_url": f"{samples}/openai_error_401"}
    entries = members(panel, broken)
    entries["beta"] = {**entries["beta"], "base_url": f"{samples}/openai_error_429_insufficient_quota"}
    entries["beta"].update(kind="openai", fallbacks=["spare"])
    result = await run(config_of(make_config, entries))
    providers = [a["provider"] for a in result["answers"]]
    assert providers.count("spare") == 1 and len(asked(panel, "m-spare")) == 1
    missing = [a for a in result["answers"] if a["status"] != "ok"]
    assert [a["provider"] for a in missing] in (["broken"], ["beta"])
    assert result["degraded"] is True


async def test_a_fallback_that_fails_for_good_too_hands_on_to_the_next(
    make_config: Callable[..., Config], panel: SimPanel, samples: str, events_path: Path
) -> None:
    broken = {"kind": "openai", "model": "m-broken", "base_url": f"{samples}/openai_error_401"}
    entries = members(panel, broken, broken=["dead", "spare"])
    entries["dead"] = {"kind": "gemini", "model": "m-dead", "base_url": f"{samples}/gemini_error_429_daily"}
    result = await run(config_of(make_config, entries))
    first = result["answers"][0]
    assert first["provider"] == "spare" and first["status"] == "ok"
    assert first["fallback_from"]["provider"] == "broken", "it names the member it answers for"
    fallbacks = [e for e in read_events(events_path) if e["event"] == "member_fallback"]
    assert [(e["provider"], e["fallback"], e["code"]) for e in fallbacks] == [
        ("broken", "dead", "auth_error"),
        ("broken", "spare", "auth_error"),
    ]


# ---------------------------------------------------------------- the dry run, the page, the config


async def test_the_dry_run_plans_each_fallback_as_if_it_were_asked(
    make_config: Callable[..., Config], panel: SimPanel, events_path: Path
) -> None:
    price = {"input_per_mtok": 1.0, "output_per_mtok": 2.0}
    broken = {"kind": "openai", "model": "m-broken", "base_url": panel.base_url("openai"), "price": price}
    entries = members(panel, broken)
    for name in ("beta", "gamma", "spare"):
        entries[name]["price"] = price
    result = await run(config_of(make_config, entries), dry_run=True)
    calls = result["plan"]["calls"]
    assert [(c["provider"], c.get("fallback_for")) for c in calls] == [
        ("broken", None),
        ("spare", "broken"),
        ("beta", None),
        ("gamma", None),
    ]
    assert result["plan"]["max_cost_usd"] == pytest.approx(sum(c["max_cost_usd"] for c in calls))
    assert "if broken fails for good" in render_confer(result)
    assert panel.received == []


async def test_the_terminal_says_who_stood_in_for_whom(
    make_config: Callable[..., Config], panel: SimPanel, samples: str, events_path: Path
) -> None:
    broken = {"kind": "openai", "model": "m-broken", "base_url": f"{samples}/openai_error_401"}
    text = render_confer(await run(config_of(make_config, members(panel, broken))))
    assert "━━ spare" in text and "stood in for broken: error, auth_error" in text


def test_a_fallback_must_be_a_configured_provider_other_than_itself(
    make_config: Callable[..., Config],
) -> None:
    entry = {"kind": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1"}
    with pytest.raises(ConfigError, match=r"providers\.a\.fallbacks\[0\]: provider 'nobody' is not defined"):
        make_config({"a": {**entry, "fallbacks": ["nobody"]}})
    with pytest.raises(ConfigError, match=r"providers\.a\.fallbacks\[1\]: a provider cannot be its own"):
        make_config({"a": {**entry, "fallbacks": ["b", "a"]}, "b": entry})
