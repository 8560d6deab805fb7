"""Replicas as a user runs them: `conclave serve --http` processes sharing a real Redis, and
`serve --http --workers 2` accepting on one port (docs/deploying.md)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import psutil
import pytest

from conclave.app.sim import Reply, Scenario, SimPanel
from tests.redis_server import RedisServer
from tests.server_support import panel_config
from tests.support import read_events

pytestmark = pytest.mark.anyio

BOUND = re.compile(r"serving MCP on (http://\S+)/mcp")
ACCEPT = {"accept": "application/json, text/event-stream"}
META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
}


class Served:
    """`conclave serve --http 127.0.0.1:0 ...` in a subprocess, and the URL it announced."""

    def __init__(self, config: Path, cwd: Path, *extra: str, env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "conclave",
                "serve",
                "--config",
                str(config),
                "--http",
                "127.0.0.1:0",
                *extra,
            ],
            cwd=cwd,
            env={**os.environ, **(env or {})},
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.process.stderr is not None
        self.lines: list[str] = []
        for line in self.process.stderr:
            self.lines.append(line)
            if found := BOUND.search(line):
                self.url = found.group(1)
                break
        else:
            raise AssertionError(f"the server did not start: {''.join(self.lines)}")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(20)
        finally:
            if self.process.poll() is None:
                self.process.kill()


@pytest.fixture
async def panel() -> AsyncIterator[SimPanel]:
    async with SimPanel(latency_ms=400) as running:
        yield running


@pytest.fixture
def replicas(panel: SimPanel, tmp_path: Path, redis_server: RedisServer) -> Iterator[tuple[Served, Served]]:
    config = panel_config(panel, tmp_path, state={"backend": "redis", "namespace": "replicas"})
    env = {"CONCLAVE_REDIS_URL": redis_server.url}
    one = Served(config, tmp_path, env=env)
    try:
        two = Served(config, tmp_path, env=env)
        try:
            yield one, two
        finally:
            two.stop()
    finally:
        one.stop()


def stateless(method: str, params: dict[str, Any], id: int = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id, "method": method, "params": {**params, "_meta": META}}


async def post(url: str, method: str, params: dict[str, Any], name: str) -> dict[str, Any]:
    headers = {**ACCEPT, "mcp-protocol-version": "2026-07-28", "mcp-method": method, "mcp-name": name}
    async with httpx.AsyncClient(timeout=20) as client:
        reply = await client.post(f"{url}/mcp", json=stateless(method, params), headers=headers)
    body: dict[str, Any] = reply.json()
    assert "result" in body, body
    return body


async def start_task(url: str) -> str:
    call = {"name": "confer", "arguments": {"question": "Which?"}}
    created = await post(url, "tools/call", call, "confer")
    assert created["result"]["resultType"] == "task"
    return str(created["result"]["taskId"])


async def task_on(url: str, task_id: str) -> dict[str, Any]:
    return (await post(url, "tasks/get", {"taskId": task_id}, task_id))["result"]


async def test_a_task_started_on_one_replica_is_followed_on_the_other(
    replicas: tuple[Served, Served], tmp_path: Path
) -> None:
    one, two = replicas
    task_id = await start_task(one.url)
    seen = [await task_on(two.url, task_id)]
    with anyio.fail_after(20):
        while seen[-1]["status"] == "working":
            await anyio.sleep(0.1)
            seen.append(await task_on(two.url, task_id))
    final = seen[-1]
    assert seen[0]["status"] == "working", "the other replica knew the task at once"
    assert final["status"] == "completed"
    answers = final["result"]["structuredContent"]["answers"]
    assert [a["status"] for a in answers] == ["ok", "ok", "ok"]


async def test_a_thread_begun_on_one_replica_goes_on_on_the_other_and_both_speak_openai(
    replicas: tuple[Served, Served],
) -> None:
    """The replicas share the transcripts folder (docs/deploying.md), so a follow-up reaching the
    other one finds its thread, and the other lists the session as a resource; each serves /v1."""
    one, two = replicas

    async def rpc(url: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=30) as client:
            reply = await client.post(
                f"{url}/rpc", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
            )
        body: dict[str, Any] = reply.json()
        assert "result" in body, body
        return dict(body["result"])

    first = await rpc(one.url, "confer", {"question": "Which queue?"})
    second = await rpc(two.url, "confer", {"question": "And then?", "follow_up_of": first["session_id"]})
    assert (second["thread_id"], second["parent"]) == (first["session_id"], first["session_id"])
    listed = await post(two.url, "resources/list", {}, "")
    uris = [r["uri"] for r in listed["result"]["resources"]]
    assert f"conclave://sessions/{first['session_id']}" in uris, "written by the other replica"
    async with httpx.AsyncClient(timeout=30) as client:
        for served in (one, two):
            chat = {"model": "conclave-confer", "messages": [{"role": "user", "content": "Which queue?"}]}
            reply = await client.post(f"{served.url}/v1/chat/completions", json=chat)
            assert reply.status_code == 200, reply.text
            assert reply.json()["choices"][0]["message"]["content"]


async def test_a_task_started_on_one_replica_is_cancelled_through_the_other(
    replicas: tuple[Served, Served], tmp_path: Path
) -> None:
    one, two = replicas
    task_id = await start_task(one.url)
    await anyio.sleep(0.1)
    await post(two.url, "tasks/cancel", {"taskId": task_id}, task_id)
    assert (await task_on(two.url, task_id))["status"] == "cancelled"
    with anyio.fail_after(10):  # the replica running it hears of it and stops the work
        while not [e for e in read_events(tmp_path / "events.ndjson") if e["event"] == "session_end"]:
            await anyio.sleep(0.05)
    ends = [e for e in read_events(tmp_path / "events.ndjson") if e["event"] == "session_end"]
    assert [e["status"] for e in ends] == ["cancelled"]
    assert (await task_on(one.url, task_id))["status"] == "cancelled"


async def rpc(url: str, method: str, params: dict[str, Any] | None = None) -> Any:
    message = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}
    async with httpx.AsyncClient(timeout=20) as client:
        reply = await client.post(f"{url}/rpc", json=message)
    body = reply.json()
    assert "result" in body, body
    return body["result"]


async def breaker_on(url: str, provider: str) -> str:
    listed = await rpc(url, "list_providers")
    return str(next(p["breaker"] for p in listed["providers"] if p["name"] == provider))


async def breaker_shows(url: str, provider: str, state: str, seconds: float = 5) -> None:
    with anyio.fail_after(seconds):
        while await breaker_on(url, provider) != state:
            await anyio.sleep(0.05)


async def test_list_providers_on_a_replica_shows_the_breaker_another_one_opened_and_closed(
    panel: SimPanel, tmp_path: Path, redis_server: RedisServer
) -> None:
    config = panel_config(
        panel,
        tmp_path,
        state={"backend": "redis", "namespace": "breakers"},
        breakers={"failure_threshold": 1, "cooldown_seconds": 3},
    )
    env = {"CONCLAVE_REDIS_URL": redis_server.url}
    one = Served(config, tmp_path, env=env)
    try:
        two = Served(config, tmp_path, env=env)  # only asked list_providers: never calls beta
        try:
            assert await breaker_on(two.url, "beta") == "closed"
            panel.set_scenario("m-beta", Scenario(replies=(Reply(status=500),)))
            assert (await rpc(one.url, "confer", {"question": "Which?"}))["degraded"]
            await breaker_shows(two.url, "beta", "open")
            panel.set_scenario("m-beta", Scenario())  # beta answers again
            await breaker_shows(one.url, "beta", "half_open")  # the cooldown is over
            trial = await rpc(one.url, "confer", {"question": "Which?"})
            assert [a["status"] for a in trial["answers"]] == ["ok", "ok", "ok"]
            await breaker_shows(two.url, "beta", "closed")
        finally:
            two.stop()
    finally:
        one.stop()
    assert panel.calls("m-beta") == 2, "both calls to beta came from the first replica"


def rpc_ok(url: str) -> bool:
    try:
        reply = httpx.post(f"{url}/rpc", json={"jsonrpc": "2.0", "id": 1, "method": "list_providers"})
    except httpx.HTTPError:
        return False
    return reply.status_code == 200 and "providers" in reply.json()["result"]


def wait_for(condition: Callable[[], bool], seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_two_workers_accept_on_one_port_and_a_dead_one_is_replaced(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"telemetry: {{path: {tmp_path / 'events.ndjson'}}}\n", encoding="utf-8")
    served = Served(config, tmp_path, "--workers", "2")
    try:
        assert "(2 worker processes)" in served.lines[-1]
        parent = psutil.Process(served.process.pid)
        workers = parent.children()
        assert len(workers) == 2
        port = int(served.url.rsplit(":", 1)[1])
        clients = [httpx.Client(base_url=served.url, timeout=10) for _ in range(16)]
        try:
            for client in clients:  # a connection each, held open
                reply = client.post("/rpc", json={"jsonrpc": "2.0", "id": 1, "method": "list_providers"})
                assert reply.status_code == 200
            holding = [
                sum(1 for c in worker.net_connections() if c.laddr and c.laddr.port == port and c.raddr)
                for worker in workers
            ]
        finally:
            for client in clients:
                client.close()
        assert sum(holding) == 16 and min(holding) > 0, f"connections spread over both workers: {holding}"
        workers[0].kill()
        assert wait_for(lambda: len([w for w in parent.children() if w.pid != workers[0].pid]) == 2)
        assert wait_for(lambda: rpc_ok(served.url)), "still serving with the replacement"
        everyone = [parent, *parent.children()]
    finally:
        status = served.stop()
    assert status == 0, "Ctrl-C or SIGTERM is how a server is stopped"
    assert not [p for p in everyone if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], "all stopped"


def test_workers_stop_when_their_supervisor_is_killed(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"telemetry: {{path: {tmp_path / 'events.ndjson'}}}\n", encoding="utf-8")
    served = Served(config, tmp_path, "--workers", "2")
    workers = psutil.Process(served.process.pid).children()
    served.process.kill()  # no chance to stop its workers
    served.process.wait(10)
    _gone, alive = psutil.wait_procs(workers, timeout=15)
    assert not alive, "no worker is left serving on its own"
    assert not rpc_ok(served.url)


def test_a_worker_that_keeps_dying_at_once_stops_the_group(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"telemetry: {{path: {tmp_path / 'events.ndjson'}}}\n", encoding="utf-8")
    served = Served(config, tmp_path, "--workers", "2")
    parent = psutil.Process(served.process.pid)
    try:
        for death in range(1, 6):  # the same worker, each time it comes back, before it lived 10 s
            youngest = max(parent.children(), key=lambda worker: worker.create_time())
            youngest.kill()
            born = youngest.create_time()
            if death < 5:
                assert wait_for(lambda born=born: any(w.create_time() > born for w in parent.children()))
        assert served.process.wait(20) == 1
    finally:
        served.stop()
    assert served.process.stderr is not None
    said = served.process.stderr.read()
    assert "times in a row right after starting; stopping" in said


async def test_with_redis_any_worker_answers_for_a_task_another_one_runs(
    panel: SimPanel, tmp_path: Path, redis_server: RedisServer
) -> None:
    config = panel_config(panel, tmp_path, state={"backend": "redis", "namespace": "workers"})
    served = Served(config, tmp_path, "--workers", "2", env={"CONCLAVE_REDIS_URL": redis_server.url})
    try:
        workers = psutil.Process(served.process.pid).children()
        task_id = await start_task(served.url)
        seen = []
        for _ in range(12):  # each on a new connection, which the kernel gives either worker
            seen.append((await task_on(served.url, task_id))["status"])
        with anyio.fail_after(20):
            while seen[-1] == "working":
                await anyio.sleep(0.1)
                seen.append((await task_on(served.url, task_id))["status"])
        busy = [w.cpu_times().user + w.cpu_times().system for w in workers]
    finally:
        served.stop()
    assert set(seen) <= {"working", "completed"} and seen[-1] == "completed", seen
    assert min(busy) > 0, "both workers did work"


def test_a_worker_whose_supervisor_is_already_gone_stops_at_once(tmp_path: Path) -> None:
    """The supervisor may die between a worker's start and its first look at its parent."""
    config = tmp_path / "config.yaml"
    config.write_text(f"telemetry: {{path: {tmp_path / 'events.ndjson'}}}\n", encoding="utf-8")
    gone = subprocess.Popen(["true"])
    gone.wait()
    served = Served(config, tmp_path, f"--worker-of={gone.pid}")
    assert served.process.wait(15) == 0, "no worker is left serving on its own"
