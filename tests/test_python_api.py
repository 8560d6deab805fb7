"""`conclave.confer` / `conclave.coordinate`: the Python door returns the same results."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import conclave
from conclave.config import Config
from conclave.schemas import first_error
from conclave.sim import SimPanel


@pytest.mark.anyio
async def test_confer_from_python_returns_the_structured_result(make_config: Callable[..., Config]) -> None:
    async with SimPanel() as panel:
        config = make_config({"a": {"kind": "openai", "model": "m", "base_url": panel.base_url("openai")}})
        result: dict[str, Any] = await conclave.confer("Which?", config=config, session_id="py-1")
    assert first_error("confer.output.json", result) is None
    assert result["session_id"] == "py-1"
    assert result["answers"][0]["status"] == "ok"


def test_the_sync_wrapper_runs_outside_an_event_loop(make_config: Callable[..., Config]) -> None:
    config = make_config(
        {"a": {"kind": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1"}},
        retry={"max_attempts": 1},
    )
    result = conclave.confer_sync("Which?", config=config, dry_run=True)
    assert result["dry_run"] is True
    assert result["plan"]["max_calls"] == 1


def test_a_process_that_only_sees_valid_calls_never_loads_what_only_failures_need(tmp_path: Path) -> None:
    """Each of these is ~0.5-2.6 MB resident in every process that imports it (the F6 peak-RSS
    target counts them): jsonschema (only to explain a rejected argument), tenacity (only on a
    retry), httpx-aiohttp (only for a fetch), the fetch and verify tools (only when called). A
    valid confer, a bad argument and a verify call after it, run in a fresh interpreter against
    the simulated panel."""
    probe = f"""
import asyncio, sys
from conclave.config import load_config
from conclave.errors import InvalidArguments
from conclave.runtime import open_runtime
from conclave.deliberation.confer import confer
from conclave.sim import SimPanel
LAZY = ["jsonschema", "tenacity", "httpx_aiohttp", "conclave.tools.fetch", "conclave.tools.verify"]

async def main():
    async with SimPanel() as panel:
        path = {str(tmp_path / "config.yaml")!r}
        open(path, "w").write(
            "providers:\\n  a: {{kind: openai, model: m, base_url: " + panel.base_url("openai") + ", api_key_env: null}}\\n"
            "panel: [a]\\ntelemetry: {{path: {str(tmp_path / "events.ndjson")!r}}}\\n"
            "transcripts: {{dir: {str(tmp_path / "transcripts")!r}}}\\n"
        )
        async with open_runtime(load_config(path, env={{}}, dotenv=None)) as rt:
            result = await confer(rt, {{"question": "q?"}})
            print(result["answers"][0]["status"], [m for m in LAZY if m in sys.modules])
            try:
                await confer(rt, {{"question": "q?", "max_tokens": "many"}})
            except InvalidArguments as exc:
                print(exc.path, "jsonschema" in sys.modules)
            checked = await rt.call_tool("verify", {{"checks": [{{"type": "math", "expression": "1+1", "expected": 2}}]}})
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
