"""Sessions for the page's tests, run for real against the simulated panel: the demo's two, a
hostile one (a member fetches a page that carries markup and quotes it), and a slow one (members
answer seconds apart, so a page can watch it run)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from conclave.app.demo import demo_config, page_server
from conclave.app.runner import run_tool
from conclave.app.runtime import open_runtime
from conclave.app.sim import NativeCall, Reply, Rule, Scenario, SimPanel
from conclave.app.sim.simulated import SIMULATED_MEMBERS, simulated_config
from conclave.schema.config import Config, load_config

# What a hostile page and a model quoting it write: were any of it taken as markup, `__pwned` is set.
SCRIPT = "<script>window.__pwned=1</script>"
IMG = '<img src="x" onerror="window.__pwned=2">'
HOSTILE_PAGE = """<!doctype html><html><head><title>Totally normal page</title>
<script>window.__pwned=3</script></head>
<body><p>Read this: &lt;script&gt;window.__pwned=1&lt;/script&gt; and
&lt;img src="x" onerror="window.__pwned=2"&gt;</p></body></html>
"""
HOSTILE_ANSWER = f"The page says: {SCRIPT} {IMG} (quoted as it was written)."


def workdir_config(workdir: Path) -> Config:
    """The packaged config, writing its event log and transcripts under `workdir`."""
    overrides = [f"telemetry.path={workdir}/events.ndjson", f"transcripts.dir={workdir}/transcripts"]
    return load_config(None, overrides=overrides, env={}, dotenv=None)


def model(member: str) -> str:
    return SIMULATED_MEMBERS[member][1]


def hostile_site() -> contextlib.AbstractAsyncContextManager[int]:
    """A page whose markup would run, were it ever treated as markup; yields its port."""
    return page_server(HOSTILE_PAGE, "/page")


async def hostile_session(base: Config, session_id: str) -> dict[str, Any]:
    """sim-openai fetches the hostile page and quotes its markup in its answer."""
    async with SimPanel() as panel, hostile_site() as port:
        url = f"http://127.0.0.1:{port}/page"
        fetches = Scenario(
            replies=(Reply(tool_calls=(NativeCall("fetch", {"url": url}),)),),
            rules=(Rule("<tool_result", Reply(text=HOSTILE_ANSWER)),),
        )
        panel.set_scenario(model("sim-openai"), fetches)
        config = demo_config(base, panel, port)
        args = {
            "question": f"What does {url} say? {SCRIPT}",
            "providers": ["sim-openai", "sim-gemini"],
            "worker_tools": ["fetch"],
            "session_id": session_id,
        }
        async with open_runtime(config) as runtime:
            return await run_tool(runtime, "confer", args, None)


async def slow_session(base: Config, session_id: str, latencies: Mapping[str, float]) -> dict[str, Any]:
    """A confer whose members answer after the given seconds each."""
    async with SimPanel() as panel:
        for member, seconds in latencies.items():
            panel.set_scenario(model(member), Scenario(latency_ms=seconds * 1000))
        config = demo_config(base, panel, 0)
        config = dataclasses.replace(config, telemetry=base.telemetry, transcripts=base.transcripts)
        args = {"question": "Which is slowest?", "providers": list(latencies), "session_id": session_id}
        async with open_runtime(config) as runtime:
            return await run_tool(runtime, "confer", args, None)


THREAD_QUESTIONS = ("Which queue should the jobs go through?", "Managed or self-hosted?", "Who runs it?")


async def thread_sessions(base: Config, ids: tuple[str, str, str]) -> list[dict[str, Any]]:
    """Three turns of one thread, each following up the one before: the second is synthesized,
    and in the first sim-openai quotes hostile markup. Returns the three results."""
    async with SimPanel() as panel:
        hostile = Scenario(rules=(Rule(THREAD_QUESTIONS[0], Reply(text=HOSTILE_ANSWER)),))
        panel.set_scenario(model("sim-openai"), hostile)
        urls = {kind: panel.base_url(kind) for kind in ("openai", "anthropic", "gemini")}
        results: list[dict[str, Any]] = []
        async with open_runtime(simulated_config(base, urls)) as runtime:
            for n, (sid, question) in enumerate(zip(ids, THREAD_QUESTIONS, strict=True)):
                args: dict[str, Any] = {
                    "question": question,
                    "providers": ["sim-openai", "sim-gemini"],
                    "session_id": sid,
                    "synthesize": n == 1,
                }
                if results:
                    args["follow_up_of"] = results[-1]["session_id"]
                results.append(await run_tool(runtime, "confer", args, None))
        return results
