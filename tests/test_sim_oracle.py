"""The simulated panel's oracle (conclave/app/sim/oracle.py): members answer known questions right
at their configured accuracies, with errors correlated through the item's shared difficulty,
every draw seeded; and the panel answers with its draws over real HTTP, scripts first."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

import conclave
from conclave.app.sim import Oracle, OracleItem, Reply, Scenario, SimPanel
from conclave.schema.answer_schema import choices_schema, number_schema
from conclave.schema.config import load_config

MODELS = ("sim-gpt", "sim-claude", "sim-gemini")
NUMBER = number_schema()
CHOICE = choices_schema(["A", "B", "C", "D"])
EXACT: dict[str, Any] = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "reason": {"type": "string"}},
    "required": ["answer", "reason"],
    "additionalProperties": False,
}
INSTRUCTION = "\n\nGive your final answer as one JSON object valid against this JSON Schema."


def number_items(n: int) -> list[OracleItem]:
    return [
        OracleItem(f"Item {i}: what is {i} times 3?", "value", 3 * i, (3 * i + 1, 3 * i - 1, 3 * i + 3))
        for i in range(n)
    ]


def choice_items(n: int) -> list[OracleItem]:
    return [OracleItem(f"Item {i}: which letter?", "choice", "A", ("B", "C", "D")) for i in range(n)]


def asked(item: OracleItem) -> str:
    """The question as a member's prompt holds it: the schema's instruction after it."""
    return item.question + INSTRUCTION


def drawn(oracle: Oracle, model: str, item: OracleItem, schema: dict[str, Any] = NUMBER) -> Any:
    out = oracle.answer(model, asked(item), schema)
    assert out is not None
    return out[item.field]


# ------------------------------------------------------------------------- the draw model


def test_each_member_answers_right_at_its_configured_accuracy() -> None:
    items = number_items(2000)
    accuracy = {"sim-gpt": 0.85, "sim-claude": 0.7, "sim-gemini": 0.55}
    oracle = Oracle(items, accuracy, correlation=0.5, seed=11)
    for model, configured in accuracy.items():
        right = sum(drawn(oracle, model, item) == item.correct for item in items)
        assert abs(right / len(items) - configured) <= 0.03, (model, right / len(items))


def test_a_model_not_configured_has_the_default_accuracy_and_the_ends_are_exact() -> None:
    items = number_items(1000)
    oracle = Oracle(items, {"always": 1.0, "never": 0.0}, default_accuracy=0.3, seed=2)
    assert all(drawn(oracle, "always", item) == item.correct for item in items)
    assert all(drawn(oracle, "never", item) in item.wrong for item in items)
    other = sum(drawn(oracle, "other", item) == item.correct for item in items) / len(items)
    assert abs(other - 0.3) <= 0.04
    assert oracle.accuracy_of("other") == 0.3 and oracle.accuracy_of("always") == 1.0


def co_errors(correlation: float) -> tuple[float, float, float]:
    """Two members of accuracy 0.7 over 2000 items: how often both are wrong, how often they
    give the same value, and how often two wrong answers are the same one."""
    items = choice_items(2000)
    oracle = Oracle(items, {"a": 0.7, "b": 0.7}, correlation=correlation, seed=5)
    both = agree = same_wrong = 0
    for item in items:
        a, b = drawn(oracle, "a", item, CHOICE), drawn(oracle, "b", item, CHOICE)
        wrong = a != item.correct and b != item.correct
        both += wrong
        agree += a == b
        same_wrong += wrong and a == b
    return both / len(items), agree / len(items), same_wrong / max(both, 1)


def test_correlated_members_are_wrong_together_and_on_the_same_wrong_answer() -> None:
    independent, correlated = co_errors(0.0), co_errors(0.8)
    assert abs(independent[0] - 0.3 * 0.3) <= 0.03, "independent errors co-occur by chance alone"
    assert correlated[0] >= independent[0] + 0.08, (independent, correlated)
    assert correlated[1] >= independent[1] + 0.15, "so they agree far more often"
    assert correlated[2] >= independent[2] + 0.25, "and two wrong answers are mostly the same one"


def majority_and_members(accuracy: Sequence[float], correlation: float) -> tuple[float, list[float]]:
    items = choice_items(2000)
    oracle = Oracle(items, dict(zip(MODELS, accuracy, strict=True)), correlation=correlation, seed=9)
    right = Counter[str]()
    majority = 0
    for item in items:
        values = [drawn(oracle, model, item, CHOICE) for model in MODELS]
        for model, value in zip(MODELS, values, strict=True):
            right[model] += value == item.correct
        top, votes = Counter(values).most_common(1)[0]
        majority += votes >= 2 and top == item.correct
    return majority / len(items), [right[m] / len(items) for m in MODELS]


def test_a_majority_vote_beats_its_members_only_when_their_errors_are_independent() -> None:
    vote, members = majority_and_members((0.7, 0.7, 0.7), 0.0)
    assert vote >= max(members) + 0.04, (vote, members)
    vote, members = majority_and_members((0.8, 0.6, 0.6), 0.9)
    assert vote < max(members), (vote, members)


def own_samples_agree(consistency: float) -> tuple[float, float]:
    """Three samples of one member of accuracy 0.7 on each of 2000 items: its accuracy, and how
    often a majority of its own samples is right."""
    items = choice_items(2000)
    oracle = Oracle(items, {"a": 0.7}, correlation=0.1, consistency=consistency, seed=4)
    right = majority = 0
    for item in items:
        values = [drawn(oracle, "a", item, CHOICE) for _ in range(3)]
        right += values[0] == item.correct
        majority += values.count(item.correct) >= 2
    return right / len(items), majority / len(items)


def test_a_members_own_samples_agree_more_with_consistency_and_keep_its_accuracy() -> None:
    loose, habitual = own_samples_agree(0.0), own_samples_agree(0.7)
    assert abs(loose[0] - 0.7) <= 0.03 and abs(habitual[0] - 0.7) <= 0.03
    assert loose[1] >= 0.74, "fresh samples of one model, majority-voted, gain like a panel"
    assert habitual[1] <= loose[1] - 0.03, (loose, habitual)
    with pytest.raises(ValueError, match="consistency"):
        Oracle(choice_items(1), {}, correlation=0.5, consistency=0.6)


def test_each_call_is_a_fresh_draw_counted_per_model_and_item_and_reset_starts_again() -> None:
    (item,) = number_items(1)
    oracle = Oracle([item], {"sim-gpt": 0.5}, seed=4)
    first = [drawn(oracle, "sim-gpt", item) for _ in range(200)]
    assert item.correct in first and set(first) - {item.correct}, "right and wrong both come up"
    assert oracle.draws("sim-gpt", item.question) == 200 and oracle.draws("sim-claude", item.question) == 0
    assert first == [oracle.outcome("sim-gpt", item.question, n)[0] for n in range(200)]
    oracle.reset()
    assert [drawn(oracle, "sim-gpt", item) for _ in range(200)] == first


def test_the_same_seed_gives_the_same_answers_and_another_seed_others() -> None:
    items = number_items(300)
    accuracy = dict.fromkeys(MODELS, 0.6)

    def run(seed: int) -> list[Any]:
        oracle = Oracle(items, accuracy, correlation=0.4, seed=seed)
        return [
            oracle.answer(model, asked(item), NUMBER) for item in items for model in MODELS for _ in range(2)
        ]

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_a_question_the_oracle_does_not_know_gets_no_answer_and_counts_nothing() -> None:
    (item,) = number_items(1)
    oracle = Oracle([item], {"sim-gpt": 1.0})
    assert oracle.answer("sim-gpt", "What is the capital of France?", NUMBER) is None
    assert oracle.answer("sim-gpt", asked(item), CHOICE) is None, "a schema without its field"
    assert oracle.draws("sim-gpt", item.question) == 0


def test_the_longest_question_found_in_the_text_wins() -> None:
    short = OracleItem("What is 2+2", "value", 4, (5,))
    long = OracleItem("What is 2+2+2", "value", 6, (7,))
    oracle = Oracle([short, long], {"m": 1.0})
    assert oracle.find("Q: What is 2+2+2? Answer in JSON.") == long
    assert oracle.find("Q: What is 2+2? Answer in JSON.") == short
    assert oracle.expected("What is 2+2+2") == 6


@pytest.mark.parametrize(
    ("schema", "item"),
    [
        (NUMBER, OracleItem("How tall is the lighthouse, in metres?", "value", 47, (45, 52.5, 74))),
        (CHOICE, OracleItem("Which queue fits best?", "choice", "C", ("A", "B", "D"))),
        (
            EXACT,
            OracleItem("What is the capital of Australia?", "answer", "Canberra", ("Sydney", "Melbourne")),
        ),
    ],
    ids=["number", "choice", "exact"],
)
def test_every_answer_is_valid_against_its_schema_and_carries_a_right_or_wrong_value(
    schema: dict[str, Any], item: OracleItem
) -> None:
    oracle = Oracle([item], dict.fromkeys(MODELS, 0.5), correlation=0.3, seed=8)
    seen = set()
    for model in MODELS:
        for _ in range(40):
            out = oracle.answer(model, asked(item), schema)
            assert out is not None
            jsonschema.validate(out, schema)
            assert set(out) == set(schema["properties"])
            assert out[item.field] == item.correct or out[item.field] in item.wrong
            assert out["reason"].startswith(f"[simulated {model}]")
            seen.add(out[item.field])
    assert item.correct in seen and len(seen) > 1


def test_wrong_values_the_schema_does_not_admit_are_never_drawn() -> None:
    item = OracleItem("Which queue fits best?", "choice", "A", ("B", "Z"))
    oracle = Oracle([item], {"m": 0.0})
    assert {oracle.answer("m", item.question, CHOICE)["choice"] for _ in range(50)} == {"B"}  # type: ignore[index]


@pytest.mark.parametrize(
    ("items", "kwargs", "message"),
    [
        ([OracleItem("q", "value", 1, ())], {}, "at least one wrong value"),
        ([OracleItem("q", "value", 1, (2, 1))], {}, "among the wrong ones"),
        ([OracleItem("q", "value", 1, (2,)), OracleItem("q", "value", 1, (3,))], {}, "given twice"),
        ([], {"correlation": 1.5}, "correlation"),
        ([], {"accuracy": {"m": 1.2}}, "accuracy"),
    ],
)
def test_the_oracle_refuses_what_cannot_be_drawn(
    items: list[OracleItem], kwargs: dict[str, Any], message: str
) -> None:
    accuracy = kwargs.pop("accuracy", {})
    with pytest.raises(ValueError, match=message):
        Oracle(items, accuracy, **kwargs)


# ------------------------------------------------------------------------- over HTTP

QUESTION = "How many moons does Mars have?"
MOONS = OracleItem(QUESTION, "value", 2, (1, 0, 3))


@pytest.mark.anyio
@pytest.mark.parametrize("accuracy", [1.0, 0.0, 0.6])
async def test_confer_on_the_simulated_panel_answers_with_the_oracles_draws(
    accuracy: float, tmp_path: Path
) -> None:
    oracle = Oracle([MOONS], dict.fromkeys(MODELS, accuracy), correlation=0.5, seed=3)
    base = load_config(None, env={"CONCLAVE_TELEMETRY_PATH": str(tmp_path / "e.ndjson")}, dotenv=None)
    async with conclave.SimulatedPanel(base) as sim, conclave.Conclave(sim.config) as c:
        sim.panel.set_oracle(oracle)
        results = [(await c.confer(QUESTION, answer_schema=NUMBER)).to_dict() for _ in range(3)]
        staged = await c.confer(QUESTION, answer_schema=NUMBER, review=True, synthesize=True)
    for out in [*results, staged.to_dict()]:
        values = [answer["value"]["value"] for answer in out["answers"]]
        assert len(values) == 3 and all(v == MOONS.correct or v in MOONS.wrong for v in values), values
        consensus = out["vote"]["consensus"]
        if accuracy == 1.0:
            assert values == [2, 2, 2] and consensus == {"value": 2}
        elif accuracy == 0.0:
            assert MOONS.correct not in values and consensus != {"value": 2}
    assert staged.synthesis is not None and staged.synthesis.envelope is not None
    chair = staged.synthesis.envelope["value"]  # the chair's value is drawn like a member's
    jsonschema.validate(chair, NUMBER)
    if accuracy == 1.0:
        assert chair["value"] == 2
    elif accuracy == 0.0:
        assert chair["value"] in MOONS.wrong
    assert [oracle.draws(m, QUESTION) for m in MODELS] == [4, 5, 4], "a member's 4 answers, the chair's 1"


def chat_body(model: str, text: str, schema: dict[str, Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": text}]}
    if schema is not None:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema, "strict": True},
        }
    return body


@pytest.mark.anyio
async def test_scripts_come_first_and_requests_without_a_schema_or_a_known_question_are_unchanged() -> None:
    oracle = Oracle([MOONS], {"m": 0.0}, seed=1)
    async with (
        SimPanel() as plain,
        SimPanel(oracle=oracle) as panel,
        httpx.AsyncClient(timeout=5.0, trust_env=False) as client,
    ):

        async def text(sim: SimPanel, model: str, prompt: str, schema: dict[str, Any] | None) -> str:
            url = sim.base_url("openai") + "/chat/completions"
            response = await client.post(url, json=chat_body(model, prompt, schema))
            assert response.status_code == 200
            return str(response.json()["choices"][0]["message"]["content"])

        for prompt, schema in ((QUESTION, None), ("Something else?", NUMBER)):
            assert await text(panel, "m", prompt, schema) == await text(plain, "m", prompt, schema)
        assert oracle.draws("m", QUESTION) == 0
        drawn_value = await text(panel, "m", QUESTION + INSTRUCTION, NUMBER)
        assert '"value":' in drawn_value and drawn_value != await text(plain, "m", QUESTION, NUMBER)
        panel.set_scenario("m", Scenario(replies=(Reply(value={"value": 2, "reason": "scripted"}),)))
        assert await text(panel, "m", QUESTION, NUMBER) == '{"value":2,"reason":"scripted"}'
        assert oracle.draws("m", QUESTION) == 1
        panel.reset()
        assert oracle.draws("m", QUESTION) == 0 and panel.oracle is oracle
        assert await text(panel, "m", QUESTION + INSTRUCTION, NUMBER) == drawn_value, "reset: draw 1 again"
        panel.set_oracle(None)
        assert await text(panel, "m", QUESTION, NUMBER) == await text(plain, "m", QUESTION, NUMBER)
