"""The `conclave` command as a user runs it: a subprocess, its exit code and what it prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SPEC_COMMANDS = ("serve", "confer", "coordinate", "fetch", "verify", "providers", "tail", "doctor", "demo")
CANARY = "sk-canary-cli-5e1f0a9d3c7b"


def conclave(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "CONCLAVE_CONFIG"}
    return subprocess.run(
        [sys.executable, "-m", "conclave", *args],
        cwd=cwd,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_help_lists_every_spec_command(tmp_path: Path) -> None:
    result = conclave("--help", cwd=tmp_path)
    assert result.returncode == 0
    for command in SPEC_COMMANDS:
        assert command in result.stdout
    assert "not built" not in result.stdout


@pytest.mark.parametrize("command", SPEC_COMMANDS)
def test_every_spec_command_is_built_and_explains_itself(tmp_path: Path, command: str) -> None:
    result = conclave(command, "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"usage: conclave {command}" in result.stdout
    assert "--config" in result.stdout
    assert "not implemented" not in result.stdout + result.stderr


def test_providers_shows_key_presence_never_the_key(tmp_path: Path) -> None:
    result = conclave("providers", "--json", cwd=tmp_path, env={"OPENAI_API_KEY": CANARY})
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert rows["openai"]["key_present"] is True
    assert rows["anthropic"]["key_present"] is False
    assert rows["openai"]["in_panel"] is True and rows["xai"]["in_panel"] is False
    assert rows["ollama"]["api_key_env"] is None
    assert CANARY not in result.stdout + result.stderr


def test_providers_say_how_each_encodes_worker_tools(tmp_path: Path) -> None:
    rows = {row["name"]: row for row in json.loads(conclave("providers", "--json", cwd=tmp_path).stdout)}
    assert {rows[n]["tool_mode"] for n in ("openai", "anthropic", "gemini", "groq")} == {"native"}
    assert rows["ollama"]["tool_mode"] == "tags", "the shipped Ollama preset keeps the tag protocol"
    assert rows["llamacpp"]["tool_mode"] == "tags", "so does llama.cpp's"
    tags = conclave("providers", "--set", "worker_tools.mode=tags", "--json", cwd=tmp_path)
    assert {row["tool_mode"] for row in json.loads(tags.stdout)} == {"tags"}


def test_providers_table_tells_which_variable_to_set(tmp_path: Path) -> None:
    result = conclave("providers", cwd=tmp_path)
    assert "no (set ANTHROPIC_API_KEY)" in result.stdout


def test_providers_claims_no_breaker_state_it_cannot_know(tmp_path: Path) -> None:
    """Breakers live in a running server's memory; this separate process only says where to look."""
    table = conclave("providers", cwd=tmp_path)
    rows = json.loads(conclave("providers", "--json", cwd=tmp_path).stdout)
    assert "BREAKER" not in table.stdout and "closed" not in table.stdout
    assert all("breaker" not in row for row in rows)
    assert "list_providers" in table.stdout


def test_doctor_against_the_simulated_panel_passes_for_every_wire_kind(tmp_path: Path) -> None:
    result = conclave("doctor", "--simulated", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SIMULATED" in result.stdout
    for name in ("sim-openai", "sim-anthropic", "sim-gemini"):
        line = next(line for line in result.stdout.splitlines() if line.startswith(name))
        assert " ok " in line
    assert "verdict: ok" in result.stdout
    events = (tmp_path / ".conclave" / "events.ndjson").read_text(encoding="utf-8").splitlines()
    assert sum('"provider_call"' in e for e in events) == 3


def test_doctor_fails_naming_missing_variables_and_unreachable_providers(tmp_path: Path) -> None:
    closed = "http://127.0.0.1:9/v1"  # discard port: nothing answers on loopback
    providers = {
        "a": {"kind": "openai", "model": "m", "base_url": closed, "api_key_env": "A_API_KEY"},
        "b": {"kind": "anthropic", "model": "m", "base_url": closed, "api_key_env": "B_API_KEY"},
        "spare": {"kind": "gemini", "model": "m", "base_url": closed, "api_key_env": "C_API_KEY"},
    }
    (tmp_path / "config.yaml").write_text(
        json.dumps({"providers": providers, "panel": ["a", "b"], "limits": {"retry": {"max_attempts": 1}}})
    )
    result = conclave("doctor", cwd=tmp_path, env={"A_API_KEY": CANARY})
    assert result.returncode == 1
    lines = {
        line.split()[0]: line
        for line in result.stdout.splitlines()[2:]
        if line and not line.startswith("verdict")
    }
    assert "FAIL" in lines["a"] and "connection_error" in lines["a"]
    assert "FAIL" in lines["b"] and "set the environment variable B_API_KEY" in lines["b"]
    assert "warn" in lines["spare"], "a provider nothing uses is reported, not failed"
    assert "BROKEN" in result.stdout and "a, b" in result.stdout
    assert CANARY not in result.stdout + result.stderr
    log = (tmp_path / ".conclave" / "events.ndjson").read_text(encoding="utf-8")
    assert CANARY not in log


def test_config_errors_are_one_line_on_stderr_with_exit_2(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("panel: [a\n", encoding="utf-8")
    result = conclave("providers", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("conclave: config:")


def test_every_command_takes_config(tmp_path: Path) -> None:
    result = conclave("providers", "--config", str(tmp_path / "missing.yaml"), cwd=tmp_path)
    assert result.returncode == 2
    assert "missing.yaml" in result.stderr


def test_verify_prints_each_check_and_exits_non_zero_when_one_fails(tmp_path: Path) -> None:
    checks = [
        {"type": "math", "expression": "6*7", "expected": 42},
        {"type": "contains", "text": "hello world", "substring": "planet"},
    ]
    (tmp_path / "checks.json").write_text(json.dumps(checks))
    result = conclave("verify", "--checks", "checks.json", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "✓ [0] math" in result.stdout
    assert "✗ [1] contains" in result.stdout


def test_verify_reads_stdin_and_prints_json(tmp_path: Path) -> None:
    payload = json.dumps({"checks": [{"type": "regex", "pattern": "^a+$", "text": "aaa"}]})
    result = subprocess.run(
        [sys.executable, "-m", "conclave", "verify", "--checks", "-", "--json"],
        cwd=tmp_path,
        input=payload,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["passed"] is True


def test_verify_with_bad_arguments_names_the_path(tmp_path: Path) -> None:
    (tmp_path / "checks.json").write_text(json.dumps([{"type": "math"}]))
    result = conclave("verify", "--checks", "checks.json", cwd=tmp_path)
    assert result.returncode == 2
    assert "$.checks[0]" in result.stderr


def test_fetch_refusal_prints_the_reason_and_exits_1(tmp_path: Path) -> None:
    result = conclave("fetch", "http://169.254.169.254/latest/meta-data/", cwd=tmp_path)
    assert result.returncode == 1
    assert "metadata_address" in result.stderr
    assert result.stdout == ""


def test_fetch_of_something_that_is_not_a_url_is_a_bad_argument(tmp_path: Path) -> None:
    result = conclave("fetch", "notaurl", cwd=tmp_path)
    assert result.returncode == 2
    assert (
        result.stderr == "conclave fetch: 'notaurl' is not a URL; write it whole, e.g. https://example.org/\n"
    )


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["confer", "q", "--set", "panel=[]"], {}),
        (["coordinate", "t"], {"CONCLAVE_PANEL": " , "}),
        (["doctor", "--set", "panel=[]"], {}),
    ],
    ids=["set-empty-panel", "blank-CONCLAVE_PANEL", "doctor"],
)
def test_a_config_with_nobody_to_ask_is_one_line_and_exit_2(
    tmp_path: Path, args: list[str], env: dict[str, str]
) -> None:
    result = conclave(*args, cwd=tmp_path, env=env)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("conclave: config:")
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_a_users_file_with_only_a_panel_uses_the_presets_and_derived_roles(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("panel: [openai, mistral]\n", encoding="utf-8")
    result = conclave("providers", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "panel (confer): openai, mistral" in result.stdout
    assert "roles (coordinate): proposer openai · critics mistral · synthesizer mistral" in result.stdout
    assert "note:" not in result.stdout


def test_providers_says_when_the_proposer_would_judge_its_own_proposal(tmp_path: Path) -> None:
    result = conclave("providers", "--set", "panel=[xai]", cwd=tmp_path)
    assert "synthesizer xai" in result.stdout
    assert "note: the proposer also synthesizes" in result.stdout


def test_doctor_without_any_key_points_to_what_runs_without_one(tmp_path: Path) -> None:
    result = conclave("doctor", "--set", "panel=[openai, anthropic]", cwd=tmp_path)
    assert result.returncode == 1
    assert "`conclave doctor --simulated`, `conclave demo`" in result.stdout
