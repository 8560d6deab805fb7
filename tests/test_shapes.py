"""Every record a call returns keeps to its schema, and the output schemas describe nothing the
records never produce.

Real calls run once against the simulated panel (`conclave.SimulatedPanel`): a plain confer, a
council (review and synthesis), worker tools under a cost cap (priced and unpriced), failures
(a rate-limited member, a chair replaced twice), dry runs, debates (with tools, with an invalid
critique and a replaced synthesizer), and the fetch, verify and list_providers tools. Each
record's `to_dict()` (results, answers, role answers, review, usage, cost caps, the worker_tools
block, plans, rounds, totals, degraded reasons) is validated against the schema it belongs to,
and each whole result against the self-contained schema `tools/list` publishes too. Walking the
results beside their schemas collects each property the schemas declare that some result
carries: every declared property must be seen, or be listed in NEVER_PRODUCED with its reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urldefrag, urljoin

import anyio
import jsonschema
import orjson
import pytest
import yaml

import conclave
from conclave.app.catalog import Invocation, tool_spec
from conclave.app.runtime import open_runtime
from conclave.app.server.surface import describe
from conclave.app.sim import NativeCall, Reply, Rule, Scenario
from conclave.deliberation.results import ConferResult, CoordinateResult, RoleAnswer
from conclave.schema.answer_schema import choices_schema
from conclave.schema.config import Config, load_config
from conclave.schema.schemas import acceptor, relative_path, resolve, schema_uri, validator

CHAIR_ASK = "Write the final answer to the question"  # confer's synthesis (chair.user.txt)
CRITIC_ASK = "Review this proposal on your own"
SYNTHESIZER_ASK = "Write the final answer to the task"
VERIFY_CALL = {"checks": [{"type": "math", "expression": "17 * 23", "expected": 391}]}
EVERY_CHECK = [
    {"type": "regex", "pattern": "^4[0-9]$", "text": "47"},
    {"type": "json_schema", "schema": {"type": "integer"}, "instance": 47},
    {"type": "math", "expression": "17 * 23", "expected": 391},
    {"type": "equals", "actual": 1, "expected": 1},
    {"type": "contains", "text": "lighthouse", "substring": "light"},
    {"type": "json_parse", "text": "[1, 2]"},
]
OUTPUTS = {
    tool: f"{tool}.output.json" for tool in ("confer", "coordinate", "fetch", "verify", "list_providers")
}

# Declared properties no run here produces, each with why. Keep it short: a new entry needs a
# reason a reader can check in the code that writes the result.
NEVER_PRODUCED: dict[str, str] = {}


@dataclasses.dataclass(frozen=True)
class Produced:
    schema: str  # the URI of the schema it must keep to: a file of schemas/, maybe a part of one
    label: str
    value: Any


def _config(tmp: Path) -> Config:
    """The packaged defaults with the event log in `tmp` and no retries (a failure fails at once)."""
    path = tmp / "config.yaml"
    overlay = {"telemetry": {"path": str(tmp / "events.ndjson")}, "limits": {"retry": {"max_attempts": 1}}}
    path.write_text(yaml.safe_dump(overlay), encoding="utf-8")
    return load_config(str(path), env={}, dotenv=None)


def _unpriced(config: Config, name: str) -> Config:
    providers = {**config.providers, name: dataclasses.replace(config.providers[name], price=None)}
    return dataclasses.replace(config, providers=providers)


def _records(result: ConferResult | CoordinateResult, label: str) -> Iterator[Produced]:
    """The result and every record in it, each with the schema (part) it belongs to."""
    tools_on = result.tools_on
    if isinstance(result, ConferResult):
        yield Produced(schema_uri("confer.output.json"), label, result.to_dict())
        for answer in result.answers:
            for on in {tools_on, True}:
                yield Produced(schema_uri("defs/answer.json"), f"{label} answer", answer.to_dict(tools_on=on))
            for call in answer.inner_tool_calls:
                items = "defs/answer.json#/properties/inner_tool_calls/items"
                yield Produced(schema_uri(items), f"{label} inner call", call.to_dict())
        roles: list[RoleAnswer] = [result.synthesis] if result.synthesis else []
        # result.reviewers are kept for totals and transcripts, never returned: their role is none
        # of a role answer's.
        if result.review is not None:
            review = "confer.output.json#/properties/review"
            yield Produced(schema_uri(review), f"{label} review", result.review.to_dict())
            for ranking in result.review.rankings:
                rankings = f"{review}/properties/rankings/items"
                yield Produced(schema_uri(rankings), f"{label} ranking", ranking.to_dict())
            for standing in result.review.aggregate:
                aggregate = f"{review}/properties/aggregate/items"
                yield Produced(schema_uri(aggregate), f"{label} standing", standing.to_dict())
        plan = "defs/plan.json"
    else:
        yield Produced(schema_uri("coordinate.output.json"), label, result.to_dict())
        rounds = "coordinate.output.json#/properties/rounds/items"
        for number in result.rounds:
            yield Produced(schema_uri(rounds), f"{label} round", number.to_dict(tools_on=tools_on))
        roles = [r.proposal for r in result.rounds] + [c for r in result.rounds for c in r.critiques]
        roles += [result.synthesis] if result.synthesis else []
        for totals in result.per_role.values():
            yield Produced(
                schema_uri("coordinate.output.json#/$defs/totals"), f"{label} totals", totals.to_dict()
            )
        plan = "defs/plan.json#/$defs/debate"
    for role in roles:
        yield Produced(
            schema_uri("defs/role_answer.json"), f"{label} {role.role}", role.to_dict(tools_on=tools_on)
        )
        for fallback in (role.fallback_from, *role.fallbacks_tried):
            if fallback is not None:
                uri = schema_uri("defs/degraded_reason.json#/$defs/fallback")
                yield Produced(uri, f"{label} fallback", fallback.to_dict())
    for reason in result.degraded_reasons:
        yield Produced(schema_uri("defs/degraded_reason.json"), f"{label} degraded reason", reason.to_dict())
    answers = [*getattr(result, "answers", ()), *roles]
    for usage in [result.usage, *(a.usage for a in answers)]:
        yield Produced(schema_uri("defs/usage.json"), f"{label} usage", usage.to_dict())
    for answer in answers:
        if answer.cost_cap is not None:
            yield Produced(schema_uri("defs/cost_cap.json"), f"{label} cost cap", answer.cost_cap.to_dict())
    if result.worker_tools is not None:
        yield Produced(
            schema_uri("defs/worker_tools.json"), f"{label} worker_tools", result.worker_tools.to_dict()
        )
        if result.worker_tools.cost_cap is not None:
            summary = result.worker_tools.cost_cap.to_dict()
            yield Produced(
                schema_uri("defs/worker_tools.json#/properties/cost_cap"), f"{label} call cap", summary
            )
    if result.plan is not None:
        yield Produced(schema_uri(plan), f"{label} plan", dict(result.plan))


async def _produce(tmp: Path) -> list[Produced]:
    out: list[Produced] = []
    async with conclave.SimulatedPanel(_config(tmp)) as sim:
        panel, priced = sim.panel, sim.config
        unpriced = _unpriced(priced, "sim-gemini")
        async with conclave.Conclave(priced) as c:
            out += _records(await c.confer("Which queue?", session_id="shapes-plain"), "plain")
            decided = await c.confer(
                "Which queue?", answer_schema=choices_schema(["SQS", "Kafka"]), synthesize=True
            )
            out += _records(decided, "structured")
            council = await c.confer(
                "Which queue?", review=True, synthesize=True, session_id="shapes-council"
            )
            out += _records(council, "council")

            # sim-openai checks a sum with verify; the cap is tiny, in warn mode: exceeded, priced
            tool_turn = Reply(tool_calls=(NativeCall("verify", VERIFY_CALL),))
            panel.set_scenario("sim-gpt", Scenario(replies=(tool_turn, Reply(text="391: checked."))))
            tools = await c.confer(
                "Is 17 x 23 = 391?",
                providers=["sim-openai", "sim-anthropic"],
                worker_tools=["verify", "fetch", "shell"],
                worker_tool_cost_cap_usd=1e-9,
                worker_tool_cost_cap_mode="warn",
            )
            out += _records(tools, "tools")

            # sim-openai is rate limited; the chair fails on sim-anthropic and sim-openai, and
            # sim-gemini (the last fallback) writes the synthesis
            limited = Reply(status=429, headers={"retry-after": "2", "x-request-id": "req-shapes"})
            failed = Reply(status=500)
            panel.set_scenario("sim-gpt", Scenario(replies=(limited,), rules=(Rule(CHAIR_ASK, failed),)))
            panel.set_scenario("sim-claude", Scenario(rules=(Rule(CHAIR_ASK, failed),)))
            out += _records(await c.confer("Which queue?", synthesize=True), "failures")
            panel.reset()

            # sim-openai is slow: once the other two have answered, it is stopped as late
            panel.set_scenario("sim-gpt", Scenario(latency_ms=5000))
            quorum = await c.confer("Which queue?", quorum=2, grace_seconds=0.1)
            assert [r.status for r in quorum.degraded_reasons] == ["late"]
            out += _records(quorum, "quorum")
            panel.reset()

        # sim-openai's key is refused: its fallback, sim-gemini (not asked), answers in its place
        openai = dataclasses.replace(priced.providers["sim-openai"], fallbacks=("sim-gemini",))
        standing_in = dataclasses.replace(priced, providers={**priced.providers, "sim-openai": openai})
        panel.set_scenario("sim-gpt", Scenario(replies=(Reply(status=401),)))
        async with conclave.Conclave(standing_in) as c:
            pair = ["sim-openai", "sim-anthropic"]
            out += _records(await c.confer("Which queue?", providers=pair, dry_run=True), "fallback plan")
            replaced = await c.confer("Which queue?", providers=pair)
            assert replaced.answers[0].fallback_from is not None
            out += _records(replaced, "fallback")
        panel.reset()

        async with conclave.Conclave(priced) as c:
            out += _records(await c.coordinate("Pick a cache policy.", dry_run=True), "debate plan")
            debate = await c.coordinate(
                "Pick a cache policy.",
                rounds=2,
                worker_tools=["verify"],
                worker_tool_cost_cap_usd=1e-9,
                worker_tool_cost_cap_mode="warn",
            )
            out += _records(debate, "debate")
            shaped = await c.coordinate("Pick a queue.", answer_schema=choices_schema(["SQS", "Kafka"]))
            assert shaped.synthesis is not None and shaped.synthesis.value is not None
            out += _records(shaped, "structured debate")

            # a critic that never answers with an envelope, and a synthesizer replaced
            panel.set_scenario("sim-gemini", Scenario(rules=(Rule(CRITIC_ASK, Reply(text="No JSON here.")),)))
            panel.set_scenario("sim-claude", Scenario(rules=(Rule(SYNTHESIZER_ASK, failed),)))
            out += _records(await c.coordinate("Pick a cache policy."), "broken debate")
            panel.reset()

            out.append(Produced(schema_uri("fetch.output.json"), "fetch", await c.fetch(sim.page_url)))
            out.append(Produced(schema_uri("verify.output.json"), "verify", await c.verify(EVERY_CHECK)))

        async with conclave.Conclave(unpriced) as c:
            plan = await c.confer("Which queue?", review=True, synthesize=True, dry_run=True)
            out += _records(plan, "council plan")
            tool_turn = Reply(tool_calls=(NativeCall("verify", VERIFY_CALL),))
            panel.set_scenario("sim-gemini", Scenario(replies=(tool_turn, Reply(text="391: checked."))))
            capped = await c.confer(
                "Is 17 x 23 = 391?",
                providers=["sim-gemini"],
                worker_tools=["verify"],
                worker_tool_cost_cap_usd=0.5,
            )
            out += _records(capped, "unpriced tools")

        async with open_runtime(priced) as runtime:
            listed = await tool_spec("list_providers").run({}, Invocation(runtime.tool_context, runtime))
            out.append(Produced(schema_uri("list_providers.output.json"), "list_providers", listed))

    for number, line in enumerate((tmp / "events.ndjson").read_bytes().splitlines(), 1):
        event = orjson.loads(line)
        out.append(Produced(schema_uri(f"events/{event['event']}.json"), f"event line {number}", event))
    return out


@pytest.fixture(scope="module")
def produced(tmp_path_factory: pytest.TempPathFactory) -> list[Produced]:
    return anyio.run(_produce, tmp_path_factory.mktemp("shapes"), backend="asyncio")


def _errors(uri: str, value: Any) -> list[str]:
    whole = validator(relative_path(uri))
    check = whole if not urldefrag(uri)[1] else whole.evolve(schema=resolve(uri))
    return [f"{list(e.absolute_path)}: {e.message}" for e in check.iter_errors(value)]


def test_every_record_keeps_to_its_schema(produced: list[Produced]) -> None:
    broken = [f"{p.label} ({p.schema}): {error}" for p in produced for error in _errors(p.schema, p.value)]
    assert broken == []
    # results, answers, role answers, review, usage, cost caps, plans, rounds, totals, events...
    assert len({p.schema for p in produced}) >= 30


def test_every_result_takes_the_fast_path_and_keeps_to_the_published_schema(produced: list[Produced]) -> None:
    """The acceptor compiled with the shared shapes resolved still says "certainly valid" to real
    results, and the self-contained schema a client gets in `tools/list` accepts them too."""
    for tool, relative in OUTPUTS.items():
        results = [p.value for p in produced if p.schema == schema_uri(relative)]
        assert results, f"no {tool} result was produced"
        accept, published = acceptor(relative), describe(tool_spec(tool))["outputSchema"]
        assert accept is not None
        client = jsonschema.Draft202012Validator(published, format_checker=jsonschema.FormatChecker())
        for result in results:
            assert accept(result), f"{tool}: a valid result missed the fast path"
            assert list(client.iter_errors(result)) == []


# ------------------------------------------------------------------ every declared property is produced


def _at(address: str, pointer: str) -> str:
    return f"{address}#{pointer}"


def declared(address: str, pointer: str = "", seen: set[str] | None = None) -> set[str]:
    """`file#pointer` of every property declared in the schema there and in what it leads to."""
    seen = set() if seen is None else seen
    if _at(address, pointer) in seen:
        return set()
    seen.add(_at(address, pointer))
    node, found = resolve(_at(address, pointer)), set()
    if not isinstance(node, dict):
        return found
    if isinstance(node.get("$ref"), str):
        target_address, target_pointer = urldefrag(urljoin(address, node["$ref"]))
        found |= declared(target_address, target_pointer, seen)
    for name in node.get("properties", {}):
        found.add(_at(address, f"{pointer}/properties/{name}"))
        found |= declared(address, f"{pointer}/properties/{name}", seen)
    for keyword in ("anyOf", "allOf"):
        for i in range(len(node.get(keyword, []))):
            found |= declared(address, f"{pointer}/{keyword}/{i}", seen)
    for keyword in ("items", "additionalProperties"):
        if isinstance(node.get(keyword), dict):
            found |= declared(address, f"{pointer}/{keyword}", seen)
    return found


def carried(value: Any, address: str, pointer: str = "") -> Iterator[str]:
    """`file#pointer` of every declared property `value` carries, walked beside its schema."""
    node = resolve(_at(address, pointer))
    if not isinstance(node, dict):
        return
    if isinstance(node.get("$ref"), str):
        yield from carried(value, *urldefrag(urljoin(address, node["$ref"])))
    for keyword in ("anyOf", "allOf"):
        for i in range(len(node.get(keyword, []))):
            yield from carried(value, address, f"{pointer}/{keyword}/{i}")
    if isinstance(value, dict):
        properties = node.get("properties", {})
        for name, member in value.items():
            if name in properties:
                yield _at(address, f"{pointer}/properties/{name}")
                yield from carried(member, address, f"{pointer}/properties/{name}")
            elif isinstance(node.get("additionalProperties"), dict):
                yield from carried(member, address, f"{pointer}/additionalProperties")
    elif isinstance(value, list) and isinstance(node.get("items"), dict):
        for item in value:
            yield from carried(item, address, f"{pointer}/items")


def _short(location: str) -> str:
    return location.removeprefix(schema_uri(""))


def test_every_property_the_output_schemas_declare_is_produced(produced: list[Produced]) -> None:
    roots = [schema_uri(relative) for relative in OUTPUTS.values()]
    declared_here = {_short(d) for root in roots for d in declared(root)}
    seen = {_short(c) for p in produced if p.schema in roots for c in carried(p.value, p.schema)}
    never = sorted(declared_here - seen - set(NEVER_PRODUCED))
    assert never == [], "declared, but no run produced it (produce it, or list it in NEVER_PRODUCED):\n" + (
        "\n".join(never)
    )
    assert sorted(set(NEVER_PRODUCED) & seen) == [], "listed in NEVER_PRODUCED, but produced"
    assert len(declared_here) > 100
