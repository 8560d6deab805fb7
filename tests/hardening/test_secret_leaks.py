"""F7 item 6, secrets: canary API keys never leak, whatever the providers send back.

Four panel members on the simulated panel, one per wire kind plus a self-hosted OpenAI-compatible
one, each with its own key in its own environment variable. Three keys have the `sk-…` credential
shape; the fourth has none (and holds `+ / =`, so its URL-encoded form differs), so the configured
value must be redacted as such, not only recognised by its shape.

Every fault the panel can produce is exercised, each provider ECHOING its key in its error
message (plain, base64, URL-encoded and hex) and in a response header: 400, 401, 403, 404, 429
(retried, and `insufficient_quota`), 500, 503, 529, and the faults `drop`, `malformed`,
`missing_fields` and `empty` with the key in the scripted text. Then confer, coordinate (with and
without worker tools), fetch, verify and list_providers in process, and every CLI command as a
subprocess (`providers`, `doctor`, `confer`, `coordinate`, `tail`, `fetch`, `verify`, a `serve`
stdio session, `--help`), with stdout and stderr captured.

Then stdout, stderr, the event log, every transcript, every result and every error message are
searched for each key in plain, base64 (standard and URL-safe, with and without padding, and at
the three byte alignments a key takes inside a longer encoded blob), URL-encoded and hex forms:
the figure `secrets: occurrences found` must be 0. The simulated panel legitimately receives the
keys (checked, or this would prove nothing); its recording masks them and is not searched.
"""

from __future__ import annotations

import base64
import os
import secrets
import sys
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import anyio
import orjson
import pytest
import yaml

from conclave.app.catalog import tool_spec
from conclave.app.runtime import Runtime, open_runtime
from conclave.app.server.core import Server
from conclave.app.sim import Reply, Rule, Scenario, SimPanel, mask_secret
from conclave.app.sim.recording import Kind
from conclave.app.sim.scenarios import Fault
from conclave.core.errors import ConclaveError
from conclave.deliberation.confer import confer
from conclave.deliberation.coordinate import coordinate
from conclave.obs.redact import Redactor
from conclave.schema.config import Config, load_config
from tests.hardening.figures import long_run, record

pytestmark = pytest.mark.anyio

# name -> (wire kind, environment variable, key)
MEMBERS: dict[str, tuple[Kind, str, str]] = {
    "c-openai": ("openai", "CONCLAVE_CANARY_OPENAI_KEY", f"sk-canary-openai-{secrets.token_hex(12)}"),
    "c-anthropic": (
        "anthropic",
        "CONCLAVE_CANARY_ANTHROPIC_KEY",
        f"sk-canary-anthropic-{secrets.token_hex(12)}",
    ),
    "c-gemini": ("gemini", "CONCLAVE_CANARY_GEMINI_KEY", f"sk-canary-gemini-{secrets.token_hex(12)}"),
    "c-selfhosted": ("openai", "CONCLAVE_CANARY_SELFHOSTED_KEY", f"cnry+/={secrets.token_hex(10)}=/+x"),
}
KEYS = {env: key for _kind, env, key in MEMBERS.values()}
STATUSES = (400, 401, 403, 404, 429, 500, 503, 529)
TEXT_FAULTS: tuple[Fault, ...] = ("drop", "malformed", "missing_fields", "empty")


def b64_forms(data: bytes) -> set[str]:
    forms = set()
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        for pad in range(3):  # the key after 0, 1 or 2 other bytes: its stable middle part
            text = encode(b"\0" * pad + data).decode()
            head = 4 if pad else 0
            body = text[head:-4] if len(text) > head + 8 else text[head:]
            forms.add(body)
            forms.add(text.rstrip("="))
            forms.add(text)
    return {f for f in forms if len(f) >= 12}


def needles(key: str) -> dict[str, str]:
    """Every spelling of `key` searched for, by a name saying which spelling it is."""
    raw = key.encode()
    forms = {
        "plain": key,
        "url-encoded": quote(key, safe=""),
        "form-encoded": quote_plus(key),
        "hex": raw.hex(),
        "HEX": raw.hex().upper(),
    }
    for index, form in enumerate(sorted(b64_forms(raw))):
        forms[f"base64#{index}"] = form
    return forms


NEEDLES = {key: needles(key) for key in KEYS.values()}


def encoded_echo(key: str) -> str:
    """An error message quoting the key back in every spelling (a careless or hostile provider)."""
    raw = key.encode()
    return (
        f"Incorrect API key provided: {key}. Authorization: Bearer {key}; "
        f"Basic {base64.b64encode(b'user:' + raw).decode()}; b64={base64.b64encode(raw).decode()} "
        f"b64url={base64.urlsafe_b64encode(raw).decode().rstrip('=')}; url=?api_key={quote(key, safe='')}&key={key}; "
        f"hex={raw.hex()}"
    )


def script(key: str) -> Scenario:
    """Rules keyed by the marker in the question: every provider misbehaves the same way, echoing."""
    echo = encoded_echo(key)
    headers = {"x-echo-authorization": f"Bearer {key}", "x-echo-key": key}
    rules = [
        Rule(f"FAULT:{status}", Reply(status=status, error_message=echo, headers=headers))
        for status in STATUSES
    ]
    rules.append(
        Rule(
            "FAULT:quota",
            Reply(status=429, error_type="insufficient_quota", error_message=echo, headers=headers),
        )
    )
    rules += [
        Rule(f"FAULT:{fault}", Reply(fault=fault, text=f"your key is {key} ({echo})", headers=headers))
        for fault in TEXT_FAULTS
    ]
    rules.append(Rule("single word OK", Reply(status=401, error_message=echo, headers=headers)))  # doctor
    return Scenario(rules=tuple(rules))


def tool_script(page: str) -> Scenario:
    """A worker that fetches a page and runs a check, then answers."""
    fetch_tag = '<tool_call>{"name": "fetch", "args": {"url": "' + page + '"}}</tool_call>'
    verify_tag = '<tool_call>{"name": "verify", "args": {"checks": [{"type": "math", "expression": "2+2"}]}}</tool_call>'
    return Scenario(
        rules=(
            Rule("<tool_result", Reply(text='{"proposal": "p", "rationale": "r", "confidence": 0.5}')),
            Rule("TOOLS", Reply(text=fetch_tag)),
        ),
        replies=(Reply(text=verify_tag),),
    )


def all_faults() -> list[str]:
    return [str(s) for s in STATUSES] + ["quota", *TEXT_FAULTS]


class Evidence:
    """Everything that left Conclave: named blobs of text, searched at the end."""

    def __init__(self) -> None:
        self.blobs: list[tuple[str, str]] = []

    def add(self, source: str, value: Any) -> None:
        if isinstance(value, bytes):
            text = value.decode("utf-8", "replace")
        elif isinstance(value, str):
            text = value
        else:
            text = orjson.dumps(value, default=str).decode()
        self.blobs.append((source, text))

    def add_files(self, label: str, paths: Iterable[Path]) -> int:
        count = 0
        for path in paths:
            if path.is_file():
                self.add(f"{label}:{path.name}", path.read_bytes())
                count += 1
        return count

    def occurrences(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for source, text in self.blobs:
            for key, forms in NEEDLES.items():
                for form_name, needle in forms.items():
                    hits = text.count(needle)
                    if hits:
                        where = f"{source} [{form_name} of the {key[:14]}… key]"
                        found[where] = found.get(where, 0) + hits
        return found


def config_data(panel: SimPanel, tmp_path: Path, events: Path) -> dict[str, Any]:
    providers = {
        name: {
            "kind": kind,
            "model": f"m-{name}",
            "base_url": panel.base_url(kind),
            "api_key_env": env,
            "price": {"input_per_mtok": 1.0, "output_per_mtok": 2.0},
        }
        for name, (kind, env, _key) in MEMBERS.items()
    }
    return {
        "providers": providers,
        "panel": list(providers),
        "roles": {
            "proposer": "c-openai",
            "critics": ["c-anthropic", "c-gemini"],
            "synthesizer": "c-selfhosted",
            "synthesizer_fallbacks": ["c-openai"],
        },
        "limits": {
            "timeout_seconds": 20,
            "retry": {"max_attempts": 2, "initial_delay_seconds": 0.01, "max_delay_seconds": 0.02},
        },
        "breakers": {"failure_threshold": 1000, "cooldown_seconds": 1},
        "fetch": {"allow_private": ["127.0.0.1"], "allow_ports": [panel.port]},
        "telemetry": {"path": str(events)},
        "transcripts": {"dir": str(tmp_path / "transcripts")},
    }


@pytest.fixture
async def panel() -> AsyncIterator[SimPanel]:
    async with SimPanel() as sim:
        for name, (_kind, _env, key) in MEMBERS.items():
            sim.set_scenario(f"m-{name}", script(key))
        yield sim


def cli_env(tmp_path: Path) -> dict[str, str]:
    base = {
        k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and not k.startswith("CONCLAVE_")
    }
    return {**base, **KEYS, "HOME": str(tmp_path), "NO_COLOR": "1"}


async def run_cli(evidence: Evidence, tmp_path: Path, args: list[str], stdin: bytes = b"") -> int:
    done = await anyio.run_process(
        [sys.executable, "-m", "conclave", *args],
        input=stdin,
        check=False,
        cwd=tmp_path,
        env=cli_env(tmp_path),
    )
    label = " ".join(args)[:60]
    evidence.add(f"cli `{label}` stdout", done.stdout)
    evidence.add(f"cli `{label}` stderr", done.stderr)
    assert b"Traceback" not in done.stderr, (args, done.stderr.decode()[-2000:])
    return done.returncode


async def serve_session(evidence: Evidence, tmp_path: Path, config: Path, page: str) -> None:
    """A `conclave serve` stdio session: MCP and plain methods, good and bad, every tool."""
    calls: list[tuple[str, Any]] = [
        (
            "initialize",
            {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "0"},
            },
        ),
        ("tools/list", {}),
        ("tools/call", {"name": "list_providers", "arguments": {}}),
        (
            "tools/call",
            {"name": "confer", "arguments": {"question": "FAULT:401"}, "_meta": {"progressToken": 1}},
        ),
        ("tools/call", {"name": "coordinate", "arguments": {"task": "FAULT:malformed"}}),
        ("tools/call", {"name": "fetch", "arguments": {"url": page}}),
        ("tools/call", {"name": "fetch", "arguments": {"url": "http://169.254.169.254/latest/meta-data/"}}),
        ("tools/call", {"name": "verify", "arguments": {"checks": [{"type": "math", "expression": "6*7"}]}}),
        ("tools/call", {"name": "confer", "arguments": {"question": 5}}),
        ("confer", {"question": "FAULT:429"}),
        ("confer", {"question": "FAULT:quota", "worker_tools": ["fetch", "verify"]}),
        ("coordinate", {"task": "FAULT:529"}),
        ("fetch", {"url": "http://127.0.0.1:1/"}),
        ("verify", {"checks": [{"type": "json_parse", "text": "{"}]}),
        ("list_providers", None),
        ("no/such/method", None),
    ]
    lines = [
        orjson.dumps({"jsonrpc": "2.0", "id": i, "method": m, **({"params": p} if p is not None else {})})
        for i, (m, p) in enumerate(calls)
    ]
    lines.append(b"this is not json")
    process = await anyio.open_process(
        [sys.executable, "-m", "conclave", "serve", "--config", str(config)],
        cwd=tmp_path,
        env=cli_env(tmp_path),
    )
    assert process.stdin and process.stdout and process.stderr
    out, err = bytearray(), bytearray()

    async def drain(stream: Any, into: bytearray) -> None:
        async for chunk in stream:
            into.extend(chunk)

    async with anyio.create_task_group() as group:
        group.start_soon(drain, process.stdout, out)
        group.start_soon(drain, process.stderr, err)
        await process.stdin.send(b"\n".join(lines) + b"\n")
        with anyio.fail_after(60):
            while out.count(b'"id":') < len(calls) + 1:
                await anyio.sleep(0.05)
        await process.stdin.aclose()
        with anyio.fail_after(30):
            assert await process.wait() == 0
    evidence.add("serve stdout", bytes(out))
    evidence.add("serve stderr", bytes(err))
    assert b"Traceback" not in err, err.decode()[-2000:]
    replies = [orjson.loads(line) for line in bytes(out).splitlines()]
    assert {r.get("id") for r in replies if "id" in r} >= set(range(len(calls)))


async def in_process(evidence: Evidence, config: Config, page: str) -> None:
    async with open_runtime(config) as runtime:
        for fault in all_faults():
            evidence.add(
                f"confer FAULT:{fault}", (await confer(runtime, {"question": f"FAULT:{fault}"})).to_dict()
            )
        for fault in ("401", "500", "malformed", "quota"):
            evidence.add(
                f"coordinate FAULT:{fault}", (await coordinate(runtime, {"task": f"FAULT:{fault}"})).to_dict()
            )
        tools = {"worker_tools": ["fetch", "verify"]}
        evidence.add(
            "confer with tools", (await confer(runtime, {"question": "TOOLS please", **tools})).to_dict()
        )
        evidence.add(
            "coordinate with tools", (await coordinate(runtime, {"task": "TOOLS please", **tools})).to_dict()
        )
        evidence.add("fetch", await runtime.call_tool("fetch", {"url": page}))
        for refused in ("http://169.254.169.254/", "http://127.0.0.1:1/", "file:///etc/passwd"):
            await expect_error(evidence, f"fetch {refused}", runtime.call_tool("fetch", {"url": refused}))
        evidence.add(
            "verify",
            await runtime.call_tool("verify", {"checks": [{"type": "regex", "pattern": "a+", "text": "aa"}]}),
        )
        await expect_error(evidence, "verify bad", runtime.call_tool("verify", {"checks": "x"}))
        server = Server(runtime)
        evidence.add("list_providers", await server.run_tool(tool_spec("list_providers"), {}))
        for provider in MEMBERS:  # each client's own error, straight from the provider layer
            await expect_error(evidence, f"complete {provider}", probe(runtime, provider))


async def probe(runtime: Runtime, provider: str) -> Any:
    from conclave.core.messages import CompletionRequest

    request = CompletionRequest.ask("FAULT:401 direct")
    return await runtime.providers.get(provider).complete(request, deadline=anyio.current_time() + 10)


async def expect_error(evidence: Evidence, label: str, call: Any) -> None:
    try:
        result = await call
    except ConclaveError as exc:
        evidence.add(f"{label} error", [str(exc), repr(exc), exc.to_dict(), [str(a) for a in exc.args]])
        if exc.__cause__ is not None:
            evidence.add(f"{label} cause", str(exc.__cause__))
    else:
        evidence.add(label, result)


async def cli_runs(evidence: Evidence, tmp_path: Path, config: Path, page: str) -> None:
    c = ["--config", str(config)]
    checks = orjson.dumps([{"type": "math", "expression": "6*7", "expected": 42}])
    # Every command once (CI); the long run adds the other output modes and every `--help`.
    runs: list[tuple[list[str], bytes]] = [
        (["--help"], b""),
        (["providers", *c], b""),
        (["doctor", "--json", *c], b""),
        (["confer", "FAULT:401", *c], b""),
        (["coordinate", "FAULT:quota", "--json", *c], b""),
        (["fetch", page, "--json", *c], b""),
        (["verify", "--checks", "-", *c], checks),
    ]
    if long_run():
        runs += [
            *[
                ([command, "--help"], b"")
                for command in (
                    "providers",
                    "doctor",
                    "confer",
                    "coordinate",
                    "tail",
                    "fetch",
                    "verify",
                    "serve",
                    "demo",
                    "sim",
                )
            ],
            (["providers", "--json", *c], b""),
            (["doctor", *c], b""),
            (["confer", "FAULT:malformed", "--json", *c], b""),
            (["confer", "FAULT:429", "--worker-tools", "fetch,verify", "--json", *c], b""),
            (["coordinate", "FAULT:500", *c], b""),
            (["fetch", page, *c], b""),
            (["fetch", "http://169.254.169.254/", *c], b""),
            (["verify", "--checks", "-", "--json", *c], checks),
            (["confer", "q", "--timeout", "-1", *c], b""),
        ]
    limiter = anyio.CapacityLimiter(2)  # two cores, shared

    async def one(args: list[str], stdin: bytes) -> None:
        async with limiter:
            await run_cli(evidence, tmp_path, args, stdin)

    async with anyio.create_task_group() as group:
        for args, stdin in runs:
            group.start_soon(one, args, stdin)
    # tail last, once the log holds every event
    await run_cli(evidence, tmp_path, ["tail", "--lines", "all", "--json", *c])
    if long_run():
        await run_cli(evidence, tmp_path, ["tail", "--lines", "all", *c])


async def test_canary_keys_never_leak_through_any_door(
    panel: SimPanel, tmp_path: Path, events_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    evidence = Evidence()
    config_path = tmp_path / "secrets.yaml"
    config_path.write_text(yaml.safe_dump(config_data(panel, tmp_path, events_path)), encoding="utf-8")
    config = load_config(str(config_path), env=KEYS, dotenv=None)
    page = f"http://127.0.0.1:{panel.port}/_sim/health"
    for name in ("c-openai", "c-anthropic"):
        panel.set_scenario(
            f"m-{name}",
            Scenario(
                rules=(*script(MEMBERS[name][2]).rules, *tool_script(page).rules),
                replies=tool_script(page).replies,
            ),
        )

    await in_process(evidence, config, page)
    await cli_runs(evidence, tmp_path, config_path, page)
    await serve_session(evidence, tmp_path, config_path, page)

    out, err = capfd.readouterr()
    evidence.add("test process stdout", out)
    evidence.add("test process stderr", err)
    events = evidence.add_files("event log", [events_path])
    transcripts = evidence.add_files("transcript", sorted((tmp_path / "transcripts").rglob("*")))

    # The keys really went out (each in its own header), or finding none of them proves nothing.
    sent = {h for r in panel.received for h in r.headers.values()}
    for name, (kind, _env, key) in MEMBERS.items():
        expected = mask_secret(f"Bearer {key}") if kind == "openai" else mask_secret(key)
        assert expected in sent, f"{name}'s key was never sent"
    assert events == 1 and transcripts >= len(all_faults()) + 4
    logged = [orjson.loads(line) for line in events_path.read_bytes().splitlines()]
    statuses = {e.get("http_status") for e in logged if e["event"] == "provider_call"}
    assert set(STATUSES) <= statuses, statuses  # every fault happened
    codes = {e.get("code") for e in logged if e["event"] == "provider_call"}
    assert {"malformed_response", "insufficient_quota", "auth_error"} <= codes, codes
    assert any(e["event"] == "provider_retry" for e in logged)

    found = evidence.occurrences()
    record(
        "secrets: occurrences found",
        sum(found.values()),
        target="== 0",
        command=".venv/bin/pytest tests/hardening/test_secret_leaks.py",
        details={
            "keys": len(KEYS),
            "forms_per_key": {key[:16] + "…": len(forms) for key, forms in NEEDLES.items()},
            "sources_searched": len(evidence.blobs),
            "bytes_searched": sum(len(text) for _source, text in evidence.blobs),
            "transcripts": transcripts,
            "found": found,
        },
    )
    assert found == {}


@pytest.mark.parametrize("name", list(MEMBERS))
def test_the_redactor_removes_every_spelling_a_provider_echoes(name: str) -> None:
    """Before the fix only the plain key (and `sk-…` shapes) were redacted: a provider quoting the
    key base64-, URL- or hex-encoded (a `Basic` header, a query string) leaked it everywhere."""
    key = MEMBERS[name][2]
    redactor = Redactor([key])
    evidence = Evidence()
    evidence.add("text", redactor.text(encoded_echo(key)))
    evidence.add("json", redactor.json_bytes(orjson.dumps({"error": {"message": encoded_echo(key)}})))
    evidence.add("value", redactor.value({"detail": [encoded_echo(key)]}))
    assert evidence.occurrences() == {}


def test_the_search_itself_finds_every_spelling() -> None:
    """A control: each spelling the test looks for is found when present."""
    evidence = Evidence()
    key = MEMBERS["c-selfhosted"][2]
    evidence.add("control", encoded_echo(key) + " " + base64.b64encode(b"xy" + key.encode()).decode())
    found = evidence.occurrences()
    names = {where.split("[")[1].split(" of")[0] for where in found}
    assert {"plain", "url-encoded", "hex"} <= names
    assert sum(name.startswith("base64") for name in names) >= 4
