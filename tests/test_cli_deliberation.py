"""`conclave confer`, `coordinate` and `serve` as a user runs them: a subprocess against the simulated
panel (itself a subprocess, `python -m conclave.app.sim --port 0`), scripted through its HTTP control API."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from conclave.app.cli import parse_bind
from conclave.app.render import LiveProgress, render_confer
from conclave.core.messages import Delta
from conclave.deliberation import review
from conclave.net.webguard import is_loopback
from conclave.schema.schemas import first_error

PRICE = {"input_per_mtok": 1.0, "output_per_mtok": 2.0}
PROPOSAL = {"proposal": "Use a write-through cache.", "rationale": "Reads dominate.", "confidence": 0.7}
CRITIQUE = {"verdict": "revise", "issues": [{"severity": "major", "description": "No eviction policy."}]}
SYNTHESIS = {
    "answer": "Use a write-through cache with LRU eviction.",
    "confidence": 0.8,
    "resolved": ["eviction: LRU"],
    "dissent": [],
}


def conclave(
    *args: str, cwd: Path, timeout: float = 60, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "CONCLAVE_CONFIG"}
    return subprocess.run(
        [sys.executable, "-m", "conclave", *args],
        cwd=cwd,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


class Panel:
    """The simulated panel subprocess, scripted over its control API."""

    def __init__(self, urls: dict[str, str]) -> None:
        self.urls = urls
        self.root = urls["openai"].removesuffix("/openai/v1")

    def script(self, model: str, scenario: dict[str, Any]) -> None:
        response = httpx.put(f"{self.root}/_sim/scenarios/{model}", json=scenario)
        assert response.status_code == 200, response.text

    def calls(self) -> dict[str, int]:
        calls: dict[str, int] = httpx.get(f"{self.root}/_sim/calls").json()
        return calls


@pytest.fixture(scope="module")
def sim_urls() -> Iterator[dict[str, str]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "conclave.app.sim", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    try:
        urls = dict(process.stdout.readline().split() for _ in range(3))
        yield urls
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture
def panel(sim_urls: dict[str, str]) -> Panel:
    sim = Panel(sim_urls)
    httpx.post(f"{sim.root}/_sim/reset").raise_for_status()
    return sim


@pytest.fixture
def workdir(tmp_path: Path, panel: Panel) -> Path:
    """A directory whose config.yaml points three members (one per wire kind) at the panel."""
    providers = {
        "alpha": {"kind": "openai", "model": "m-alpha", "base_url": panel.urls["openai"], "price": PRICE},
        "beta": {"kind": "anthropic", "model": "m-beta", "base_url": panel.urls["anthropic"], "price": PRICE},
        "gamma": {"kind": "gemini", "model": "m-gamma", "base_url": panel.urls["gemini"], "price": PRICE},
    }
    config = {
        "providers": providers,
        "panel": ["alpha", "beta", "gamma"],
        "roles": {"proposer": "alpha", "critics": ["beta", "gamma"], "synthesizer": "beta"},
        "limits": {"timeout_seconds": 30, "retry": {"max_attempts": 1}},
        "telemetry": {"path": "events.ndjson"},
        "transcripts": {"dir": "transcripts"},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    return tmp_path


def script_debate(panel: Panel) -> None:
    panel.script("m-alpha", {"replies": [{"text": json.dumps(PROPOSAL)}]})
    panel.script(
        "m-beta",
        {
            "rules": [
                {"contains": "Write the final answer to the task", "reply": {"text": json.dumps(SYNTHESIS)}},
                {"contains": "Review this proposal", "reply": {"text": json.dumps(CRITIQUE)}},
            ]
        },
    )
    panel.script("m-gamma", {"replies": [{"text": json.dumps({"verdict": "accept", "issues": []})}]})


# ---------------------------------------------------------------- confer


def test_confer_json_against_the_simulated_panel_is_valid_and_exits_0(workdir: Path) -> None:
    result = conclave("confer", "Which queue should we use?", "--json", cwd=workdir)
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout)
    assert first_error("confer.output.json", output) is None
    assert [a["provider"] for a in output["answers"]] == ["alpha", "beta", "gamma"]
    assert all(a["status"] == "ok" for a in output["answers"])
    assert output["degraded"] is False
    assert result.stderr == "", "no progress or chatter when stderr is not a terminal"


def test_confer_readable_output_shows_every_provider_its_text_and_the_totals(workdir: Path) -> None:
    result = conclave("confer", "Which queue should we use?", cwd=workdir)
    assert result.returncode == 0, result.stderr
    for name, model in (("alpha", "m-alpha"), ("beta", "m-beta"), ("gamma", "m-gamma")):
        assert f"━━ {name} · {model} · ok" in result.stdout
        assert f"[simulated {model}]" in result.stdout
    assert "totals: 3 answers, 3 ok" in result.stdout
    assert "\x1b[" not in result.stdout, "no colour when stdout is not a terminal"


def test_confer_with_choices_shows_each_members_choice_the_vote_and_the_consensus(
    workdir: Path, panel: Panel
) -> None:
    panel.script("m-alpha", {"replies": [{"text": json.dumps({"choice": "SQS", "reason": "managed"})}]})
    panel.script("m-beta", {"replies": [{"text": json.dumps({"choice": "sqs", "reason": "cheap"})}]})
    panel.script("m-gamma", {"replies": [{"text": json.dumps({"choice": "Kafka", "reason": "replay"})}]})
    result = conclave("confer", "Which queue?", "--choices", "SQS, Kafka ,RabbitMQ", cwd=workdir)
    # beta's "sqs" is not one of the choices: asked again, it says the same, and is not counted
    assert result.returncode == 1, result.stdout + result.stderr
    assert "  choice: SQS" in result.stdout and "  choice: Kafka" in result.stdout
    assert "═══ Vote · no consensus: no strict majority on 'choice': 1 of 2 (a tie)" in result.stdout
    assert "not counted (no valid answer): beta" in result.stdout

    as_json = conclave("confer", "Which queue?", "--choices", "SQS,Kafka", "--json", cwd=workdir)
    output = json.loads(as_json.stdout)
    assert first_error("confer.output.json", output) is None
    schema = output["answers"][0]["value"]
    assert schema == {"choice": "SQS", "reason": "managed"}
    assert [a["status"] for a in output["answers"]] == ["ok", "invalid_answer", "ok"]


def test_confer_quorum_shows_a_late_member_and_on_partial_error_exits_1(workdir: Path, panel: Panel) -> None:
    panel.script("m-gamma", {"latency_ms": 5000})
    result = conclave("confer", "Which queue?", "--quorum", "2", "--grace", "0.2", cwd=workdir)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "━━ gamma · m-gamma · late" in result.stdout
    assert "gamma: late (stopped at" in result.stdout

    panel.script("m-gamma", {"replies": [{"status": 500}]})
    failed = conclave("confer", "Which queue?", "--on-partial", "error", cwd=workdir)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "conclave confer: partial result: 2 of 3 members answered" in failed.stderr
    assert failed.stdout == ""

    too_many = conclave("confer", "Which queue?", "--quorum", "4", cwd=workdir)
    assert too_many.returncode == 2 and "$.quorum" in too_many.stderr


def test_a_choices_option_with_one_choice_is_refused_before_any_call(workdir: Path, panel: Panel) -> None:
    result = conclave("confer", "Which queue?", "--choices", "SQS", cwd=workdir)
    assert result.returncode == 2
    assert "--choices: give at least 2 choices, not 1" in result.stderr


def test_a_degraded_confer_exits_1_and_names_the_failing_provider(workdir: Path, panel: Panel) -> None:
    panel.script("m-gamma", {"replies": [{"status": 500, "error_message": "the simulated server broke"}]})
    result = conclave("confer", "Which queue should we use?", cwd=workdir)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[1].startswith("DEGRADED")
    assert "✗ gamma: error, server_error" in lines[2]
    assert "the simulated server broke" in result.stdout
    assert "result: DEGRADED (gamma: error, server_error)" in result.stdout


def test_a_degraded_confer_json_says_degraded_and_exits_1(workdir: Path, panel: Panel) -> None:
    panel.script("m-beta", {"replies": [{"status": 500}]})
    result = conclave("confer", "q", "--json", cwd=workdir)
    assert result.returncode == 1
    output = json.loads(result.stdout)
    assert first_error("confer.output.json", output) is None
    assert output["degraded_reasons"] == [
        {"provider": "beta", "role": None, "status": "error", "code": "server_error"}
    ]


@pytest.mark.parametrize(
    ("flags", "path"),
    [
        (["--timeout", "-5"], "$.timeout_seconds"),
        (["--providers", ","], "$.providers"),
        (["--max-tokens", "0"], "$.max_tokens"),
        (["--session", "bad id!"], "$.session_id"),
    ],
)
def test_confer_with_invalid_arguments_exits_2_naming_the_path(
    workdir: Path, panel: Panel, flags: list[str], path: str
) -> None:
    result = conclave("confer", "q", *flags, cwd=workdir)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"conclave confer: invalid arguments at {path}:")
    assert result.stdout == ""
    assert panel.calls() == {}, "nothing is called when the arguments are invalid"


def test_confer_passes_every_option_through(workdir: Path, panel: Panel) -> None:
    panel.script("m-alpha", {"replies": [{"text": "ok"}]})
    result = conclave(
        "confer",
        "q",
        "--providers",
        "alpha",
        "--context",
        "CTX-MARK",
        "--system",
        "SYS-MARK",
        "--worker-tools",
        "verify,bogus",
        "--cost-cap",
        "0.5",
        "--cost-cap-mode",
        "enforce",
        "--worker-tool-mode",
        "native",
        "--timeout",
        "20",
        "--max-tokens",
        "77",
        "--session",
        "cli-session-1",
        "--json",
        cwd=workdir,
    )
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout)
    assert output["session_id"] == "cli-session-1"
    assert [a["provider"] for a in output["answers"]] == ["alpha"]
    assert output["worker_tools"]["accepted"] == ["verify"]
    assert output["worker_tools"]["rejected"] == ["bogus"]
    assert output["worker_tools"]["cost_cap"]["mode"] == "enforce"
    assert output["answers"][0]["tool_mode"] == "native"
    body = httpx.get(f"{panel.root}/_sim/requests").json()[-1]["body"]
    assert body["tools"], "the tools are declared natively"
    assert body["max_tokens"] == 77 or body.get("max_completion_tokens") == 77
    sent = json.dumps(body)
    assert "CTX-MARK" in sent and "SYS-MARK" in sent


MATH_CHECK = {"checks": [{"type": "math", "expression": "6*7", "expected": 42}]}


@pytest.mark.parametrize(
    ("mode", "reply"),
    [
        ("native", {"tool_calls": [{"name": "verify", "arguments": MATH_CHECK}]}),
        ("tags", {"text": f"<tool_call>{json.dumps({'name': 'verify', 'args': MATH_CHECK})}</tool_call>"}),
    ],
)
def test_confer_readable_output_shows_tool_use_and_the_worker_tools_block(
    workdir: Path, panel: Panel, mode: str, reply: dict[str, Any]
) -> None:
    panel.script(
        "m-alpha",
        {"replies": [reply], "rules": [{"contains": "<tool_result", "reply": {"text": "It is 42."}}]},
    )
    flags = ["--worker-tools", "verify,bogus"] + (["--worker-tool-mode", "tags"] if mode == "tags" else [])
    result = conclave("confer", "q", "--providers", "alpha", *flags, cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert "It is 42." in result.stdout
    assert f"2 hops · tools: {mode}" in result.stdout
    assert "tools used: hop 1 verify ok" in result.stdout
    assert "worker tools: accepted verify · rejected bogus · hop budget 2" in result.stdout


def test_confer_dry_run_prints_the_plan_and_calls_nothing(workdir: Path, panel: Panel) -> None:
    result = conclave("confer", "q", "--dry-run", cwd=workdir)
    assert result.returncode == 0, result.stderr
    assert "DRY RUN" in result.stdout
    assert "alpha (m-alpha)" in result.stdout and "at most 3 model calls" in result.stdout
    assert panel.calls() == {}


def test_a_config_error_exits_2_with_one_line(workdir: Path) -> None:
    (workdir / "config.yaml").write_text("panel: [nobody]\n", encoding="utf-8")
    result = conclave("confer", "q", cwd=workdir)
    assert result.returncode == 2
    assert result.stderr.startswith("conclave: config:") and result.stderr.count("\n") == 1


# ---------------------------------------------------------------- coordinate


def test_coordinate_json_is_valid_against_the_schema(workdir: Path, panel: Panel) -> None:
    script_debate(panel)
    result = conclave("coordinate", "Design the cache layer.", "--json", cwd=workdir)
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout)
    assert first_error("coordinate.output.json", output) is None
    assert output["synthesis"]["envelope"] == SYNTHESIS
    assert [c["provider"] for c in output["critiques"]] == ["beta", "gamma"]


def test_coordinate_readable_output_shows_the_debate_and_the_synthesis_answer(
    workdir: Path, panel: Panel
) -> None:
    script_debate(panel)
    result = conclave("coordinate", "Design the cache layer.", cwd=workdir)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "═══ Round 1" in out and "Proposal by alpha" in out and "Use a write-through cache." in out
    assert "Critique by beta" in out and "verdict: REVISE" in out and "[major] No eviction policy." in out
    assert "Critique by gamma" in out and "verdict: ACCEPT" in out
    assert "Synthesized by beta" in out and str(SYNTHESIS["answer"]) in out
    assert "eviction: LRU" in out and "confidence: 0.80" in out
    assert "per role:" in out and "synthesizer: 1 call" in out


def test_coordinate_with_choices_shows_the_value_the_synthesizer_decided(workdir: Path, panel: Panel) -> None:
    script_debate(panel)
    decided = {**SYNTHESIS, "value": {"choice": "Kafka", "reason": "replay"}}
    panel.script(
        "m-beta",
        {
            "rules": [
                {"contains": "Write the final answer to the task", "reply": {"text": json.dumps(decided)}},
                {"contains": "Review this proposal", "reply": {"text": json.dumps(CRITIQUE)}},
            ]
        },
    )
    result = conclave("coordinate", "Which queue?", "--choices", "SQS,Kafka", cwd=workdir)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "  decided:\n    choice: Kafka\n    reason: replay" in result.stdout

    as_json = conclave("coordinate", "Which queue?", "--choices", "SQS,Kafka", "--json", cwd=workdir)
    output = json.loads(as_json.stdout)
    assert first_error("coordinate.output.json", output) is None
    assert output["synthesis"]["value"] == {"choice": "Kafka", "reason": "replay"}


def test_coordinate_names_the_synthesizer_that_stood_in(workdir: Path, panel: Panel) -> None:
    script_debate(panel)
    result = conclave("coordinate", "t", "--synthesizer", "gamma", cwd=workdir)
    # gamma answers every call with a critique: not a synthesis, so a fallback synthesizes
    assert "stood in for gamma (synthesizer): invalid_envelope" in result.stdout, result.stdout


def test_coordinate_that_loses_its_proposer_exits_3_as_nobody_answered(workdir: Path, panel: Panel) -> None:
    script_debate(panel)
    panel.script("m-alpha", {"replies": [{"status": 500}]})
    result = conclave("coordinate", "t", cwd=workdir)
    assert result.returncode == 3
    assert "FAILED: no model answered" in result.stdout
    assert "alpha (proposer): error, server_error" in result.stdout


def test_coordinate_that_loses_one_critic_is_degraded_not_failed(workdir: Path, panel: Panel) -> None:
    script_debate(panel)
    panel.script("m-gamma", {"replies": [{"status": 500}]})
    result = conclave("coordinate", "t", cwd=workdir)
    assert result.returncode == 1, result.stdout
    assert "DEGRADED" in result.stdout and "FAILED" not in result.stdout


def test_a_confer_nobody_answers_exits_3_and_says_so(workdir: Path, panel: Panel) -> None:
    for model in ("m-alpha", "m-beta", "m-gamma"):
        panel.script(model, {"replies": [{"status": 500}]})
    result = conclave("confer", "q", cwd=workdir)
    assert result.returncode == 3, result.stdout
    assert result.stdout.splitlines()[1].startswith("FAILED: no model answered (3 missing)")


def test_the_question_and_the_context_can_come_from_stdin_and_files(workdir: Path, panel: Panel) -> None:
    question = "Which queue? " + "x" * 300_000  # longer than a shell allows one argument (128 KiB)
    (workdir / "context.txt").write_text("The team has three people.", encoding="utf-8")
    result = conclave(
        *("confer", "-", "--context-file", "context.txt", "--providers", "alpha", "--json"),
        cwd=workdir,
        stdin=question[:199_000],
    )
    assert result.returncode == 0, result.stderr
    sent = json.dumps(httpx.get(f"{panel.root}/_sim/requests").json()[-1]["body"])
    assert "Which queue? xxx" in sent and "The team has three people." in sent
    both = conclave("coordinate", "-", "--context-file", "-", cwd=workdir, stdin="t")
    assert both.returncode == 2 and "cannot both read standard input" in both.stderr
    missing = conclave("confer", "q", "--context-file", "nope.txt", cwd=workdir)
    assert missing.returncode == 2 and "cannot read the context from 'nope.txt'" in missing.stderr


@pytest.mark.parametrize("blank", ["   ", "\n\t "])
def test_a_blank_question_is_refused_before_any_call(workdir: Path, panel: Panel, blank: str) -> None:
    result = conclave("confer", blank, cwd=workdir)
    assert result.returncode == 2
    assert "invalid arguments at $.question: is blank" in result.stderr
    task = conclave("coordinate", blank, cwd=workdir)
    assert task.returncode == 2 and "$.task: is blank" in task.stderr
    assert panel.calls() == {}, "nothing was sent"


@pytest.mark.parametrize(
    "args",
    [["confer", "q", "--providers", "alpha,ghost"], ["coordinate", "t", "--critics", "beta,ghost"]],
    ids=["confer", "coordinate"],
)
def test_an_unknown_provider_name_is_a_bad_argument(workdir: Path, panel: Panel, args: list[str]) -> None:
    result = conclave(*args, cwd=workdir)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "unknown provider 'ghost'" in result.stderr and "alpha, beta, gamma" in result.stderr
    assert panel.calls() == {}


def test_output_cut_short_by_the_reader_is_no_error(workdir: Path, panel: Panel) -> None:
    """`conclave confer ... | head -c 10`: the reader leaves early; no 'Broken pipe' message."""
    panel.script("m-alpha", {"replies": [{"text": "long " * 100_000}]})  # more than a pipe holds
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "CONCLAVE_CONFIG"}
    command = f"{sys.executable} -m conclave confer 'Which queue?' --providers alpha | head -c 6"
    result = subprocess.run(
        ["bash", "-o", "pipefail", "-c", command],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.stdout == "confer"
    assert "Broken pipe" not in result.stderr and "Traceback" not in result.stderr
    assert result.returncode == 141


def test_coordinate_with_invalid_rounds_exits_2_naming_the_path(workdir: Path) -> None:
    result = conclave("coordinate", "t", "--rounds", "9", cwd=workdir)
    assert result.returncode == 2
    assert "invalid arguments at $.rounds" in result.stderr


# ---------------------------------------------------------------- progress and serve


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_live_progress_redraws_each_provider_in_place() -> None:
    now = [100.0]
    stream = FakeTerminal()
    progress = LiveProgress.for_confer(["alpha", "beta"], stream)
    progress.clock = lambda: now[0]
    progress.start()
    progress.draw()
    now[0] = 101.5
    progress.record({"provider": "beta", "status": "error"})
    progress.draw()
    first, second = stream.getvalue().split("\x1b[F\x1b[K\x1b[F\x1b[K")
    assert "alpha" in first and "running" in first
    assert "✗ beta   error      1.5s" in second
    assert "… alpha  running    1.5s" in second


def test_a_streaming_answer_grows_in_its_row_and_a_chair_gets_a_row_as_it_starts() -> None:
    progress = LiveProgress.for_confer(["alpha", "beta"], FakeTerminal())
    progress.start()
    for word in ("The queue ", "should be ", "managed, because\nops is small."):
        progress.heard("alpha", None, Delta("text", word))
    progress.heard("alpha", None, Delta("thinking", "x" * 40))  # counted, not shown
    alpha = progress.lines()[0]
    assert "~23 tok" in alpha, "90 characters of text and thinking, about four a token"
    assert alpha.endswith("should be managed, because ops is small."), "one line, newlines folded"
    progress.heard("alpha", None, Delta("text", " " + "word " * 30))
    assert len(progress.lines()[0].split("…")[-1]) <= 48, "only the end of a long answer"
    progress.record({"provider": "alpha", "status": "ok"})
    assert "tok" not in progress.lines()[0], "a finished row shows its status"
    for piece in ('{"answer": "Managed', ", because ops \\u00e9", 'quipe is small\\n", "confidence": 0.8}'):
        progress.heard("beta", "synthesizer", Delta("text", piece))
        chair = next(line for line in progress.lines() if line.startswith("  … synthesizer beta"))
        assert '"answer"' not in chair, "the synthesis shows as prose, not as its envelope"
    assert chair.endswith("…Managed, because ops équipe is small"), chair


def test_a_new_model_call_starts_a_rows_text_again() -> None:
    """A member's tool hop or re-prompt is a new model call: its text replaces what the row showed."""
    progress = LiveProgress.for_confer(["alpha"], FakeTerminal())
    progress.start()
    progress.heard("alpha", None, Delta("start", ""))
    progress.heard("alpha", None, Delta("text", '<tool_call>{"name": "verify"}</tool_call>'))
    progress.heard("alpha", None, Delta("start", ""))
    progress.heard("alpha", None, Delta("text", "Checked: 391."))
    row = progress.lines()[0]
    assert row.endswith("Checked: 391.") and "tool_call" not in row


def test_coordinate_progress_moves_through_the_roles_in_order() -> None:
    progress = LiveProgress.for_coordinate("alpha", ["beta", "gamma"], "beta", 1, FakeTerminal())
    progress.start()
    assert [line.split()[0] for line in progress.lines()] == ["…", "·", "·", "·"]
    progress.record({"role": "proposer", "provider": "alpha", "status": "ok", "round": 1})
    assert [line.split()[0] for line in progress.lines()] == ["✓", "…", "…", "·"]
    progress.record({"role": "critic", "provider": "gamma", "status": "ok", "round": 1})
    progress.record({"role": "critic", "provider": "beta", "status": "ok", "round": 1})
    progress.record({"role": "synthesizer", "provider": "beta", "status": "error", "round": 1})
    progress.record({"role": "synthesizer", "provider": "alpha", "status": "ok", "round": 1})
    lines = progress.lines()
    assert "synthesizer beta" in lines[3] and "error" in lines[3]
    assert "synthesizer alpha (fallback)" in lines[4] and "✓" in lines[4]


def test_rendering_has_colour_only_when_asked() -> None:
    result = {
        "session_id": "s",
        "degraded": True,
        "degraded_reasons": [{"provider": "a", "role": None, "status": "timeout", "code": None}],
        "answers": [],
        "usage": {},
        "warnings": [],
    }
    assert "\x1b[" in render_confer(result, colour=True)
    assert "\x1b[" not in render_confer(result, colour=False)


def test_serve_help_describes_the_transports(tmp_path: Path) -> None:
    result = conclave("serve", "--help", cwd=tmp_path)
    assert result.returncode == 0
    assert "--http HOST:PORT" in result.stdout and "stdio" in result.stdout


def test_serve_refuses_a_malformed_bind_address_without_touching_stdout(tmp_path: Path) -> None:
    result = conclave("serve", "--http", "127.0.0.1:http", cwd=tmp_path)
    assert result.returncode == 2
    assert "port must be a number" in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("value", "bind"),
    [
        ("127.0.0.1:8765", ("127.0.0.1", 8765)),
        ("[::1]:9000", ("::1", 9000)),
        (":9000", ("127.0.0.1", 9000)),
        ("localhost", ("localhost", 8765)),
        ("0.0.0.0:0", ("0.0.0.0", 0)),
    ],
)
def test_bind_addresses_parse_like_a_user_writes_them(value: str, bind: tuple[str, int]) -> None:
    assert parse_bind(value) == bind


def test_only_loopback_hosts_count_as_local() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert is_loopback("[::1]") and is_loopback("localhost.localdomain") and is_loopback("127.0.0.2")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4") and not is_loopback("example.org")


def test_confer_review_and_synthesize_show_the_ranking_table_and_the_synthesis(
    workdir: Path, panel: Panel
) -> None:
    members = ["alpha", "beta", "gamma"]
    best_first = ["gamma", "alpha", "beta"]
    for name in members:
        shown = [m for m in members if m != name]
        label_of = {p: label for label, p in review.shuffled("cli-council", name, shown)}
        ranking = [label_of[p] for p in best_first if p != name]
        envelope = {"ranking": ranking, "notes": {}, "confidence": 0.6}
        rules = [
            {"contains": "Rank every one of these labels", "reply": {"text": json.dumps(envelope)}},
            {"contains": "Write the final answer to the question", "reply": {"text": json.dumps(SYNTHESIS)}},
        ]
        panel.script(f"m-{name}", {"replies": [{"text": f"{name} answers."}], "rules": rules})
    result = conclave("confer", "q", "--review", "--synthesize", "--session", "cli-council", cwd=workdir)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "═══ Review · 3 reviewers" in out
    assert re.search(r"reviewer\s+gamma\s+alpha\s+beta", out), out
    assert re.search(r"1\. gamma\s+1\.00", out)
    assert "═══ Synthesis" in out and SYNTHESIS["answer"] in out
    parsed = json.loads(
        conclave("confer", "q", "--review", "--session", "cli-council", "--json", cwd=workdir).stdout
    )
    assert parsed["review"]["top"] == "gamma"


def test_coordinate_all_rounds_runs_every_round_after_the_critics_accept(workdir: Path, panel: Panel) -> None:
    panel.script("m-alpha", {"replies": [{"text": json.dumps(PROPOSAL)}]})
    accept = {"text": json.dumps({"verdict": "accept", "issues": []})}
    panel.script(
        "m-beta",
        {
            "rules": [
                {"contains": "Write the final answer to the task", "reply": {"text": json.dumps(SYNTHESIS)}},
                {"contains": "Review this proposal", "reply": accept},
            ]
        },
    )
    panel.script("m-gamma", {"replies": [accept]})
    stopped = json.loads(conclave("coordinate", "t", "--rounds", "2", "--json", cwd=workdir).stdout)
    full = json.loads(
        conclave("coordinate", "t", "--rounds", "2", "--all-rounds", "--json", cwd=workdir).stdout
    )
    assert (stopped["rounds_run"], stopped["converged"]) == (1, True)
    assert (full["rounds_run"], full["converged"]) == (2, True)


def test_live_progress_shows_a_confers_reviewers_and_chair_as_they_come() -> None:
    progress = LiveProgress.for_confer(["alpha", "beta"], io.StringIO())
    progress.start()
    for event in (
        {"provider": "alpha", "status": "ok", "done": 1, "total": 2},
        {"provider": "beta", "status": "ok", "done": 2, "total": 2},
        {"waiting": ["reviewer beta"]},
        {"role": "reviewer", "provider": "beta", "status": "ok", "round": 1, "done": 1},
        {"role": "synthesizer", "provider": "alpha", "status": "ok", "round": 1, "done": 2},
    ):
        if "waiting" not in event:
            progress.record(event)
    labels = [line.split()[1:3] for line in progress.lines()]
    assert labels == [["alpha", "ok"], ["beta", "ok"], ["reviewer", "beta"], ["synthesizer", "alpha"]]


@pytest.mark.anyio
async def test_an_error_inside_the_live_progress_comes_out_as_itself() -> None:
    progress = LiveProgress.for_confer(["alpha"], FakeTerminal())
    with pytest.raises(OSError, match="disk full"):
        async with progress.shown():
            raise OSError("disk full")
