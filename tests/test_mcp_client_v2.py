"""The official MCP Python SDK 2.x, as a real client nobody here wrote, drives `conclave serve`
in both eras (docs/server.md#mcp-both-eras): `mode="auto"` probes `server/discover` and must land on the stateless
revision 2026-07-28, `mode="2026-07-28"` pins it, `mode="legacy"` takes the handshake; over
stdio and over Streamable HTTP. Then `coordinate` and `confer` as tasks, through a client
extension for `io.modelcontextprotocol/tasks` built on the SDK's own hooks: resolved by polling,
cancelled, and fetched by a second client after the first one left.

SDK 2.x lives in its own virtualenv (`.venv/sdk2`, made by `scripts/setup dev`), so each client
is `tests/sdk2_client.py` run there; SDK 1.x over the handshake is tests/test_mcp_client.py."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from conclave.app.sim import Reply, Scenario, SimPanel
from conclave.schema.schemas import first_error
from tests.hardening.load import serve
from tests.server_support import panel_config
from tests.support import read_events

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[1]
SDK2_PYTHON = ROOT / ".venv" / "sdk2" / "bin" / "python"
CLIENT = ROOT / "tests" / "sdk2_client.py"
PROPOSAL = {"proposal": "Use PostgreSQL.", "rationale": "Transactions.", "confidence": 0.7}
CRITIQUE = {"verdict": "accept", "issues": []}
SYNTHESIS = {"answer": "PostgreSQL.", "confidence": 0.8, "resolved": [], "dissent": []}

if not SDK2_PYTHON.exists():
    pytest.skip(
        "MCP SDK 2.x is not installed: run scripts/setup dev (it makes .venv/sdk2)", allow_module_level=True
    )


async def sdk2(job: dict[str, Any], cwd: Path) -> dict[str, Any]:
    """Run one client job under SDK 2.x; what it saw, as JSON."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "CONCLAVE_CONFIG"}
    with anyio.fail_after(90):
        done = await anyio.run_process(
            [str(SDK2_PYTHON), str(CLIENT), json.dumps(job)], cwd=cwd, env=env, check=False
        )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    out: dict[str, Any] = json.loads(done.stdout)
    return out


@pytest.fixture
async def panel() -> AsyncIterator[SimPanel]:
    async with SimPanel() as sim:
        sim.set_scenario("m-alpha", Scenario(replies=(Reply(text=json.dumps(PROPOSAL)),)))
        sim.set_scenario("m-beta", Scenario(replies=(Reply(text=json.dumps(SYNTHESIS)),)))
        sim.set_scenario("m-gamma", Scenario(replies=(Reply(text=json.dumps(CRITIQUE)),)))
        yield sim


@pytest.fixture
def config(panel: SimPanel, tmp_path: Path) -> Path:
    return panel_config(panel, tmp_path, tasks={"poll_interval_ms": 100})


@pytest.fixture
async def http_url(config: Path, tmp_path: Path) -> AsyncIterator[str]:
    async with serve("http", config, tmp_path) as server:
        yield f"{server.base_url}/mcp"


def stdio_command(config: Path) -> list[str]:
    return [sys.executable, "-m", "conclave", "serve", "--config", str(config)]


@pytest.mark.parametrize(
    ("mode", "version"), [("auto", "2026-07-28"), ("2026-07-28", "2026-07-28"), ("legacy", "2025-11-25")]
)
@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_sdk2_lands_on_the_era_its_mode_asks_for_and_calls_a_tool(
    transport: str, mode: str, version: str, config: Path, tmp_path: Path
) -> None:
    if transport == "stdio":
        seen = await sdk2({"server": stdio_command(config), "mode": mode, "job": "probe"}, tmp_path)
    else:
        async with serve("http", config, tmp_path) as server:
            seen = await sdk2({"server": f"{server.base_url}/mcp", "mode": mode, "job": "probe"}, tmp_path)
    assert seen["protocol_version"] == version
    assert seen["tools"] == ["confer", "coordinate", "fetch", "list_providers", "verify"]
    assert seen["verify"]["passed"] is True


@pytest.mark.parametrize(("transport", "mode"), [("stdio", "legacy"), ("http", "auto")])
async def test_sdk2_lists_and_reads_a_past_session_as_a_resource(
    transport: str, mode: str, config: Path, tmp_path: Path
) -> None:
    job = {"mode": mode, "job": "resources", "question": "Which database for the ledger?"}
    if transport == "stdio":
        seen = await sdk2({**job, "server": stdio_command(config)}, tmp_path)
    else:
        async with serve("http", config, tmp_path) as server:
            seen = await sdk2({**job, "server": f"{server.base_url}/mcp"}, tmp_path)
    assert seen["resources"] == [seen["session_id"]]
    assert seen["templates"] == ["conclave://sessions/{id}", "conclave://sessions/{id}/summary"]
    (summary,) = seen["summary"]
    assert summary["mimeType"] == "text/markdown" and "Which database for the ledger?" in summary["text"]


async def test_a_coordinate_runs_as_a_task_and_the_extension_resolves_it(
    http_url: str, panel: SimPanel, tmp_path: Path
) -> None:
    panel.set_scenario("m-gamma", Scenario(replies=(Reply(text=json.dumps(CRITIQUE)),), latency_ms=400))
    job = {"server": http_url, "job": "task", "tool": "coordinate", "arguments": {"task": "Pick a database."}}
    seen = await sdk2(job, tmp_path)
    assert seen["protocol_version"] == "2026-07-28" and seen["is_error"] is False
    result = seen["result"]
    assert first_error("coordinate.output.json", result) is None
    assert result["synthesis"]["envelope"]["answer"] == "PostgreSQL."
    assert seen["statuses"][0] == "working" and seen["statuses"][-1] == "completed"
    assert any("answered: " in m for m in seen["messages"]), "the status message names who has answered"


async def test_a_cancelled_task_stops_its_calls_and_says_cancelled(
    http_url: str, panel: SimPanel, tmp_path: Path
) -> None:
    panel.set_scenario("m-alpha", Scenario(replies=(Reply(),), latency_ms=20_000))
    args = {"question": "Which queue?", "providers": ["alpha"], "session_id": "task-cancelled"}
    seen = await sdk2(
        {"server": http_url, "job": "task-cancel", "tool": "confer", "arguments": args}, tmp_path
    )
    assert seen["created"]["resultType"] == "task" and seen["created"]["status"] == "working"
    assert seen["final"]["status"] == "cancelled" and "result" not in seen["final"]
    await anyio.sleep(0.5)  # the event log is written in batches
    ends = [e for e in read_events(tmp_path / "events.ndjson") if e["event"] == "session_end"]
    assert [(e["session_id"], e["status"]) for e in ends] == [("task-cancelled", "cancelled")]


async def test_a_client_that_left_mid_task_fetches_the_result_later(
    http_url: str, panel: SimPanel, tmp_path: Path
) -> None:
    panel.set_scenario("m-alpha", Scenario(replies=(Reply(text="Kafka."),), latency_ms=600))
    args = {"question": "Which queue?", "providers": ["alpha"]}
    started = await sdk2(
        {"server": http_url, "job": "task-start", "tool": "confer", "arguments": args}, tmp_path
    )
    task_id = started["created"]["taskId"]
    assert started["created"]["status"] == "working"  # the first client is gone now
    later = await sdk2({"server": http_url, "job": "task-get", "task_id": task_id}, tmp_path)
    final = later["final"]
    assert final["status"] == "completed" and final["taskId"] == task_id
    structured = final["result"]["structuredContent"]
    assert first_error("confer.output.json", structured) is None
    assert structured["answers"][0]["text"] == "Kafka."
