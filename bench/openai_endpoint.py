"""What the OpenAI-compatible endpoint costs over MCP: the same council (a K=3 `confer` with
review and a chair's synthesis) asked of one `conclave serve --http` process as
`POST /v1/chat/completions` (model `conclave-council`), and as an MCP `tools/call` of `confer` on
`POST /mcp`, one request at a time, the two interleaved.

Run: .venv/bin/python -m bench.openai_endpoint [--requests 200] [--warmup 20]

The simulated panel runs in its own process at zero latency (`bench.panel`), unscripted: its
role answers make every review and synthesis valid. Both requests do the same deliberation (seven
model calls), so the difference is the endpoint's own work: mapping the messages, shaping the
reply. Prints p50 and p95 per request for each, and the difference at p50 (goal: within 2 ms),
plus the streamed endpoint (`stream: true`, to the last byte) for reference.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.common import QUESTION, percentile
from bench.panel import panel_process

BOUND = re.compile(r"serving MCP on (http://\S+)/mcp")
GOAL_MS = 2.0
KINDS = {"m1": "openai", "m2": "anthropic", "m3": "gemini"}


def _config(work: Path, urls: dict[str, str]) -> Path:
    data = {
        "providers": {
            name: {"kind": kind, "model": f"bench-{name}", "base_url": urls[kind], "api_key_env": None}
            for name, kind in KINDS.items()
        },
        "panel": list(KINDS),
        "roles": {"proposer": "m1", "critics": ["m2", "m3"], "synthesizer": "m1"},
        "telemetry": {"path": str(work / "events.ndjson")},
        "transcripts": {"dir": str(work / "transcripts")},
    }
    path = work / "openai-bench.yaml"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


async def _serve(config: Path) -> tuple[asyncio.subprocess.Process, str]:
    env = {k: v for k, v in os.environ.items() if k != "CONCLAVE_API_KEY"}  # loopback: no key
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "conclave", "serve", "--config", str(config), "--http", "127.0.0.1:0",
        env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    while True:
        line = (await asyncio.wait_for(proc.stderr.readline(), 60)).decode(errors="replace")
        if not line:
            raise RuntimeError("conclave serve --http exited before listening")
        if found := BOUND.search(line):
            return proc, found.group(1)


def _requests(session: Any, base: str) -> dict[str, Callable[[], Awaitable[None]]]:
    """One request of each kind, each checking that the council answered whole."""
    messages = [{"role": "user", "content": QUESTION}]
    mcp = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "confer", "arguments": {"question": QUESTION, "review": True, "synthesize": True}},
    }
    chat = {"model": "conclave-council", "messages": messages}

    async def over_mcp() -> None:
        async with session.post(f"{base}/mcp", json=mcp, headers={"accept": "application/json"}) as reply:
            body = await reply.json()
        result = body["result"]["structuredContent"]
        if result["degraded"] or not (result.get("synthesis") or {}).get("envelope"):
            raise RuntimeError(f"a degraded council is no measurement: {result['degraded_reasons']}")

    async def over_openai() -> None:
        async with session.post(f"{base}/v1/chat/completions", json=chat) as reply:
            body = await reply.json()
        if (
            reply.status != 200
            or body["conclave"]["degraded"]
            or not body["choices"][0]["message"]["content"]
        ):
            raise RuntimeError(f"a degraded council is no measurement: {body}")

    async def streamed() -> None:
        async with session.post(f"{base}/v1/chat/completions", json={**chat, "stream": True}) as reply:
            data = await reply.read()
        if not data.endswith(b"data: [DONE]\n\n") or b'"degraded":true' in data:
            raise RuntimeError(f"the stream did not end whole: {data[-300:]!r}")

    return {"mcp confer": over_mcp, "/v1 council": over_openai, "/v1 streamed": streamed}


async def _measure(requests: int, warmup: int) -> dict[str, list[float]]:
    import aiohttp

    with tempfile.TemporaryDirectory() as tmp, panel_process(0.0) as urls:
        proc, base = await _serve(_config(Path(tmp), urls))
        try:
            async with aiohttp.ClientSession() as session:
                kinds = _requests(session, base)
                times: dict[str, list[float]] = {name: [] for name in kinds}
                for index in range(warmup + requests):
                    for name, send in kinds.items():  # interleaved: drift hits both alike
                        started = time.perf_counter()
                        await send()
                        if index >= warmup:
                            times[name].append((time.perf_counter() - started) * 1000)
            return times
        finally:
            proc.terminate()
            await proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=200, help="measured requests of each kind")
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured requests of each kind first")
    opts = parser.parse_args()
    times = asyncio.run(_measure(opts.requests, opts.warmup))
    print(f"K=3 council (confer + review + synthesis) at 0 ms model latency, {opts.requests} requests each")
    for name, values in times.items():
        print(f"  {name:<13} p50 {percentile(values, 50):7.2f} ms   p95 {percentile(values, 95):7.2f} ms")
    diff = percentile(times["/v1 council"], 50) - percentile(times["mcp confer"], 50)
    verdict = "within" if diff <= GOAL_MS else "over"
    print(f"  /v1 - mcp at p50: {diff:+.2f} ms ({verdict} the {GOAL_MS:.0f} ms goal)")


if __name__ == "__main__":
    main()
