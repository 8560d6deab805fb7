"""`conclave demo` from a fresh directory with no API key: it runs confer and coordinate with worker
tools end to end against the simulated panel, says so, and leaves events `conclave tail` can show."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from conclave.app.demo import (
    VOTES,
    _revision_problems,
    conclave_command,
    demo_config,
    problems,
    run_demo,
    vote_problems,
)
from conclave.app.sim import SimPanel
from conclave.schema.config import load_config
from conclave.schema.schemas import first_error


def conclave(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "CONCLAVE_CONFIG"}
    return subprocess.run(
        [sys.executable, "-m", "conclave", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    workdir = tmp_path_factory.mktemp("fresh")
    return workdir, conclave("demo", "--latency-ms", "0", cwd=workdir)


def session_ids(stdout: str) -> tuple[str, str]:
    found = re.search(r"sessions: confer (\S+)  coordinate (\S+)", stdout)
    assert found, stdout
    return found[1], found[2]


def test_the_demo_exits_0_from_a_fresh_directory_and_says_it_is_simulated(
    demo: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    _, result = demo
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SIMULATED PANEL" in result.stdout and "simulated" in result.stdout
    assert "demo: ok" in result.stdout
    assert "export OPENAI_API_KEY=" in result.stdout and "conclave doctor" in result.stdout


def test_the_demo_shows_both_calls_with_their_tool_use(
    demo: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    _, result = demo
    out = result.stdout
    assert "tools used: hop 1 fetch ok" in out and "47 metres" in out
    assert "tools used: hop 1 verify ok" in out
    assert "sim-openai · sim-gpt · ok" in out and "2 hops · tools: native" in out
    assert "sim-gemini · sim-gemini · ok" in out and "2 hops · tools: tags" in out
    assert "═══ Review · 3 reviewers" in out and "1. sim-gemini  1.00" in out, "the blind review, by name"
    assert "The Exampleville lighthouse is 47 metres tall (its own page says so)" in out, "the chair"
    totals = [line for line in out.splitlines() if line.startswith("totals:")]
    assert len(totals) == 3 and "cached)" in totals[1], "the debate reads its task from a prompt cache"
    assert "═══ Synthesis" in out and "Use LRU eviction capped at 10,000 entries" in out
    assert "DEGRADED" not in out


def test_the_demos_vote_shows_each_choice_the_consensus_and_the_dissent(
    demo: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    _, result = demo
    out = result.stdout
    voted = out[out.index("3/3  confer --choices SQS,Kafka,RabbitMQ") : out.index("telemetry:")]
    assert re.search(r"confer · session demo-vote-\S+\ncomplete: every answer arrived", voted), voted[:600]
    for member, choice in (("sim-openai", "SQS"), ("sim-anthropic", "SQS"), ("sim-gemini", "Kafka")):
        block = voted[voted.index(f"━━ {member}") :]
        assert block.splitlines()[1] == f"  choice: {choice}", "each answer's fields, not its JSON text"
    assert "═══ Vote · consensus: choice = SQS" in voted
    assert "  choice  SQS · 2 of 3 · sim-gemini: Kafka" in voted, "the winner, its votes, the dissent"
    assert "not counted" not in voted and "totals: 3 answers, 3 ok" in voted
    events = out[out.index("telemetry:") : out.index("sessions:")]
    assert re.search(r"\bvote\s+demo-vote-\S+\s+-\s+consensus=True", events), "the vote event, its counts"
    assert re.search(r"sessions: confer \S+  coordinate \S+  vote demo-vote-\S+", out)


def vote_result(choices: dict[str, str], winner: str | None, dissent: list[str]) -> dict[str, Any]:
    """A confer's result as the vote step would return it, each member choosing as `choices` says."""
    of = len(choices)
    consensus = {"choice": winner} if winner is not None and of - len(dissent) > of / 2 else None
    return {
        "degraded": False,
        "answers": [{"provider": p, "value": {**VOTES[p], "choice": c}} for p, c in choices.items()],
        "vote": {
            "fields": [
                {
                    "field": "choice",
                    "winner": winner,
                    "votes": of - len(dissent),
                    "of": of,
                    "dissent": [{"provider": p, "value": choices[p]} for p in dissent],
                }
            ],
            "consensus": consensus,
            "reason": None if consensus else "a tie",
            "not_counted": [],
        },
    }


def test_a_vote_not_as_scripted_fails_the_demo() -> None:
    scripted = {"sim-openai": "SQS", "sim-anthropic": "SQS", "sim-gemini": "Kafka"}
    assert vote_problems(vote_result(scripted, "SQS", ["sim-gemini"])) == []
    unanimous = vote_problems(vote_result(dict.fromkeys(scripted, "SQS"), "SQS", []))
    assert unanimous == [
        "sim-gemini did not answer {'choice': 'Kafka', 'reason': 'Replayable history is worth having from "
        "the start.'}: {'choice': 'SQS', 'reason': 'Replayable history is worth having from the start.'}",
        "the vote on choice is not SQS 2 of 3: ('SQS', 3, 3)",
        "the vote does not name sim-gemini's dissent for Kafka: []",
    ]
    split = {**scripted, "sim-anthropic": "RabbitMQ"}
    tie = vote_problems(vote_result(split, None, list(split)))
    assert "the vote has no consensus on SQS: None (a tie)" in tie
    assert vote_problems({**vote_result(scripted, "SQS", ["sim-gemini"]), "vote": None}) == [
        "the vote's confer has no vote"
    ]
    degraded = {"degraded": True, "degraded_reasons": [{"provider": "sim-gemini"}]}
    assert vote_problems(degraded) == ["the vote's confer is degraded: [{'provider': 'sim-gemini'}]"]


def test_tail_afterwards_shows_that_runs_events(demo: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    workdir, result = demo
    confer_id, coordinate_id = session_ids(result.stdout)
    tail = conclave("tail", "--session", confer_id, "--lines", "all", cwd=workdir)
    assert tail.returncode == 0, tail.stderr
    names = [line.split()[1] for line in tail.stdout.splitlines()]
    assert names[0] == "session_start" and names[-1] == "session_end"
    assert {"provider_call", "worker_inner_call", "fetch"} <= set(names)
    raw = conclave("tail", "--session", coordinate_id, "--json", "--lines", "all", cwd=workdir)
    events = [json.loads(line) for line in raw.stdout.splitlines()]
    assert events and {e["session_id"] for e in events} == {coordinate_id}


def test_every_event_the_demo_wrote_matches_its_schema(
    demo: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    workdir, _ = demo
    lines = (workdir / ".conclave" / "events.ndjson").read_bytes().splitlines()
    assert lines
    for line in lines:
        event = orjson.loads(line)
        error = first_error(f"events/{event['event']}.json", event)
        assert error is None, f"{error.message}: {event}"
    assert list((workdir / ".conclave" / "transcripts").rglob("*.json")), "transcripts are written too"


@pytest.mark.anyio
async def test_the_demo_config_opens_fetch_to_the_page_only(tmp_path: Path) -> None:
    base = load_config(None, env={"CONCLAVE_TELEMETRY_PATH": str(tmp_path / "e.ndjson")}, dotenv=None)
    async with SimPanel() as panel:
        config = demo_config(base, panel, 43210)
    assert list(config.providers) == ["sim-openai", "sim-anthropic", "sim-gemini"]
    assert config.fetch.allow_private == ("127.0.0.1/32",)
    assert config.fetch.allow_ports == (80, 443, 43210)


@pytest.mark.anyio
async def test_the_demo_reports_a_failure_when_a_member_breaks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conclave.app import demo as demo_module
    from conclave.app.sim import Reply, Scenario

    def broken(_url: str) -> Scenario:
        return Scenario(replies=(Reply(status=400),))

    monkeypatch.setattr(demo_module, "fetcher_script", broken)
    env = {"CONCLAVE_TELEMETRY_PATH": str(tmp_path / "e.ndjson")}
    base = load_config(None, overrides=[f"transcripts.dir={tmp_path}/t"], env=env, dotenv=None)
    run = await run_demo(base, latency_ms=0, progress=None)
    found = problems(run)
    assert any("confer is degraded" in p for p in found)
    assert any("sim-openai did not use fetch" in p for p in found)


@pytest.mark.anyio
async def test_the_demo_reports_a_vote_that_did_not_come_out_as_scripted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conclave.app import demo as demo_module
    from conclave.app.sim import Reply, Rule

    def all_agree(member: str) -> Rule:
        return Rule(demo_module.VOTE_QUESTION, Reply(value={**VOTES[member], "choice": "SQS"}))

    monkeypatch.setattr(demo_module, "vote_rule", all_agree)
    env = {"CONCLAVE_TELEMETRY_PATH": str(tmp_path / "e.ndjson")}
    base = load_config(None, overrides=[f"transcripts.dir={tmp_path}/t"], env=env, dotenv=None)
    run = await run_demo(base, latency_ms=0, progress=None)
    assert run.vote["vote"]["consensus"] == {"choice": "SQS"}, "a consensus, but not the one scripted"
    found = problems(run)
    assert "the vote on choice is not SQS 2 of 3: ('SQS', 3, 3)" in found
    assert "the vote does not name sim-gemini's dissent for Kafka: []" in found


def test_the_demo_ends_with_the_conclave_ui_command_that_shows_its_two_sessions(
    demo: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    workdir, result = demo
    confer_id, coordinate_id = session_ids(result.stdout)
    last = result.stdout.rstrip().splitlines()[-4:]
    assert shlex.split(last[1])[-1] == "ui", last
    assert confer_id in last[2] and coordinate_id in last[2] and "http://127.0.0.1:8780/" in last[2]
    # Run as printed, from where the demo ran: the command word must work there as it stands.
    command = [*shlex.split(last[1]), "--http", "127.0.0.1:0"]
    env = {k: v for k, v in os.environ.items() if k != "CONCLAVE_CONFIG"}
    ui = subprocess.Popen(command, cwd=workdir, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert ui.stderr is not None
        address = re.search(r"http://127\.0\.0\.1:\d+/", ui.stderr.readline())
        assert address, "conclave ui did not say where it serves"
        page = httpx.get(address[0], timeout=10)
    finally:
        ui.terminate()
        ui.wait(timeout=10)
    assert page.status_code == 200
    assert f"session?id={confer_id}" in page.text and f"session?id={coordinate_id}" in page.text


def test_the_demos_coordinate_shows_a_revision_over_two_rounds(
    demo: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    _, result = demo
    debate = result.stdout[result.stdout.index("2/3  coordinate") : result.stdout.index("3/3  confer")]
    assert re.search(r"coordinate · session \S+ · 2 rounds · converged", debate), debate[:400]
    first = debate[debate.index("═══ Round 1") : debate.index("═══ Round 2")]
    second = debate[debate.index("═══ Round 2") : debate.index("═══ Synthesis")]
    assert "verdict: REVISE" in first
    assert "revision notes:" in second and "Took up sim-anthropic's major issue" in second
    assert "invalidated on writes" in second, "the revised proposal itself answers the critique"
    assert second.count("verdict: ACCEPT") == 2 and "REVISE" not in second
    assert "25,600,000 bytes" in second, "the second critic checks the revised budget with verify"


def test_a_debate_without_the_revision_is_reported() -> None:
    one_round = {"rounds": [{"critiques": [{"envelope": {"verdict": "revise"}}]}], "converged": False}
    assert _revision_problems(one_round) == ["coordinate ran 1 round(s), not 2"]
    unrevised = {
        "converged": True,
        "rounds": [
            {"critiques": [{"envelope": {"verdict": "accept"}}]},
            {"proposal": {"envelope": {"proposal": "p"}}, "critiques": [{"envelope": {"verdict": "accept"}}]},
        ],
    }
    assert _revision_problems(unrevised) == [
        "no critic asked for a revision in round 1: ['accept']",
        "round 2's proposal has no revision notes",
    ]


def test_every_command_the_demo_prints_runs_as_printed(
    demo: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    workdir, result = demo
    line = next(x for x in result.stdout.splitlines() if "see every event of one:" in x)
    tail = shlex.split(line.split("see every event of one:", 1)[1])
    env = {k: v for k, v in os.environ.items() if k != "CONCLAVE_CONFIG"}  # as the demo ran
    done = subprocess.run(tail, cwd=workdir, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and "session_start" in done.stdout, done.stderr
    word = shlex.join(tail[: tail.index("tail")])
    assert f"{word} doctor" in result.stdout and f'{word} confer "your question"' in result.stdout


# -- conclave_command: what to type to run this conclave again ------------------------------------


def script(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n", encoding="utf-8")
    return str(path)


def test_conclave_when_path_finds_the_one_running(tmp_path: Path) -> None:
    running = script(tmp_path / "bin" / "conclave")
    assert conclave_command(argv0=running, cwd=str(tmp_path), which=lambda _: running) == "conclave"


@pytest.mark.parametrize("on_path", [None, "other"])
def test_the_path_relative_to_here_when_path_finds_none_or_another(
    tmp_path: Path, on_path: str | None
) -> None:
    running = script(tmp_path / ".venv" / "bin" / "conclave")
    other = script(tmp_path / "elsewhere" / "conclave") if on_path else None
    command = conclave_command(argv0=running, cwd=str(tmp_path), which=lambda _: other)
    assert command == os.path.join(".venv", "bin", "conclave")


def test_an_absolute_path_from_outside_and_dot_slash_from_its_own_directory(tmp_path: Path) -> None:
    running = script(tmp_path / "venv" / "bin" / "conclave")
    elsewhere = tmp_path / "work"
    elsewhere.mkdir()
    assert conclave_command(argv0=running, cwd=str(elsewhere), which=lambda _: None) == running
    here = conclave_command(argv0=running, cwd=str(tmp_path / "venv" / "bin"), which=lambda _: None)
    assert here == os.path.join(".", "conclave"), "a bare name would be looked up on PATH"


def test_python_dash_m_names_the_script_beside_the_interpreter_or_the_interpreter(tmp_path: Path) -> None:
    main = str(tmp_path / "src" / "conclave" / "__main__.py")
    python = str(tmp_path / "venv" / "bin" / "python")
    none = conclave_command(argv0=main, executable=python, cwd=str(tmp_path), which=lambda _: None)
    assert shlex.split(none) == [os.path.join("venv", "bin", "python"), "-m", "conclave"]
    beside = script(tmp_path / "venv" / "bin" / "conclave")
    assert (
        conclave_command(argv0=main, executable=python, cwd=str(tmp_path), which=lambda _: beside)
        == "conclave"
    )
