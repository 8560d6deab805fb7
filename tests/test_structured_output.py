"""Structured output on every wire (docs/providers.md#structured-output): what each adapter puts
on the wire for a request's `answer_schema`, over real loopback HTTP against the simulated panel,
which answers with an object valid against the schema and refuses what each real API refuses."""

from __future__ import annotations

import copy
import dataclasses
import importlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import httpx
import jsonschema
import orjson
import pytest

from conclave.app.sim import NativeCall, Reply, Scenario, SimPanel
from conclave.app.sim.structured import synthesize, walk
from conclave.core.errors import PermanentProviderError
from conclave.core.messages import Completion, CompletionRequest, ToolDeclaration
from conclave.providers.kinds import KINDS as PROVIDER_KINDS
from conclave.schema.config import Config
from tests.support import ScriptedTransport, open_pool, provider_entry

pytestmark = pytest.mark.anyio

KINDS = ["openai", "anthropic", "gemini"]
ANTHROPIC_HEADERS = {"x-api-key": "sk-ant-test", "anthropic-version": "2023-06-01"}
# Strict-compatible: every object closed, every property required. Bounds and item counts are
# in the portable subset, though Anthropic's structured outputs refuse them.
STRICT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "choice": {"type": "string", "enum": ["A", "B", "C"], "description": "The option chosen."},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        "reasons": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 3},
        "detail": {
            "type": "object",
            "properties": {
                "risk": {"type": "integer", "minimum": 1, "maximum": 5},
                "ok": {"type": "boolean"},
            },
            "required": ["risk", "ok"],
            "additionalProperties": False,
        },
    },
    "required": ["choice", "confidence", "reasons", "detail"],
    "additionalProperties": False,
}
# Not strict-compatible: `note` is optional and the nested object is open.
LOOSE: dict[str, Any] = {
    "type": "object",
    "properties": {
        "choice": {"type": "string", "enum": ["A", "B"]},
        "note": {"type": "string"},
        "extra": {"type": "object", "properties": {"n": {"type": "integer"}}},
    },
    "required": ["choice"],
}
TOOL = ToolDeclaration(
    "fetch",
    "Fetch a URL.",
    {"type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]},
)
NATIVE_FIELDS = ("response_format", "output_config", "output_format")
GEMINI_FIELDS = ("responseMimeType", "responseJsonSchema")


def valid(schema: dict[str, Any], value: Any) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(value)



@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=5.0, verify=False, trust_env=False) as c:
        yield c


class Harness:
    def __init__(self, panel: SimPanel, make_config: Callable[..., Config]) -> None:
        self.panel = panel
        self.make_config = make_config

    async def ask(self, kind: str, request: CompletionRequest, model: str = "m1") -> Completion:
        entry = {"kind": kind, "model": model, "base_url": self.panel.base_url(kind)}
        config = self.make_config({"p": entry}, retry={"max_attempts": 1})
        async with open_pool(config) as pool:
            return await pool.get("p").complete(request, deadline=anyio.current_time() + 10)

    def body(self) -> dict[str, Any]:
        body = self.panel.received[-1].body
        assert isinstance(body, dict)
        return body


@pytest.fixture
def sim(panel: SimPanel, make_config: Callable[..., Config]) -> Harness:
    return Harness(panel, make_config)


def asking(
    schema: dict[str, Any] | None, question: str = "Which option, as JSON?", **kwargs: Any
) -> CompletionRequest:
    return CompletionRequest.ask(question, answer_schema=schema, **kwargs)


def json_answer(completion: Completion) -> Any:
    return orjson.loads(completion.text)


def native_fields(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    if kind == "gemini":
        config = body.get("generationConfig") or {}
        return {k: config[k] for k in GEMINI_FIELDS if k in config}
    return {k: body[k] for k in NATIVE_FIELDS if k in body}


# ---------------------------------------------------------------------------- every wire


@pytest.mark.parametrize("kind", KINDS)
async def test_every_kind_says_it_has_native_structured_output(kind: str) -> None:
    assert PROVIDER_KINDS[kind].structured_output


@pytest.mark.parametrize("kind", KINDS)
async def test_the_answer_is_an_object_valid_against_the_schema(sim: Harness, kind: str) -> None:
    c = await sim.ask(kind, asking(STRICT))
    answer = json_answer(c)
    assert isinstance(answer, dict)
    assert valid(STRICT, answer), answer
    assert c.finish_reason == "stop"


async def test_openai_sends_response_format_json_schema_strict_when_the_schema_allows(sim: Harness) -> None:
    await sim.ask("openai", asking(STRICT))
    assert sim.body()["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": STRICT, "strict": True},
    }


async def test_openai_sends_a_schema_strict_mode_cannot_take_with_strict_false(sim: Harness) -> None:
    c = await sim.ask("openai", asking(LOOSE))
    sent = sim.body()["response_format"]["json_schema"]
    assert sent["strict"] is False
    assert sent["schema"] == LOOSE
    assert valid(LOOSE, json_answer(c))


async def test_openai_schema_name_is_the_requests_made_fit_for_the_field(sim: Harness) -> None:
    await sim.ask("openai", asking(STRICT, answer_schema_name="the verdict!"))
    assert sim.body()["response_format"]["json_schema"]["name"] == "the_verdict_"


async def test_anthropic_sends_output_config_format_without_a_beta_header(sim: Harness) -> None:
    c = await sim.ask("anthropic", asking(STRICT))
    received = sim.panel.received[-1]
    sent = sim.body()["output_config"]["format"]
    assert sent["type"] == "json_schema"
    assert "output_format" not in sim.body()
    assert "anthropic-beta" not in received.headers
    # The limits structured outputs refuse are moved into the description; the rest is as given.
    schema = sent["schema"]
    assert schema["properties"]["choice"] == STRICT["properties"]["choice"]
    assert schema["properties"]["confidence"] == {
        "type": "number",
        "description": "(minimum: 0, maximum: 1)",
    }
    assert schema["properties"]["reasons"]["description"] == "(minItems: 2, maxItems: 3)"
    assert "minItems" not in schema["properties"]["reasons"]
    # As a model reads the limits there, so does the panel: the answer keeps the caller's schema.
    assert valid(STRICT, json_answer(c))


async def test_anthropic_closes_every_object_a_loose_schema_leaves_open(sim: Harness) -> None:
    c = await sim.ask("anthropic", asking(LOOSE))
    schema = sim.body()["output_config"]["format"]["schema"]
    objects = [node for _, node in walk(schema) if node.get("type") == "object"]
    assert len(objects) == 2
    assert all(node["additionalProperties"] is False for node in objects)
    assert valid(LOOSE, json_answer(c)), "a closed schema only narrows what the caller allows"


async def test_anthropic_keeps_the_callers_schema_unchanged(sim: Harness) -> None:
    schema = copy.deepcopy(STRICT)
    await sim.ask("anthropic", asking(schema))
    assert schema == STRICT


async def test_gemini_sends_a_json_mime_type_and_the_schema_as_response_json_schema(sim: Harness) -> None:
    await sim.ask("gemini", asking(STRICT, max_tokens=300))
    config = sim.body()["generationConfig"]
    assert config == {
        "maxOutputTokens": 300,
        "responseMimeType": "application/json",
        "responseJsonSchema": STRICT,
    }


@pytest.mark.parametrize("kind", KINDS)
async def test_without_an_answer_schema_nothing_new_is_sent(sim: Harness, kind: str) -> None:
    c = await sim.ask(kind, asking(None))
    assert native_fields(kind, sim.body()) == {}
    assert "anthropic-beta" not in sim.panel.received[-1].headers
    assert c.text.startswith("[simulated m1]"), "free text, as before"


@pytest.mark.parametrize("kind", KINDS)
def test_a_kind_without_structured_output_sends_no_schema(
    kind: str, make_config: Callable[..., Config], monkeypatch: pytest.MonkeyPatch
) -> None:
    module = importlib.import_module(f"conclave.providers.{kind}")
    monkeypatch.setattr(module, "KIND", dataclasses.replace(module.KIND, structured_output=False))
    entry = make_config({"p": provider_entry(kind, "m", "http://127.0.0.1:9")}).providers["p"]
    body = PROVIDER_KINDS[kind].adapter.body(asking(STRICT), entry)
    assert native_fields(kind, body) == {}, "the prompt alone asks for the JSON"


@pytest.mark.parametrize("kind", KINDS)
async def test_native_tools_and_structured_output_go_out_together(sim: Harness, kind: str) -> None:
    c = await sim.ask(kind, asking(STRICT, tools=(TOOL,)))
    body = sim.body()
    assert native_fields(kind, body), "the answer schema"
    assert body["tools"], "the declarations"
    assert valid(STRICT, json_answer(c))


@pytest.mark.parametrize("kind", KINDS)
async def test_a_tool_call_turn_then_the_structured_answer(sim: Harness, kind: str) -> None:
    sim.panel.set_scenario(
        "m1", Scenario(replies=(Reply(tool_calls=(NativeCall("fetch", {"url": "https://a"}),)),))
    )
    c = await sim.ask(kind, asking(STRICT, tools=(TOOL,)))
    assert [u.name for u in c.tool_uses] == ["fetch"]
    assert native_fields(kind, sim.body())


async def test_gemini_before_3_asks_for_json_in_the_prompt_alone_when_tools_are_declared(
    sim: Harness,
) -> None:
    await sim.ask("gemini", asking(STRICT, tools=(TOOL,)), model="gemini-2.5-flash")
    body = sim.body()
    assert body["tools"]
    assert native_fields("gemini", body) == {}, "Gemini 2.x refuses a JSON mime type with functions"
    await sim.ask("gemini", asking(STRICT), model="gemini-2.5-flash")
    assert native_fields("gemini", sim.body())["responseJsonSchema"] == STRICT


# ---------------------------------------------------------------------------- what the panel answers


@pytest.mark.parametrize("kind", KINDS)
async def test_a_scripted_value_is_the_answer(sim: Harness, kind: str) -> None:
    value = {"choice": "C", "confidence": 0.25, "reasons": ["x", "y"], "detail": {"risk": 2, "ok": False}}
    sim.panel.set_scenario("m1", Scenario(replies=(Reply(value=value),)))
    c = await sim.ask(kind, asking(STRICT))
    assert json_answer(c) == value


@pytest.mark.parametrize("kind", KINDS)
async def test_a_scripted_text_is_sent_as_written_even_when_it_breaks_the_schema(
    sim: Harness, kind: str
) -> None:
    sim.panel.set_scenario("m1", Scenario(replies=(Reply(text='{"choice": "Z"}'),)))
    c = await sim.ask(kind, asking(STRICT))
    assert c.text == '{"choice": "Z"}', "what a re-prompt is tested with"


@pytest.mark.parametrize("kind", KINDS)
async def test_the_synthesized_answer_is_deterministic(sim: Harness, kind: str) -> None:
    first = await sim.ask(kind, asking(STRICT))
    again = await sim.ask(kind, asking(STRICT))
    assert first.text == again.text


async def test_members_asked_the_same_question_do_not_all_answer_alike(sim: Harness) -> None:
    answers = [json_answer(await sim.ask("openai", asking(STRICT), model=f"member-{i}")) for i in range(8)]
    assert len({a["choice"] for a in answers}) > 1
    assert all(valid(STRICT, a) for a in answers)


async def test_a_role_answering_panel_still_answers_a_structured_request_with_an_object(
    make_config: Callable[..., Config],
) -> None:
    async with SimPanel(role_answers=True) as panel:
        c = await Harness(panel, make_config).ask("anthropic", asking(STRICT))
    assert valid(STRICT, json_answer(c))


def test_reply_value_round_trips_and_excludes_text() -> None:
    reply = Reply(value={"choice": "A", "nested": {"n": [1, 2]}})
    scenario = Scenario(replies=(reply,))
    assert Scenario.from_dict(orjson.loads(orjson.dumps(scenario.to_dict()))) == scenario
    with pytest.raises(ValueError, match="text or value"):
        Reply(text="x", value={"a": 1})
    with pytest.raises(ValueError, match=r"reply\.value"):
        Reply.from_dict({"value": [1, 2]})
    with pytest.raises(ValueError, match="must be JSON"):
        Reply(value={"a": object()})


async def test_a_scenario_with_a_value_can_be_put_over_the_control_api(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    url = f"http://127.0.0.1:{panel.port}/_sim/scenarios/m1"
    response = await client.put(url, json={"replies": [{"value": {"choice": "B"}}]})
    assert response.json() == {"ok": True, "model": "m1"}
    body = openai_body(response_format=json_schema(LOOSE, strict=False))
    answer = await client.post(panel.base_url("openai") + "/chat/completions", json=body)
    assert orjson.loads(answer.json()["choices"][0]["message"]["content"]) == {"choice": "B"}


SCHEMAS: list[dict[str, Any]] = [
    STRICT,
    LOOSE,
    {
        "type": "object",
        "properties": {"n": {"type": "integer", "exclusiveMinimum": 3, "exclusiveMaximum": 5}},
    },
    {"type": "object", "properties": {"x": {"type": "number", "minimum": 10, "multipleOf": 0.5}}},
    {"type": "object", "properties": {"x": {"type": "number", "maximum": -2}}},
    {"type": "object", "properties": {"s": {"type": "string", "minLength": 500, "maxLength": 600}}},
    {"type": "object", "properties": {"s": {"type": "string", "maxLength": 3}}},
    {"type": "object", "properties": {"when": {"type": "string", "format": "date-time"}}},
    {"type": "object", "properties": {"id": {"type": "string", "format": "uuid"}}},
    {"type": "object", "properties": {"v": {"anyOf": [{"type": "null"}, {"type": "integer", "minimum": 7}]}}},
    {"type": "object", "properties": {"v": {"type": ["null", "boolean"]}}},
    {"type": "object", "properties": {"k": {"const": "fixed"}}, "required": ["k", "other"]},
    {
        "type": "object",
        "$defs": {
            "item": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
        },
        "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 3}},
    },
    {"type": "object", "allOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]}]},
    {
        "type": "object",
        "properties": {"pair": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "boolean"}]}},
    },
    {"type": "object"},
]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_the_synthesized_value_is_valid_against_the_schema(schema: dict[str, Any]) -> None:
    value = synthesize(schema, model="m1", question="Which?")
    assert valid(schema, value), value
    assert synthesize(schema, model="m1", question="Which?") == value


# ---------------------------------------------------------------------------- what the panel refuses


def openai_body(text: str = "Which option?", **extra: Any) -> dict[str, Any]:
    return {"model": "m1", "messages": [{"role": "user", "content": text}], **extra}


def json_schema(schema: dict[str, Any], *, strict: bool, name: str = "answer") -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": strict}}


async def post_openai(panel: SimPanel, client: httpx.AsyncClient, body: dict[str, Any]) -> httpx.Response:
    return await client.post(panel.base_url("openai") + "/chat/completions", json=body)


async def test_openai_refuses_strict_with_an_open_object_in_its_own_error_shape(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    response = await post_openai(panel, client, openai_body(response_format=json_schema(LOOSE, strict=True)))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == "response_format"
    assert error["code"] is None
    assert error["message"].endswith(
        "Invalid schema for response_format 'answer': In context=(), 'additionalProperties' is required "
        "to be supplied and to be false."
    )
    assert panel.calls("m1") == 0, "refused before reaching a model"


async def test_openai_refuses_strict_with_a_property_left_out_of_required_naming_where(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    schema = copy.deepcopy(STRICT)
    schema["properties"]["detail"]["required"] = ["risk"]
    response = await post_openai(panel, client, openai_body(response_format=json_schema(schema, strict=True)))
    assert response.status_code == 400
    assert response.json()["error"]["message"].endswith(
        "In context=('properties', 'detail'), 'required' is required to be supplied and to be an array "
        "including every key in properties. Missing 'ok'."
    )


async def test_openai_takes_the_same_schema_without_strict(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    response = await post_openai(panel, client, openai_body(response_format=json_schema(LOOSE, strict=False)))
    assert response.status_code == 200
    assert valid(LOOSE, orjson.loads(response.json()["choices"][0]["message"]["content"]))


@pytest.mark.parametrize(
    ("response_format", "param"),
    [
        ({"type": "json_schema"}, "response_format.json_schema"),
        ({"type": "json_schema", "json_schema": {"schema": STRICT}}, "response_format.json_schema.name"),
        (
            {"type": "json_schema", "json_schema": {"name": "a b", "schema": STRICT}},
            "response_format.json_schema.name",
        ),
        ({"type": "xml"}, "response_format.type"),
        ({"type": "json_object"}, "messages"),  # the messages must say "json"
    ],
)
async def test_openai_refuses_a_malformed_response_format(
    panel: SimPanel, client: httpx.AsyncClient, response_format: dict[str, Any], param: str
) -> None:
    response = await post_openai(panel, client, openai_body(response_format=response_format))
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param


async def test_openai_json_mode_answers_one_object(panel: SimPanel, client: httpx.AsyncClient) -> None:
    body = openai_body("Answer in JSON.", response_format={"type": "json_object"})
    response = await post_openai(panel, client, body)
    assert isinstance(orjson.loads(response.json()["choices"][0]["message"]["content"]), dict)


def anthropic_body(**extra: Any) -> dict[str, Any]:
    return {
        "model": "m1",
        "max_tokens": 256,
        "messages": [{"role": "user", "content": "Which option?"}],
        **extra,
    }


async def post_anthropic(
    panel: SimPanel, client: httpx.AsyncClient, body: dict[str, Any], **headers: str
) -> httpx.Response:
    url = panel.base_url("anthropic") + "/v1/messages"
    return await client.post(url, json=body, headers={**ANTHROPIC_HEADERS, **headers})


CLOSED = {
    "type": "object",
    "properties": {"choice": {"type": "string", "enum": ["A", "B"]}},
    "required": ["choice"],
    "additionalProperties": False,
}


async def test_anthropic_refuses_the_beta_output_format_without_its_header(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    fmt = {"type": "json_schema", "schema": CLOSED}
    response = await post_anthropic(panel, client, anthropic_body(output_format=fmt))
    assert response.status_code == 400
    body = response.json()
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].endswith("output_format: Extra inputs are not permitted")
    assert body["request_id"]


async def test_anthropic_takes_the_beta_output_format_with_its_header_and_answers_a_json_text_block(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    fmt = {"type": "json_schema", "schema": CLOSED}
    response = await post_anthropic(
        panel,
        client,
        anthropic_body(output_format=fmt),
        **{"anthropic-beta": "structured-outputs-2025-11-13"},
    )
    assert response.status_code == 200
    content = response.json()["content"]
    assert [block["type"] for block in content] == ["text"]
    assert valid(CLOSED, orjson.loads(content[0]["text"]))


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        (
            {"type": "object", "properties": {"a": {"type": "string"}}},
            "'additionalProperties' must be explicitly set to false",
        ),
        (
            CLOSED | {"properties": {"n": {"type": "number", "minimum": 0}}, "required": ["n"]},
            "'minimum' is not supported",
        ),
        (CLOSED | {"properties": {"l": {"type": "array", "minItems": 2}}, "required": ["l"]}, "'minItems'"),
    ],
)
async def test_anthropic_refuses_what_structured_outputs_do_not_support(
    panel: SimPanel, client: httpx.AsyncClient, schema: dict[str, Any], words: str
) -> None:
    body = anthropic_body(output_config={"format": {"type": "json_schema", "schema": schema}})
    response = await post_anthropic(panel, client, body)
    assert response.status_code == 400
    assert words in response.json()["error"]["message"]
    assert "output_config.format.schema" in response.json()["error"]["message"]


def gemini_body(config: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "contents": [{"role": "user", "parts": [{"text": "Which option?"}]}],
        "generationConfig": config,
        **extra,
    }


async def post_gemini(
    panel: SimPanel, client: httpx.AsyncClient, body: dict[str, Any], model: str = "m1"
) -> httpx.Response:
    url = f"{panel.base_url('gemini')}/v1beta/models/{model}:generateContent"
    return await client.post(url, json=body, headers={"x-goog-api-key": "g-test"})


async def test_gemini_refuses_a_json_schema_without_the_json_mime_type(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    response = await post_gemini(panel, client, gemini_body({"responseJsonSchema": CLOSED}))
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["code"], error["status"]) == (400, "INVALID_ARGUMENT")
    assert "response_mime_type" in error["message"]


async def test_gemini_refuses_an_unknown_mime_type(panel: SimPanel, client: httpx.AsyncClient) -> None:
    response = await post_gemini(panel, client, gemini_body({"responseMimeType": "text/csv"}))
    assert response.status_code == 400
    assert "allowed mimetypes" in response.json()["error"]["message"]


async def test_gemini_2_refuses_a_json_mime_type_with_function_declarations(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    tools = [
        {
            "functionDeclarations": [
                {"name": "fetch", "description": "d", "parametersJsonSchema": {"type": "object"}}
            ]
        }
    ]
    config = {"responseMimeType": "application/json", "responseJsonSchema": CLOSED}
    old = await post_gemini(panel, client, gemini_body(config, tools=tools), model="gemini-2.5-flash")
    assert old.status_code == 400
    assert old.json()["error"]["message"].endswith(
        "Function calling with a response mime type: 'application/json' is unsupported"
    )
    new = await post_gemini(panel, client, gemini_body(config, tools=tools), model="gemini-3-pro-preview")
    assert new.status_code == 200


async def test_gemini_json_mode_without_a_schema_answers_one_object(
    panel: SimPanel, client: httpx.AsyncClient
) -> None:
    response = await post_gemini(panel, client, gemini_body({"responseMimeType": "application/json"}))
    text = response.json()["candidates"][0]["content"]["parts"][0]["text"]
    assert isinstance(orjson.loads(text), dict)


async def test_a_refusal_reaches_the_caller_as_a_permanent_bad_request(sim: Harness) -> None:
    # Only a hand-made wire could send this: the adapter never sets strict for a loose schema.
    sim.panel.set_scenario("m1", Scenario(replies=(Reply(status=400, error_message="Invalid schema"),)))
    with pytest.raises(PermanentProviderError) as caught:
        await sim.ask("openai", asking(STRICT))
    assert caught.value.code == "bad_request"


# ---------------------------------------------------------------------------- recorded replies


@pytest.mark.parametrize(
    ("kind", "model", "sample"),
    [
        ("openai", "gpt-4.1-mini", "openai_structured_output"),
        ("anthropic", "claude-sonnet-4-5", "anthropic_structured_output"),
        ("gemini", "gemini-2.5-flash", "gemini_structured_output"),
    ],
)
async def test_a_structured_reply_is_read_as_its_json_text(
    make_config: Callable[..., Config], kind: str, model: str, sample: str
) -> None:
    bases = {"openai": "https://api.openai.com/v1", "anthropic": "https://api.anthropic.com"}
    base = bases.get(kind, "https://generativelanguage.googleapis.com")
    config = make_config({"p": provider_entry(kind, model, base)}, retry={"max_attempts": 1})
    transport = ScriptedTransport(sample)
    async with open_pool(config, transport) as pool:
        c = await pool.get("p").complete(asking(CLOSED), deadline=anyio.current_time() + 5)
    assert orjson.loads(c.text) == {"choice": "B", "reason": "Fewer moving parts."}
    assert c.finish_reason == "stop"
    assert native_fields(kind, transport.bodies()[0])


async def test_an_openai_structured_output_refusal_is_a_content_filter_finish(
    make_config: Callable[..., Config],
) -> None:
    config = make_config(
        {"p": provider_entry("openai", "gpt-4.1-mini", "https://api.openai.com/v1")},
        retry={"max_attempts": 1},
    )
    async with open_pool(config, ScriptedTransport("openai_structured_refusal")) as pool:
        c = await pool.get("p").complete(asking(CLOSED), deadline=anyio.current_time() + 5)
    assert (c.text, c.finish_reason) == ("", "content_filter")
