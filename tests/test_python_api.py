"""The Python API: `conclave.Conclave` and the one-shot `conclave.confer` / `conclave.coordinate`
return typed results whose `to_dict()` is exactly what the server's tools return."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import conclave
from conclave.app.sim import SimPanel
from conclave.core.errors import ConclaveError, InvalidArguments
from conclave.deliberation.results import Answer, RoleAnswer
from conclave.schema.config import Config, load_config
from conclave.schema.schemas import first_error, load_schema
from tests.support import read_events


@pytest.mark.anyio
async def test_confer_from_python_returns_a_typed_result_whose_dict_is_the_wire_result(
    make_config: Callable[..., Config],
) -> None:
    async with SimPanel() as panel:
        config = make_config({"a": {"kind": "openai", "model": "m", "base_url": panel.base_url("openai")}})
        result = await conclave.confer("Which?", config=config, session_id="py-1")
    assert isinstance(result, conclave.ConferResult)
    assert first_error("confer.output.json", result.to_dict()) is None
    assert result.session_id == "py-1" and result.degraded is False
    (answer,) = result.answers
    assert isinstance(answer, Answer) and answer.status == "ok" and answer.text
    assert result.to_dict()["answers"][0]["text"] == answer.text
    assert result.usage.total_tokens == answer.usage.total_tokens > 0


@pytest.mark.anyio
async def test_one_client_opens_its_runtime_once_for_many_calls(
    make_config: Callable[..., Config], tmp_path: Path
) -> None:
    events = tmp_path / "events.ndjson"
    async with SimPanel() as panel:
        config = make_config(
            {"a": {"kind": "openai", "model": "m", "base_url": panel.base_url("openai")}},
            roles={"proposer": "a", "critics": ["a"], "synthesizer": "a"},
            telemetry={"path": str(events)},
        )
        async with conclave.Conclave(config) as client:
            first = await client.confer("One?", session_id="py-a")
            second = await client.confer("Two?", session_id="py-b")
            debate = await client.coordinate("Pick a queue.", session_id="py-c")
    assert [first.answers[0].status, second.answers[0].status] == ["ok", "ok"]
    assert isinstance(debate, conclave.CoordinateResult)
    assert first_error("coordinate.output.json", debate.to_dict()) is None
    assert isinstance(debate.proposal, RoleAnswer) and debate.proposal.role == "proposer"
    assert [r.proposal.provider for r in debate.rounds] == ["a"]
    started = [e["session_id"] for e in read_events(events) if e["event"] == "session_start"]
    assert started == ["py-a", "py-b", "py-c"]


@pytest.mark.anyio
async def test_a_clients_calls_share_one_runtime_so_a_breaker_opened_by_one_is_open_for_the_next(
    make_config: Callable[..., Config],
) -> None:
    config = make_config(
        {"dead": {"kind": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1"}},
        retry={"max_attempts": 1},
        breakers={"failure_threshold": 1, "cooldown_seconds": 600},
    )
    async with conclave.Conclave(config) as client:
        first = await client.confer("One?", providers=["dead"])
        second = await client.confer("Two?", providers=["dead"])
    assert [first.answers[0].status, second.answers[0].status] == ["error", "breaker_open"]
    alone = await conclave.confer("Three?", config=config, providers=["dead"])
    assert alone.answers[0].status == "error"  # a one-shot call opens a runtime of its own


@pytest.mark.anyio
async def test_a_client_used_outside_its_block_says_how_to_open_it(
    make_config: Callable[..., Config],
) -> None:
    client = conclave.Conclave(
        make_config({"a": {"kind": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1"}})
    )
    with pytest.raises(ConclaveError, match="async with"):
        await client.confer("Which?")


@pytest.mark.anyio
async def test_bad_arguments_are_refused_at_the_python_door_with_the_failing_path(
    make_config: Callable[..., Config],
) -> None:
    config = make_config({"a": {"kind": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1"}})
    async with conclave.Conclave(config) as client:
        with pytest.raises(InvalidArguments) as info:
            await client.coordinate("Pick.", rounds=9)
    assert info.value.path == "$.rounds"


@pytest.mark.parametrize("tool", ["confer", "coordinate", "fetch", "verify"])
def test_the_python_keywords_are_exactly_the_tools_arguments(tool: str) -> None:
    """The schema is the source of truth: a new argument there must be a keyword here."""
    method = getattr(conclave.Conclave, tool)
    keywords = set(inspect.signature(method).parameters) - {"self", "progress", "deltas"}
    assert keywords == set(load_schema(f"{tool}.input.json")["properties"])


def test_the_sync_wrapper_runs_outside_an_event_loop(make_config: Callable[..., Config]) -> None:
    config = make_config(
        {"a": {"kind": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1"}},
        retry={"max_attempts": 1},
    )
    result = conclave.confer_sync("Which?", config=config, dry_run=True)
    assert result.dry_run is True
    assert result.to_dict()["dry_run"] is True
    assert result.plan is not None and result.plan["max_calls"] == 1


def test_a_process_that_only_sees_valid_calls_never_loads_what_only_failures_need(tmp_path: Path) -> None:
    """Each of these is resident in every process that imports it: jsonschema (only to explain a
    rejected argument), the fetch and verify tools (only when
    called), tenacity (only to retry a failed attempt). A valid confer, a bad argument and a verify call
    after it, run in a fresh interpreter against the simulated panel."""
    probe = f"""
import asyncio, sys
from conclave.schema.config import load_config
from conclave.core.errors import InvalidArguments
from conclave.app.api import Conclave
from conclave.app.sim import SimPanel
LAZY = ["jsonschema", "tenacity", "conclave.tools.fetch", "conclave.tools.verify"]

async def main():
    async with SimPanel() as panel:
        path = {str(tmp_path / "config.yaml")!r}
        open(path, "w").write(
            "providers:\\n  a: {{kind: openai, model: m, base_url: " + panel.base_url("openai") + ", api_key_env: null}}\\n"
            "panel: [a]\\ntelemetry: {{path: {str(tmp_path / "events.ndjson")!r}}}\\n"
            "transcripts: {{dir: {str(tmp_path / "transcripts")!r}}}\\n"
        )
        async with Conclave(load_config(path, env={{}}, dotenv=None)) as client:
            result = await client.confer("q?")
            print(result.answers[0].status, [m for m in LAZY if m in sys.modules])
            try:
                await client.confer("q?", max_tokens="many")
            except InvalidArguments as exc:
                print(exc.path, "jsonschema" in sys.modules)
            checked = await client.verify([{{"type": "math", "expression": "1+1", "expected": 2}}])
            print(checked["passed"], [m for m in LAZY if m in sys.modules])

asyncio.run(main())
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)

    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "ok []",
        "$.max_tokens True",
        "True ['jsonschema', 'conclave.tools.verify']",
    ]


README = Path(__file__).resolve().parent.parent / "README.md"


def readme_python_example() -> str:
    """The code block of README.md's "The Python API" section, exactly as a reader copies it."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## The Python API") :]
    section = section[: section.index("\n## ", 1)]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found, "README's Python API section has no python code block"
    return found[1]


def test_the_readme_python_example_runs_as_written_offline(tmp_path: Path) -> None:
    code = readme_python_example()
    assert "https://" not in code, "a first example must not need the network"
    (tmp_path / "example.py").write_text(code, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "CONCLAVE_CONFIG"}
    done = subprocess.run(
        [sys.executable, "example.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert [line.split()[:2] for line in lines[:3]] == [
        ["sim-openai", "ok"],
        ["sim-anthropic", "ok"],
        ["sim-gemini", "ok"],
    ]
    assert lines[3].endswith(" False"), "the confer with review and synthesis is not degraded"
    assert lines[4].startswith("[simulated sim-claude]"), "the debate's synthesis, not degraded reasons"
    assert lines[6].startswith("200 ") and "47 metres tall" in lines[6], "the local page was fetched"
    assert lines[5:] == ["False", lines[6], "True", "False"]


@pytest.mark.anyio
async def test_a_simulated_panel_gives_a_config_whose_roles_answer_and_whose_page_fetches(
    tmp_path: Path,
) -> None:
    base = load_config(None, env={"CONCLAVE_TELEMETRY_PATH": str(tmp_path / "e.ndjson")}, dotenv=None)
    async with conclave.SimulatedPanel(base) as sim, conclave.Conclave(sim.config) as c:
        assert sim.config.fetch.allow_private == ("127.0.0.1/32",)
        conferred = await c.confer("Which option?", review=True, synthesize=True)
        debate = await c.coordinate("Pick a queue.", rounds=2)
        page = await c.fetch(sim.page_url)
    assert conferred.degraded is False and conferred.synthesis and conferred.synthesis.envelope
    assert debate.degraded is False and len(debate.rounds) == 2 and debate.converged
    assert debate.rounds[1].proposal.envelope and debate.rounds[1].proposal.envelope["revision_notes"]
    assert page["status"] == 200 and "47 metres" in page["text"]
    with pytest.raises(RuntimeError, match="not running"):
        _ = sim.config
