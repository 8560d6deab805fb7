"""Follow-ups (docs/tools.md#follow-ups): `follow_up_of` sends each member the thread's earlier
turns (the question, its own answer, the synthesis) as conversation history, in each wire's own
user and assistant messages, over real HTTP to the simulated panel; results and transcripts name
the thread and the parent; the history budget drops the oldest turns first."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest

from conclave.app.runtime import open_runtime
from conclave.app.sim import Reply, Scenario, SimPanel
from conclave.core.errors import InvalidArguments
from conclave.deliberation.confer import confer
from conclave.deliberation.coordinate import coordinate
from conclave.deliberation.threads import SESSION_ID
from conclave.schema.config import Config
from conclave.schema.schemas import first_error, load_schema
from tests.server_support import panel_config, panel_providers, start_server

pytestmark = pytest.mark.anyio

KINDS = {"alpha": "openai", "beta": "anthropic", "gamma": "gemini"}


@pytest.fixture
def config(make_config: Callable[..., Config], panel: SimPanel, tmp_path: Path) -> Config:
    made = make_config(
        panel_providers(panel),
        retry={"max_attempts": 1},
        roles={"proposer": "alpha", "critics": ["beta", "gamma"], "synthesizer": "beta"},
        transcripts={"dir": str(tmp_path / "transcripts")},
    )
    return replace(made, panel=("alpha", "beta", "gamma"))


def answers_of(panel: SimPanel) -> None:
    """Each member says something of its own, so whose answer went where can be told apart."""
    for name in KINDS:
        panel.set_scenario(f"m-{name}", Scenario(replies=(Reply(text=f"{name.upper()} SAYS ONE"),)))


def conversation(kind: str, body: dict[str, Any]) -> list[tuple[str, str]]:
    """A request's messages as (speaker, text), speakers named as OpenAI names them."""
    if kind == "gemini":
        return [
            (
                "assistant" if c["role"] == "model" else c["role"],
                "".join(p.get("text", "") for p in c["parts"]),
            )
            for c in body["contents"]
        ]
    pairs = []
    for message in body["messages"]:
        if message["role"] == "system":
            continue
        content = message["content"]
        text = content if isinstance(content, str) else "".join(b.get("text", "") for b in content)
        pairs.append((message["role"], text))
    return pairs


def last_request(panel: SimPanel, model: str) -> dict[str, Any]:
    return [r.body for r in panel.received if r.model == model][-1]


async def asked(config: Config, tool: str = "confer", **args: Any) -> dict[str, Any]:
    async with open_runtime(config) as rt:
        run = confer if tool == "confer" else coordinate
        result = (await run(rt, args)).to_dict()
    error = first_error(f"{tool}.output.json", result)
    assert error is None, f"{error.message} at {list(error.absolute_path)}" if error else ""
    return result


async def test_a_follow_up_sends_each_member_its_own_earlier_answer_in_its_wires_form(
    config: Config, panel: SimPanel
) -> None:
    answers_of(panel)
    first = await asked(config, question="Which queue?")
    assert (first["thread_id"], first["parent"]) == (first["session_id"], None)
    second = await asked(config, question="And if the budget is halved?", follow_up_of=first["session_id"])
    assert (second["thread_id"], second["parent"]) == (first["session_id"], first["session_id"])
    for name, kind in KINDS.items():
        sent = conversation(kind, last_request(panel, f"m-{name}"))
        assert sent == [
            ("user", "Which queue?"),
            ("assistant", f"{name.upper()} SAYS ONE"),
            ("user", "And if the budget is halved?"),
        ], f"{name} ({kind}) is reminded of its own answer, and only its own"
    assert all("history_truncated" not in a["warnings"] for a in second["answers"])


async def test_a_three_turn_thread_carries_the_synthesis_and_keeps_its_first_session_as_the_thread(
    config: Config, panel: SimPanel, tmp_path: Path
) -> None:
    first = await asked(config, question="Which queue?", synthesize=True)
    synthesis = first["synthesis"]["envelope"]["answer"]
    second = await asked(config, question="Managed or not?", follow_up_of=first["session_id"])
    third = await asked(config, question="Who runs it?", follow_up_of=second["session_id"])
    assert third["thread_id"] == first["session_id"] and third["parent"] == second["session_id"]
    for name, kind in KINDS.items():
        sent = conversation(kind, last_request(panel, f"m-{name}"))
        assert [speaker for speaker, _ in sent] == ["user", "assistant", "user", "assistant", "user"], name
        assert sent[0][1] == "Which queue?"
        assert synthesis in sent[2][1] and sent[2][1].endswith("Managed or not?"), (
            "the synthesis, then the next question, as one user message"
        )
        assert sent[4] == ("user", "Who runs it?")
    written = [json.loads(p.read_text()) for p in (tmp_path / "transcripts").glob("*/*.json")]
    third_file = next(t for t in written if t["session_id"] == third["session_id"])
    assert (third_file["thread_id"], third_file["parent"]) == (first["session_id"], second["session_id"])


async def test_over_the_budget_the_oldest_turns_go_first_with_a_warning(
    config: Config, panel: SimPanel
) -> None:
    long_question = "Which queue? " + "Background. " * 60  # about 180 tokens, estimated
    first = await asked(config, question=long_question)
    second = await asked(config, question="Second?", follow_up_of=first["session_id"])
    small = replace(config, follow_ups=replace(config.follow_ups, max_history_tokens=60))
    third = await asked(small, question="Third?", follow_up_of=second["session_id"])
    sent = conversation("openai", last_request(panel, "m-alpha"))
    assert long_question not in [text for _, text in sent], "the oldest turn was dropped"
    assert sent[0] == ("user", "Second?") and sent[-1] == ("user", "Third?")
    assert all("history_truncated" in a["warnings"] for a in third["answers"])


async def test_a_follow_up_may_ask_one_member_again(config: Config, panel: SimPanel) -> None:
    answers_of(panel)
    first = await asked(config, question="Which queue?")
    panel.received.clear()
    again = await asked(config, question="Why?", providers=["gamma"], follow_up_of=first["session_id"])
    assert [a["provider"] for a in again["answers"]] == ["gamma"]
    assert {r.model for r in panel.received} == {"m-gamma"}
    assert conversation("gemini", last_request(panel, "m-gamma"))[1] == ("assistant", "GAMMA SAYS ONE")


async def test_an_unknown_session_is_invalid_params_naming_it_before_any_call(
    config: Config, panel: SimPanel
) -> None:
    with pytest.raises(InvalidArguments) as info:
        await asked(config, question="Why?", follow_up_of="s-nobody-ever")
    assert info.value.path == "$.follow_up_of" and "'s-nobody-ever'" in info.value.message
    assert panel.received == []


async def test_without_transcripts_a_thread_lives_in_its_process_alone(
    config: Config, panel: SimPanel
) -> None:
    """Each `asked` above opens a runtime of its own, so those threads were read from the
    transcripts folder (as a replica reads them). Without transcripts, the process remembers its
    sessions; another process cannot know them."""
    answers_of(panel)
    memory_only = replace(config, transcripts=replace(config.transcripts, enabled=False))
    async with open_runtime(memory_only) as rt:
        first = (await confer(rt, {"question": "Which queue?"})).to_dict()
        second = (await confer(rt, {"question": "Why?", "follow_up_of": first["session_id"]})).to_dict()
    assert second["parent"] == first["session_id"]
    assert conversation("openai", last_request(panel, "m-alpha"))[1] == ("assistant", "ALPHA SAYS ONE")
    with pytest.raises(InvalidArguments):
        await asked(memory_only, question="Again?", follow_up_of=first["session_id"])


async def test_a_debates_follow_up_reminds_each_role_of_what_it_wrote_and_of_the_synthesis(
    config: Config, panel: SimPanel
) -> None:
    first = await asked(config, "coordinate", task="Pick a cache policy.")
    proposal = first["proposal"]["envelope"]
    synthesis = first["synthesis"]["envelope"]["answer"]
    second = await asked(
        config, "coordinate", task="Now for 10x the traffic.", follow_up_of=first["session_id"]
    )
    assert second["thread_id"] == first["session_id"]
    sent = conversation("openai", [r.body for r in panel.received if r.model == "m-alpha"][-1])
    assert sent[0] == ("user", "Pick a cache policy.")
    assert json.loads(sent[1][1]) == proposal, "the proposer's own envelope, as it wrote it"
    assert synthesis in sent[2][1]


async def test_over_mcp_in_both_eras_and_as_a_plain_method(panel: SimPanel, tmp_path: Path) -> None:
    server = await start_server(panel_config(panel, tmp_path), tmp_path)
    try:
        await server.initialize()
        first = await server.request("tools/call", {"name": "confer", "arguments": {"question": "Q1?"}}, id=1)
        sid = first["result"]["structuredContent"]["session_id"]
        follow = {"question": "Q2?", "follow_up_of": sid}
        second = await server.request("tools/call", {"name": "confer", "arguments": follow}, id=2)
        assert second["result"]["structuredContent"]["parent"] == sid

        meta = {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
        }
        third_args = {"question": "Q3?", "follow_up_of": second["result"]["structuredContent"]["session_id"]}
        third = await server.request(
            "tools/call", {"name": "confer", "arguments": third_args, "_meta": meta}, id=3
        )
        assert third["result"]["structuredContent"]["thread_id"] == sid

        unknown = {"question": "Q?", "follow_up_of": "s-gone"}
        refused = await server.request("tools/call", {"name": "confer", "arguments": unknown}, id=4)
        assert refused["result"]["isError"] is True and "'s-gone'" in refused["result"]["content"][0]["text"]
        plain = await server.request("confer", unknown, id=5)
        assert plain["error"]["code"] == -32602 and "'s-gone'" in plain["error"]["message"]
    finally:
        server.process.kill()
        await server.process.wait()


async def test_the_command_line_follows_up_a_session(panel: SimPanel, tmp_path: Path) -> None:
    config = panel_config(panel, tmp_path)

    async def conclave(*args: str) -> subprocess.CompletedProcess[bytes]:
        command = [sys.executable, "-m", "conclave", *args, "--config", str(config), "--json"]
        return await anyio.run_process(command, cwd=tmp_path, check=False)

    first = await conclave("confer", "Which queue?")
    assert first.returncode == 0, first.stderr
    sid = json.loads(first.stdout)["session_id"]
    second = await conclave("confer", "And then?", "--follow-up", sid)
    assert second.returncode == 0, second.stderr
    assert (json.loads(second.stdout)["thread_id"], json.loads(second.stdout)["parent"]) == (sid, sid)
    gone = await conclave("confer", "Q", "--follow-up", "nope")
    assert gone.returncode == 2 and b"follow_up_of" in gone.stderr and b"'nope'" in gone.stderr


async def test_an_anthropic_follow_up_marks_its_history_so_the_next_one_reads_it_from_the_cache(
    make_config: Callable[..., Config], tmp_path: Path
) -> None:
    """Anthropic caches only what is marked: a follow-up ends a breakpoint after its history,
    writing it; the thread's next call finds that prefix, looking back from its own breakpoint,
    and reads it (the simulated panel plays the rule)."""
    async with SimPanel(caching=True) as panel:
        panel.set_scenario("m-beta", Scenario(replies=(Reply(text="A long considered answer. " * 250),)))
        made = make_config(
            panel_providers(panel), retry={"max_attempts": 1}, transcripts={"dir": str(tmp_path / "t")}
        )
        config = replace(made, panel=("beta",))
        first = await asked(config, question="Which queue?")
        second = await asked(config, question="Why?", follow_up_of=first["session_id"])
        third = await asked(config, question="And then?", follow_up_of=second["session_id"])
        bodies = [r.body for r in panel.received if r.model == "m-beta"]
    marks = [[i for i, m in enumerate(body["messages"]) if isinstance(m["content"], list)] for body in bodies]
    assert marks == [[], [1], [3]], "a breakpoint after each follow-up's history, none before"
    assert bodies[1]["messages"][1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    usage = [turn["answers"][0]["usage"] for turn in (first, second, third)]
    assert not usage[1].get("cached_input_tokens"), "the first follow-up writes its history"
    assert usage[1]["cache_write_tokens"] > 1024
    assert usage[2]["cached_input_tokens"] > 1024, "the next one reads it"


async def test_a_thread_whose_first_transcript_is_gone_keeps_the_turns_still_known(
    config: Config, panel: SimPanel, tmp_path: Path
) -> None:
    answers_of(panel)
    first = await asked(config, question="Which queue?")
    second = await asked(config, question="Managed or not?", follow_up_of=first["session_id"])
    for path in (tmp_path / "transcripts").glob(f"*/{first['session_id']}-*.json"):
        path.unlink()
    third = await asked(config, question="Who runs it?", follow_up_of=second["session_id"])
    assert third["thread_id"] == first["session_id"], "the thread keeps its name"
    sent = conversation("openai", last_request(panel, "m-alpha"))
    assert sent == [
        ("user", "Managed or not?"),
        ("assistant", "ALPHA SAYS ONE"),
        ("user", "Who runs it?"),
    ], "the history starts where the transcripts do"


def test_the_session_id_pattern_is_the_schemas() -> None:
    """Where a session id is read outside a tool call (a resource's URI, the page's query), it is
    held to the pattern the tools' arguments are."""
    for tool in ("confer", "coordinate"):
        properties = load_schema(f"{tool}.input.json")["properties"]
        for name in ("session_id", "follow_up_of"):
            assert properties[name]["pattern"] == f"^{SESSION_ID.pattern}$"
