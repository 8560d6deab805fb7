"""Structured answers and the vote through `confer` (docs/tools.md#structured-answers-and-the-vote):
members held to the caller's `answer_schema` (on the wire and in the prompt), a reply that is not
valid re-prompted once with the validator's errors and then `invalid_answer`, the vote over the
valid ones, its event, and the door refusing what the schema may not hold; then `coordinate`'s
synthesizer deciding a `value` valid against the same schema. Members are OpenAI-wire providers
over the in-memory transport, each answering as its handler says."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

import conclave
from conclave.net.http import MemoryTransport
from conclave.schema.answer_schema import choices_schema
from conclave.schema.config import Config
from conclave.schema.schemas import first_error
from tests.support import read_events

pytestmark = pytest.mark.anyio

CHOICES = choices_schema(["SQS", "Kafka", "RabbitMQ"])
Reply = Callable[[list[dict[str, Any]]], str]  # a member's messages -> its reply text


def chat(text: str) -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "id": "chatcmpl-1",
            "model": "m",
            "choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        },
    )


class Panel:
    """Members by model name, each replying as its function says; every body sent is kept."""

    def __init__(self, replies: dict[str, Reply]) -> None:
        self.replies = replies
        self.sent: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.sent.append(body)
        return chat(self.replies[body["model"]](body["messages"]))

    def bodies_of(self, model: str) -> list[dict[str, Any]]:
        return [b for b in self.sent if b["model"] == model]


def says(value: Any) -> Reply:
    return lambda _messages: json.dumps(value)


def reprompted(messages: list[dict[str, Any]]) -> bool:
    return "was not a valid answer" in str(messages[-1]["content"])


@pytest.fixture
def council(make_config: Callable[..., Config]) -> Callable[..., Any]:
    def open_for(panel: Panel, **sections: Any) -> Any:
        providers = {
            name: {
                "kind": "openai",
                "model": name,
                "base_url": "https://api.openai.com/v1",
                "api_key_env": "K",
            }
            for name in panel.replies
        }
        config = make_config(providers, env={"K": "sk-test"}, **sections)
        return conclave.Conclave(config, transport=MemoryTransport(panel))

    return open_for


async def test_each_member_is_held_to_the_schema_and_the_vote_names_the_dissent(
    council: Callable[[Panel], Any], events_path: Path
) -> None:
    panel = Panel(
        {
            "a": says({"choice": "SQS", "reason": "managed"}),
            "b": says({"choice": "sqs", "reason": "cheap"}),  # not one of the enum: asked again
            "c": says({"choice": "Kafka", "reason": "replay"}),
        }
    )
    panel.replies["b"] = lambda m: json.dumps(
        {"choice": "SQS" if reprompted(m) else "sqs", "reason": "cheap"}
    )
    async with council(panel) as client:
        result = await client.confer("Which queue?", answer_schema=CHOICES)
    out = result.to_dict()

    first = panel.bodies_of("a")[0]
    assert first["response_format"]["json_schema"]["schema"] == CHOICES, "held to it on the wire"
    assert first["response_format"]["json_schema"]["strict"] is True
    assert '"enum"' in first["messages"][-1]["content"], "and told it in the prompt"

    retry = panel.bodies_of("b")[1]["messages"]
    assert retry[-2] == {"role": "assistant", "content": '{"choice": "sqs", "reason": "cheap"}'}
    assert "'sqs' is not one of" in retry[-1]["content"], "the validator's error goes back"

    assert [a["value"]["choice"] for a in out["answers"]] == ["SQS", "SQS", "Kafka"]
    assert out["answers"][1]["usage"]["total_tokens"] == 30, "both attempts are paid for"
    choice = out["vote"]["fields"][0]
    assert (choice["field"], choice["winner"], choice["votes"], choice["of"]) == ("choice", "SQS", 2, 3)
    assert choice["dissent"] == [{"provider": "c", "value": "Kafka"}]
    assert out["vote"]["consensus"] == {"choice": "SQS"} and out["vote"]["reason"] is None
    assert not out["degraded"]

    events = read_events(events_path)
    invalid = [e for e in events if e["event"] == "answer_invalid"]
    assert [(e["provider"], e["attempt"]) for e in invalid] == [("b", 1)]
    (vote,) = [e for e in events if e["event"] == "vote"]
    assert vote["consensus"] is True and vote["fields"][0]["votes"] == 2
    assert "SQS" not in json.dumps(vote), "the log keeps the counts, not the values"


async def test_a_member_invalid_twice_is_invalid_answer_and_not_counted(
    council: Callable[[Panel], Any], events_path: Path
) -> None:
    panel = Panel(
        {
            "a": says({"choice": "SQS", "reason": "managed"}),
            "b": lambda _m: "I would pick SQS, honestly.",
            "c": says({"choice": "Kafka", "reason": "replay"}),
        }
    )
    async with council(panel) as client:
        out = (await client.confer("Which queue?", answer_schema=CHOICES)).to_dict()

    b = out["answers"][1]
    assert (b["status"], b["error"]["code"], b["value"]) == ("invalid_answer", "invalid_answer", None)
    assert b["text"] == "I would pick SQS, honestly.", "the raw reply is kept"
    assert len(panel.bodies_of("b")) == 2, "asked once more, never a third time"
    assert (
        out["degraded"]
        and {"provider": "b", "role": None, "status": "invalid_answer", "code": "invalid_answer"}
        in out["degraded_reasons"]
    )
    assert out["vote"]["not_counted"] == ["b"]
    assert out["vote"]["consensus"] is None
    assert out["vote"]["reason"] == "no strict majority on 'choice': 1 of 2 (a tie)"
    finals = [e for e in read_events(events_path) if e["event"] == "answer_invalid" and e.get("final")]
    assert [e["provider"] for e in finals] == ["b"]


async def test_a_plain_confer_sends_no_schema_and_has_no_vote(council: Callable[[Panel], Any]) -> None:
    panel = Panel({"a": lambda _m: "SQS.", "b": lambda _m: "Kafka."})
    async with council(panel) as client:
        out = (await client.confer("Which queue?")).to_dict()
    assert all("response_format" not in body for body in panel.sent)
    assert "vote" not in out and all("value" not in a for a in out["answers"])


async def test_numbers_agree_within_the_tolerance(council: Callable[[Panel], Any]) -> None:
    number = {
        "type": "object",
        "properties": {"value": {"type": "number"}, "reason": {"type": "string"}},
        "required": ["value", "reason"],
        "additionalProperties": False,
    }
    panel = Panel({"a": says({"value": 100, "reason": "x"}), "b": says({"value": 104, "reason": "y"})})
    async with council(panel) as client:
        exact = (await client.confer("How many?", answer_schema=number)).to_dict()["vote"]
        close = (await client.confer("How many?", answer_schema=number, tolerance=0.05)).to_dict()["vote"]
    assert exact["consensus"] is None
    assert close["consensus"] == {"value": 100} and close["fields"][0]["unanimous"]


@pytest.mark.parametrize(
    ("arguments", "path", "words"),
    [
        (
            {"answer_schema": {"type": "object", "properties": {"x": {"type": "string", "pattern": "^a"}}}},
            "$.answer_schema.properties.x",
            "pattern",
        ),
        ({"answer_schema": {"type": "array"}}, "$.answer_schema", "object"),
        ({"tolerance": 0.1}, "$.tolerance", "needs answer_schema"),
        ({"vote_fields": ["reason"]}, "$.vote_fields", "needs answer_schema"),
    ],
)
async def test_the_door_refuses_what_the_schema_may_not_hold(
    council: Callable[[Panel], Any], arguments: dict[str, Any], path: str, words: str
) -> None:
    panel = Panel({"a": says({})})
    async with council(panel) as client:
        with pytest.raises(conclave.InvalidArguments) as info:
            await client.confer("Which?", **arguments)
    assert info.value.path == path and words in info.value.message
    assert panel.sent == [], "refused before any call"


async def test_an_entry_without_structured_output_gets_the_schema_in_the_prompt_alone(
    make_config: Callable[..., Config],
) -> None:
    """A server that speaks the wire but not its JSON Schema field (DeepSeek: json_object only)."""
    panel = Panel({"a": says({"choice": "SQS", "reason": "managed"})})
    entry = {"kind": "openai", "model": "a", "base_url": "https://api.deepseek.com", "api_key_env": None}
    config = make_config({"a": {**entry, "structured_output": False}})
    async with conclave.Conclave(config, transport=MemoryTransport(panel)) as client:
        out = (await client.confer("Which queue?", answer_schema=CHOICES)).to_dict()
    (body,) = panel.sent
    assert "response_format" not in body and '"enum"' in body["messages"][-1]["content"]
    assert out["answers"][0]["value"] == {"choice": "SQS", "reason": "managed"}


def test_the_presets_that_take_no_json_schema_say_so() -> None:
    from conclave.schema.config import load_config

    config = load_config(None, env={}, dotenv=None)
    without = sorted(name for name, p in config.providers.items() if not p.structured_output)
    assert without == ["deepseek", "groq", "openrouter"]


# ---------------------------------------------------------------- role envelopes, held natively

PROPOSAL = {"proposal": "SQS.", "rationale": "Managed.", "confidence": 0.7}
ACCEPT = {"verdict": "accept", "issues": []}
FINAL = {"answer": "SQS.", "confidence": 0.8}


def role_reply(messages: list[dict[str, Any]]) -> str:
    """Answers whichever role the system prompt names, with a valid envelope."""
    system = str(messages[0]["content"])
    if "Review this proposal" in str(messages[-1]["content"]):
        return json.dumps(ACCEPT)
    if "synthesizer" in system and "final answer" in str(messages[-1]["content"]).lower():
        return json.dumps(FINAL)
    return json.dumps(PROPOSAL)


async def test_role_turns_are_held_to_their_envelope_schema_on_the_wire(
    council: Callable[[Panel], Any],
) -> None:
    panel = Panel({"a": role_reply, "b": role_reply, "c": role_reply})
    async with council(panel) as client:
        result = (await client.coordinate("Pick a queue.")).to_dict()
    assert result["proposal"]["envelope"] == PROPOSAL
    schemas = {b["response_format"]["json_schema"]["schema"]["required"][0] for b in panel.sent}
    assert {"proposal", "verdict", "answer"} <= schemas, "each role its own envelope"
    proposer = next(
        b for b in panel.sent if "proposal" in b["response_format"]["json_schema"]["schema"]["required"]
    )
    wire = proposer["response_format"]["json_schema"]["schema"]
    assert "minLength" not in json.dumps(wire), "cut down to the portable subset"


async def test_a_reviewer_is_held_to_its_own_labels(council: Callable[[Panel], Any]) -> None:
    def reviewer_or_member(messages: list[dict[str, Any]]) -> str:
        asked = str(messages[-1]["content"])
        if "Response A" not in asked:
            return "An answer."
        labels = sorted({f"Response {c}" for c in "AB" if f"Response {c}" in asked})
        return json.dumps({"ranking": labels, "notes": dict.fromkeys(labels, "fine"), "confidence": 0.5})

    panel = Panel({"a": reviewer_or_member, "b": reviewer_or_member, "c": reviewer_or_member})
    async with council(panel) as client:
        result = (await client.confer("Which queue?", review=True)).to_dict()
    reviews = [b for b in panel.sent if "response_format" in b]
    assert len(reviews) == 3 and len(result["review"]["rankings"]) == 3
    wire = reviews[0]["response_format"]["json_schema"]
    assert wire["strict"] is True
    assert wire["schema"]["properties"]["ranking"]["items"]["enum"] == ["Response A", "Response B"]
    assert wire["schema"]["properties"]["notes"]["required"] == ["Response A", "Response B"]


async def test_the_chair_decides_a_value_having_seen_the_vote_but_no_names(
    council: Callable[[Panel], Any], events_path: Path
) -> None:
    def member_or_chair(choice: str) -> Reply:
        def reply(messages: list[dict[str, Any]]) -> str:
            asked = str(messages[-1]["content"])
            if "Write the final answer to the question" in asked:
                return json.dumps(
                    {"answer": "SQS.", "confidence": 0.8, "value": {"choice": "SQS", "reason": "2 of 3"}}
                )
            return json.dumps({"choice": choice, "reason": "because"})

        return reply

    panel = Panel({"a": member_or_chair("SQS"), "b": member_or_chair("SQS"), "c": member_or_chair("Kafka")})
    async with council(panel) as client:
        out = (await client.confer("Which queue?", answer_schema=CHOICES, synthesize=True)).to_dict()
    assert out["synthesis"]["value"] == {"choice": "SQS", "reason": "2 of 3"}
    chair = next(b for b in panel.sent if "Write the final answer" in b["messages"][-1]["content"])
    asked = chair["messages"][-1]["content"]
    assert '"winner": "SQS"' in asked and '"votes": 2' in asked, "the chair sees the vote"
    assert all(f'"{name}"' not in asked for name in ("a", "b", "c")), "but no member's name"
    wire = chair["response_format"]["json_schema"]["schema"]
    assert "value" in wire["required"] and wire["properties"]["value"]["properties"]["choice"]["enum"] == [
        "SQS",
        "Kafka",
        "RabbitMQ",
    ]


async def test_a_chair_without_a_valid_value_is_asked_again(council: Callable[[Panel], Any]) -> None:
    def chair_forgets(messages: list[dict[str, Any]]) -> str:
        asked = str(messages[-1]["content"])
        if "Write the final answer to the question" in asked:
            return json.dumps({"answer": "SQS.", "confidence": 0.8})
        if "not a valid synthesizer reply" in asked:
            return json.dumps(
                {"answer": "SQS.", "confidence": 0.8, "value": {"choice": "SQS", "reason": "r"}}
            )
        return json.dumps({"choice": "SQS", "reason": "because"})

    panel = Panel({"a": chair_forgets, "b": chair_forgets})
    async with council(panel) as client:
        out = (await client.confer("Which queue?", answer_schema=CHOICES, synthesize=True)).to_dict()
    assert out["synthesis"]["attempts"] == 2 and out["synthesis"]["value"]["choice"] == "SQS"


async def test_a_dry_run_bounds_the_re_prompt_of_each_structured_answer(
    council: Callable[[Panel], Any],
) -> None:
    panel = Panel({"a": says({}), "b": says({})})
    async with council(panel) as client:
        plain = (await client.confer("Which queue?", dry_run=True)).to_dict()["plan"]
        shaped = (await client.confer("Which queue?", answer_schema=CHOICES, dry_run=True)).to_dict()["plan"]
    assert panel.sent == []
    assert shaped["max_calls"] == 2 * plain["max_calls"]


# ---------------------------------------------------------------- coordinate: the synthesizer's value

DEBATE = {"proposer": "p", "critics": ["c"], "synthesizer": "s", "synthesizer_fallbacks": []}


def debater(synthesis: Reply) -> Reply:
    """A proposer, a critic that accepts, and a synthesizer answering (and re-answering) as told."""

    def reply(messages: list[dict[str, Any]]) -> str:
        asked = str(messages[-1]["content"])
        if "Review this proposal" in asked:
            return json.dumps(ACCEPT)
        if "Write your proposal" in asked:
            return json.dumps(PROPOSAL)
        return synthesis(messages)

    return reply


async def test_a_coordinate_synthesizer_decides_a_value_held_to_the_answer_schema(
    council: Callable[..., Any],
) -> None:
    decided = {"choice": "Kafka", "reason": "replay"}
    synthesis = debater(says({**FINAL, "value": decided}))
    panel = Panel({"p": synthesis, "c": synthesis, "s": synthesis})
    async with council(panel, roles=DEBATE) as client:
        result = await client.coordinate("Pick a queue.", answer_schema=CHOICES)
        plain = (await client.coordinate("Pick a queue.")).to_dict()
    assert result.synthesis is not None and result.synthesis.value == decided, "the Python API's path"
    out = result.to_dict()
    assert first_error("coordinate.output.json", out) is None
    assert out["synthesis"]["value"] == decided and not out["degraded"]
    assert "value" not in plain["synthesis"], "a debate asked for no value has none"

    asked = panel.bodies_of("s")[0]
    wire = asked["response_format"]["json_schema"]["schema"]
    assert "value" in wire["required"] and wire["properties"]["value"] == CHOICES, "held natively"
    assert {"answer", "confidence"} <= set(wire["required"]), "the synthesizer's envelope still"
    prompt = asked["messages"][-1]["content"]
    assert 'Include "value"' in prompt and '"enum"' in prompt, "and told in the prompt"
    assert prompt.rstrip().endswith("Reply with only the synthesizer JSON object."), "the ask still last"

    proposer = panel.bodies_of("p")[0]
    assert '"RabbitMQ"' in proposer["messages"][-1]["content"], "the proposer is shown the answer's shape"
    assert "value" not in proposer["response_format"]["json_schema"]["schema"]["properties"]


@pytest.mark.parametrize("forgets", [True, False], ids=["missing", "invalid"])
async def test_a_coordinate_synthesis_without_a_valid_value_is_asked_again_once_then_degraded(
    council: Callable[..., Any], forgets: bool
) -> None:
    wrong = {**FINAL} if forgets else {**FINAL, "value": {"choice": "Redis", "reason": "fast"}}
    synthesis = debater(says(wrong))
    panel = Panel({"p": synthesis, "c": synthesis, "s": synthesis})
    async with council(panel, roles=DEBATE) as client:
        result = await client.coordinate("Pick a queue.", answer_schema=CHOICES)
    out = result.to_dict()
    assert first_error("coordinate.output.json", out) is None

    first, again = panel.bodies_of("s")  # asked once more, never a third time
    retry = again["messages"]
    assert retry[:-2] == first["messages"] and retry[-2]["content"] == json.dumps(wrong)
    error = "$.value: the final answer" if forgets else "$.value.choice: 'Redis' is not one of"
    assert error in retry[-1]["content"], "the validator's error goes back"
    assert "response_format" in again, "still held to the schema natively"

    assert result.synthesis is not None and result.synthesis.value is None
    synthesis_out = out["synthesis"]
    assert (synthesis_out["status"], synthesis_out["value"], synthesis_out["attempts"]) == (
        "invalid_envelope",
        None,
        2,
    )
    assert synthesis_out["text"] == json.dumps(wrong), "the raw reply is kept"
    assert error in synthesis_out["error"]["message"], "the reason says what was wrong with the value"
    assert out["degraded"] and out["degraded_reasons"] == [
        {"provider": "s", "role": "synthesizer", "status": "invalid_envelope", "code": "invalid_envelope"}
    ]
    assert out["proposal"]["envelope"] == PROPOSAL, "the debate itself is intact"


async def test_a_coordinate_synthesizer_that_fails_the_value_is_replaced_by_a_fallback(
    council: Callable[..., Any],
) -> None:
    forgets = debater(says(FINAL))
    decides = debater(says({**FINAL, "value": {"choice": "SQS", "reason": "managed"}}))
    panel = Panel({"p": forgets, "c": forgets, "s": forgets, "s2": decides})
    roles = {**DEBATE, "synthesizer_fallbacks": ["s2"]}
    async with council(panel, roles=roles) as client:
        out = (await client.coordinate("Pick a queue.", answer_schema=CHOICES)).to_dict()
    assert out["synthesis"]["provider"] == "s2" and out["synthesis"]["value"]["choice"] == "SQS"
    assert out["synthesis"]["fallback_from"]["status"] == "invalid_envelope"
    assert "synthesizer_fallback" in out["warnings"] and not out["degraded"]


async def test_coordinate_refuses_an_answer_schema_outside_the_subset_before_any_call(
    council: Callable[..., Any],
) -> None:
    panel = Panel({"p": says({}), "c": says({}), "s": says({})})
    schema = {"type": "object", "properties": {"x": {"type": "string", "pattern": "^a"}}}
    async with council(panel, roles=DEBATE) as client:
        with pytest.raises(conclave.InvalidArguments) as info:
            await client.coordinate("Pick.", answer_schema=schema)
    assert (info.value.path, info.value.tool) == ("$.answer_schema.properties.x", "coordinate")
    assert "'pattern'" in info.value.message
    assert panel.sent == [], "refused before any call"


async def test_a_coordinate_dry_run_bounds_the_synthesizers_re_ask_and_the_schema_it_is_shown(
    council: Callable[..., Any],
) -> None:
    panel = Panel({"p": says({}), "c": says({}), "s": says({})})
    async with council(panel, roles=DEBATE) as client:
        plain = (await client.coordinate("Pick.", dry_run=True)).to_dict()["plan"]
        shaped = (await client.coordinate("Pick.", answer_schema=CHOICES, dry_run=True)).to_dict()["plan"]
    assert panel.sent == []
    synthesizer = next(c for c in shaped["calls"] if c["role"] == "synthesizer")
    assert synthesizer["max_calls"] == 2, "the re-ask for a missing or invalid value is counted"
    by_role = {c["role"]: c["max_input_tokens"] for c in plain["calls"]}
    for call in shaped["calls"]:
        grows = call["role"] in ("proposer", "synthesizer")  # shown the schema; the critic is not
        assert (call["max_input_tokens"] > by_role[call["role"]]) is grows, call["role"]
