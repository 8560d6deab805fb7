"""`conclave serve --http` with the page on, as a subprocess aimed at a slow-streaming SimPanel, and
a reader of its `/ui/live` stream: for the tests of the page's live text (test_ui_live.py, and
the browser's in test_ui_browser.py)."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson

from conclave.app.sim import Reply, Scenario, SimPanel
from tests.server_support import panel_config

MEMBERS = {"alpha": "m-alpha", "beta": "m-beta", "gamma": "m-gamma"}
ACCEPT = {"accept": "application/json, text/event-stream"}


def long_reply(name: str, words: int = 60) -> str:
    """A reply whose every word says whose it is: `Zebrafinch-alpha-0 Zebrafinch-alpha-1 …`."""
    return " ".join(f"Zebrafinch-{name}-{i}" for i in range(words))


def script_long_replies(panel: SimPanel, *, latency_ms: float, words: int = 60) -> dict[str, str]:
    """Each member answers its long reply after `latency_ms`; returns the replies by member."""
    replies = {name: long_reply(name, words) for name in MEMBERS}
    for name, model in MEMBERS.items():
        panel.set_scenario(model, Scenario(replies=(Reply(text=replies[name], latency_ms=latency_ms),)))
    return replies


def live_config(panel: SimPanel, tmp_path: Path) -> Path:
    return panel_config(panel, tmp_path, server={"ui": True})


@contextlib.contextmanager
def serve_http(config: Path, cwd: Path) -> Iterator[str]:
    """`conclave serve --http 127.0.0.1:0` with `config`; yields its base URL."""
    command = [sys.executable, "-m", "conclave", "serve", "--http", "127.0.0.1:0", "--config", str(config)]
    env = {k: v for k, v in os.environ.items() if k != "CONCLAVE_CONFIG" and not k.endswith("_API_KEY")}
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, cwd=cwd, env=env)
    try:
        assert server.stderr is not None
        line = server.stderr.readline()
        found = re.search(r"http://127\.0\.0\.1:(\d+)/mcp", line)
        assert found and "/ui/" in line, line + (server.stderr.read() if server.poll() is not None else "")
        yield f"http://127.0.0.1:{found[1]}"
    finally:
        server.terminate()
        server.wait(timeout=10)


async def read_sse(http: httpx.AsyncClient, path: str, **headers: str) -> list[tuple[str, Any]]:
    """Every event of a server-sent event stream until it ends (or sends `end`)."""
    events: list[tuple[str, Any]] = []
    async with http.stream("GET", path, headers=headers) as response:
        assert response.status_code == 200, (response.status_code, await response.aread())
        assert response.headers["content-type"].startswith("text/event-stream")
        name, data = "message", []
        async for line in response.aiter_lines():
            if line == "":
                if data:
                    events.append((name, orjson.loads("\n".join(data))))
                if name == "end":
                    break
                name, data = "message", []
            elif line.startswith("event:"):
                name = line[len("event:") :].strip()
            elif line.startswith("data:"):
                value = line[len("data:") :]
                data.append(value[1:] if value.startswith(" ") else value)
    return events


def confer_call(session_id: str, question: str = "Which queue?") -> dict[str, Any]:
    """A `tools/call` of confer with a progress token: its progress goes to the caller's delta
    sink while the page hears the same deltas through the runtime's hub."""
    params = {
        "name": "confer",
        "arguments": {"question": question, "session_id": session_id},
        "_meta": {"progressToken": 1},
    }
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}


def sse_messages(body: str) -> list[Any]:
    return [orjson.loads(line[len("data: ") :]) for line in body.splitlines() if line.startswith("data: ")]


@contextlib.contextmanager
def panel_in_thread(
    tmp_path: Path, *, stream_tokens_per_s: float, latency_ms: float, replies: dict[str, str]
) -> Iterator[Path]:
    """A SimPanel on a loop of its own in another thread (for Playwright's sync tests), each member
    answering its reply in `replies` after `latency_ms`; yields the path of a config aimed at it,
    with the page on."""
    import queue
    import threading

    import anyio
    import anyio.to_thread

    ready: queue.Queue[Path | BaseException] = queue.Queue()
    stop = threading.Event()

    async def run() -> None:
        try:
            async with SimPanel(stream_tokens_per_s=stream_tokens_per_s) as panel:
                for name, model in MEMBERS.items():
                    reply = Reply(text=replies[name], latency_ms=latency_ms)
                    panel.set_scenario(model, Scenario(replies=(reply,)))
                ready.put(live_config(panel, tmp_path))
                await anyio.to_thread.run_sync(stop.wait)
        except BaseException as exc:
            ready.put(exc)
            raise

    thread = threading.Thread(target=anyio.run, args=(run,), daemon=True)
    thread.start()
    try:
        got = ready.get(timeout=30)
        if isinstance(got, BaseException):
            raise got
        yield got
    finally:
        stop.set()
        thread.join(timeout=10)


async def rpc_confer(base: str, session_id: str, question: str = "Which queue?") -> dict[str, Any]:
    """A plain JSON-RPC confer (no progress, so no delta sink of the caller's own)."""
    message = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "confer",
        "params": {"question": question, "session_id": session_id},
    }
    async with httpx.AsyncClient(base_url=base, timeout=60) as http:
        reply = (await http.post("/rpc", json=message)).json()
    result: dict[str, Any] = reply["result"]
    return result
