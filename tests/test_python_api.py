"""`conclave.confer` / `conclave.coordinate`: the Python door returns the same results."""

from __future__ import annotations

from collections.abc import Callable
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
