"""The worker loop end to end: the simulated panel over loopback HTTP, through the real
adapters, with `fetch` reaching a local page and its result fed back to the model."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest

from conclave.app.runtime import open_runtime
from conclave.app.sim import Reply, Rule, Scenario, SimPanel
from conclave.core.budgets import CostCap
from conclave.core.messages import Message
from conclave.schema.config import Config
from conclave.worker.loop import WorkerLoop, WorkerTurn
from tests.support import system_text, text_page

pytestmark = pytest.mark.anyio


@pytest.fixture
async def page_port() -> AsyncIterator[int]:
    async with text_page("/fact", "The launch code is 7731.") as port:
        yield port


def last_text(kind: str, body: dict[str, Any]) -> str:
    if kind == "gemini":
        return str(body["contents"][-1]["parts"][0]["text"])
    return str(body["messages"][-1]["content"])


@pytest.mark.parametrize("kind", ["openai", "anthropic", "gemini"])
async def test_a_worker_fetches_through_the_panel_and_answers_from_the_page(
    make_config: Callable[..., Config], page_port: int, kind: str
) -> None:
    tag = (
        f'<tool_call>{{"name": "fetch", "args": {{"url": "http://127.0.0.1:{page_port}/fact"}}}}</tool_call>'
    )
    scenario = Scenario(
        replies=(Reply(text=tag),), rules=(Rule("<tool_result", Reply(text="From the page: {last}")),)
    )
    async with SimPanel(scenarios={"w1": scenario}) as panel:
        config = make_config(
            {
                "w": {
                    "kind": kind,
                    "model": "w1",
                    "base_url": panel.base_url(kind),
                    "price": {"input_per_mtok": 1.0, "output_per_mtok": 2.0},
                }
            },
            fetch={"allow_private": ["127.0.0.1/32"], "allow_ports": [page_port]},
        )
        async with open_runtime(config) as rt:
            loop = WorkerLoop(
                registry=rt.tools,
                tool_context=rt.tool_context,
                telemetry=rt.telemetry,
                settings=config.worker_tools,
            )
            out = await loop.run(
                WorkerTurn(
                    provider=rt.providers.get("w"),
                    messages=(Message("user", "What is the code?"),),
                    deadline=anyio.current_time() + 20,
                    session_id="e2e",
                    tools=("fetch",),
                    cost_cap=CostCap(1.0, "warn"),
                    canary="CANARY-feedfacefeedface",
                )
            )
        bodies = [r.body for r in panel.received]
    assert out.error is None
    assert "The launch code is 7731." in out.text
    assert out.hops == 2
    assert [c.to_dict() for c in out.inner_tool_calls] == [
        {"hop": 1, "name": "fetch", "status": "ok", "reason": None}
    ]
    assert len(bodies) == 2
    assert "<tool_call>" in system_text(kind, bodies[0]) and "CANARY-feedfacefeedface" in system_text(
        kind, bodies[0]
    )
    assert "<untrusted_input>" in last_text(kind, bodies[1])
    assert out.usage.input_tokens > 0 and out.usage.output_tokens > 0
    assert out.usage.cost_usd == pytest.approx(
        (out.usage.input_tokens * 1.0 + out.usage.output_tokens * 2.0) / 1e6
    )
    assert out.cost_cap is not None and out.cost_cap.exceeded is False
