"""State shared through a real Redis (docs/deploying.md#what-is-shared): two replicas, each a
runtime of its own with its own connection, see one breaker, one egress budget, one concurrency
limit and one claim on a session id; Redis going away and coming back loses nothing."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import yaml
from aiohttp import web

from conclave.app.catalog import Invocation
from conclave.app.runtime import Runtime, open_runtime
from conclave.app.server.handlers import run_list_providers
from conclave.app.sim import SimPanel
from conclave.core.errors import BreakerOpen, ConfigError, ProviderError, SessionInFlight
from conclave.core.messages import CompletionRequest
from conclave.deliberation.confer import confer
from conclave.net.http import MemoryTransport
from conclave.schema.config import Config, load_config
from conclave.state.redis_backend import RedisState, Unavailable
from tests.redis_server import RedisServer
from tests.server_support import panel_config
from tests.support import provider_entry, read_events

pytestmark = pytest.mark.anyio

ENTRY = provider_entry("openai", "m-p", "https://api.openai.com/v1", api_key_env=None)
ANSWER = {
    "choices": [{"message": {"content": "fine"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}


class Upstream(MemoryTransport):
    """A provider both replicas call: counts requests and those in flight; fails while told."""

    def __init__(self, *, delay: float = 0.0) -> None:
        self.failing = True
        self.delay = delay
        self.requests = 0
        self.in_flight = 0
        self.most_in_flight = 0
        super().__init__(self._answer)

    async def _answer(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await anyio.sleep(self.delay)
        finally:
            self.in_flight -= 1
        if self.failing:
            return httpx.Response(503, json={"error": {"message": "unavailable"}})
        return httpx.Response(200, json=ANSWER)


def shared_config(make_config: Callable[..., Config], redis: RedisServer, **sections: Any) -> Config:
    return make_config(
        {"p": ENTRY},
        retry={"max_attempts": 1},
        env={"CONCLAVE_REDIS_URL": redis.url},
        state={"backend": "redis", "namespace": "t", **sections.pop("state", {})},
        **sections,
    )


async def ask(runtime: Runtime) -> str:
    client = runtime.providers.get("p")
    completion = await client.complete(CompletionRequest.ask("q"), deadline=anyio.current_time() + 10)
    return completion.text


async def eventually(condition: Callable[[], bool], seconds: float = 5.0) -> None:
    with anyio.fail_after(seconds):
        while not condition():
            await anyio.sleep(0.02)


async def test_a_breaker_opened_by_one_replica_fails_fast_on_the_other(
    make_config: Callable[..., Config], redis_server: RedisServer, events_path: Path
) -> None:
    config = shared_config(make_config, redis_server, breakers={"failure_threshold": 2})
    upstream = Upstream()
    async with (
        open_runtime(config, transport=upstream) as one,
        open_runtime(config, transport=upstream) as two,
    ):
        assert isinstance(one.state, RedisState) and one.state.link.up
        with pytest.raises(ProviderError):
            await ask(one)
        with pytest.raises(ProviderError):
            await ask(two)  # the second consecutive failure, counted with the first one's
        await eventually(lambda: one.providers.get("p").breaker.state == "open")
        await eventually(lambda: two.providers.get("p").breaker.state == "open")
        sent = upstream.requests
        for replica in (one, two):
            with pytest.raises(BreakerOpen, match="circuit breaker open after 2 consecutive failures"):
                await ask(replica)
        assert upstream.requests == sent == 2, "an open breaker sends nothing, on either replica"
    opened = [e for e in read_events(events_path) if e["event"] == "breaker_open"]
    assert len(opened) == 1 and opened[0]["consecutive_failures"] == 2, "opened once, by one replica"


async def test_after_the_cooldown_one_trial_goes_through_for_both_replicas(
    make_config: Callable[..., Config], redis_server: RedisServer, events_path: Path
) -> None:
    config = shared_config(
        make_config, redis_server, breakers={"failure_threshold": 1, "cooldown_seconds": 1}
    )
    upstream = Upstream(delay=0.3)
    async with (
        open_runtime(config, transport=upstream) as one,
        open_runtime(config, transport=upstream) as two,
    ):
        with pytest.raises(ProviderError):
            await ask(one)
        await eventually(lambda: two.providers.get("p").breaker.state == "half_open", 5)
        upstream.failing = False
        outcomes: list[str] = []

        async def attempt(replica: Runtime) -> None:
            try:
                outcomes.append(await ask(replica))
            except BreakerOpen:
                outcomes.append("refused")

        async with anyio.create_task_group() as group:
            group.start_soon(attempt, one)
            group.start_soon(attempt, two)
        assert sorted(outcomes) == ["fine", "refused"], "exactly one trial across the replicas"
        assert upstream.requests == 2
        await eventually(lambda: one.providers.get("p").breaker.state == "closed")
        await eventually(lambda: two.providers.get("p").breaker.state == "closed")
        assert await ask(two) == "fine"
    kinds = [e["event"] for e in read_events(events_path) if e["event"].startswith("breaker_")]
    assert kinds == ["breaker_open", "breaker_closed"]


async def breakers_listed(runtime: Runtime) -> dict[str, str]:
    """What `list_providers` reports for each provider's breaker, as a client sees it."""
    listed = await run_list_providers({}, Invocation(runtime.tool_context, runtime))
    return {provider["name"]: provider["breaker"] for provider in listed["providers"]}


async def listed_eventually(runtime: Runtime, state: str, seconds: float = 5.0) -> None:
    with anyio.fail_after(seconds):
        while (await breakers_listed(runtime))["p"] != state:
            await anyio.sleep(0.02)


async def test_a_replica_that_never_called_a_provider_reports_and_enforces_its_breaker_as_redis_has_it(
    make_config: Callable[..., Config], redis_server: RedisServer
) -> None:
    config = shared_config(make_config, redis_server, breakers={"failure_threshold": 2})
    upstream = Upstream()
    async with open_runtime(config, transport=upstream) as one:
        opener = one.providers.get("p").breaker
        for _ in range(2):
            await opener.record_failure()
        assert (await breakers_listed(one))["p"] == "open"
        # A replica that starts now has never read this breaker: its first answer, and its first
        # call, must already be Redis's, not a mirror's "closed" that nothing has read yet.
        async with open_runtime(config, transport=upstream) as two:
            assert (await breakers_listed(two))["p"] == "open"
            with pytest.raises(BreakerOpen, match="after 2 consecutive failures"):
                await ask(two)
            assert upstream.requests == 0, "refused without a request, on the replica that never called"
            await opener.record_success()
            await listed_eventually(two, "closed")
            upstream.failing = False
            assert await ask(two) == "fine"


async def test_list_providers_follows_a_breaker_another_replica_opens_and_closes(
    make_config: Callable[..., Config], redis_server: RedisServer
) -> None:
    config = shared_config(make_config, redis_server, breakers={"failure_threshold": 1})
    upstream = Upstream()
    async with (
        open_runtime(config, transport=upstream) as one,
        open_runtime(config, transport=upstream) as two,
    ):
        assert (await breakers_listed(two))["p"] == "closed"
        with pytest.raises(ProviderError):
            await ask(one)
        await listed_eventually(two, "open")
        await one.providers.get("p").breaker.record_success()
        await listed_eventually(two, "closed")
    assert upstream.requests == 1, "the replica that reports never called the provider"


async def test_the_concurrency_limit_holds_across_replicas(
    make_config: Callable[..., Config], redis_server: RedisServer
) -> None:
    config = shared_config(
        make_config, redis_server, limits={"max_concurrency": 4, "retry": {"max_attempts": 1}}
    )
    upstream = Upstream(delay=0.2)
    upstream.failing = False
    async with (
        open_runtime(config, transport=upstream) as one,
        open_runtime(config, transport=upstream) as two,
        anyio.create_task_group() as group,
    ):
        for index in range(12):
            group.start_soon(ask, one if index % 2 else two)
    assert upstream.requests == 12
    assert upstream.most_in_flight == 4, "never more than the limit in flight, whichever replica asks"


async def test_a_dead_replicas_slots_come_back_after_its_lease(
    make_config: Callable[..., Config], redis_server: RedisServer
) -> None:
    config = shared_config(
        make_config,
        redis_server,
        limits={"max_concurrency": 2, "retry": {"max_attempts": 1}},
        state={"lease_seconds": 1},
    )
    upstream = Upstream()
    upstream.failing = False
    async with open_runtime(config, transport=upstream) as replica:
        assert isinstance(replica.state, RedisState)
        link = replica.state.link
        # A replica that took both slots and died: its lease is all that is left of it.
        held = await link.run(
            "slots", (link.key("slots", "held"), link.key("slots", "leases")), ("dead", 2, 2, 2, 1000)
        )
        assert held == 2
        started = anyio.current_time()
        assert await ask(replica) == "fine"
        waited = anyio.current_time() - started
    assert waited >= 0.5, "the slot came only when the dead replica's lease ran out"


async def test_one_egress_budget_per_session_whichever_replica_fetches(
    make_config: Callable[..., Config], redis_server: RedisServer, events_path: Path
) -> None:
    async def page(_request: web.Request) -> web.Response:
        return web.Response(text="<p>evidence</p>", content_type="text/html")

    app = web.Application()
    app.router.add_get("/", page)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    config = shared_config(
        make_config,
        redis_server,
        fetch={"allow_private": ["127.0.0.1/32"], "allow_ports": [port], "session_max_requests": 3},
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        async with open_runtime(config) as one, open_runtime(config) as two:
            for replica in (one, two, one):
                result = await replica.call_tool("fetch", {"url": url, "session_id": "s-shared"})
                assert result["status"] == 200
            with pytest.raises(Exception, match="egress budget exhausted: 3 of 3 requests"):
                await two.call_tool("fetch", {"url": url, "session_id": "s-shared"})
            other = await two.call_tool("fetch", {"url": url, "session_id": "s-other"})
            assert other["status"] == 200, "another session has a budget of its own"
    finally:
        await runner.cleanup()
    exhausted = [e for e in read_events(events_path) if e["event"] == "egress_budget_exhausted"]
    assert [(e["requests"], e["max_requests"]) for e in exhausted] == [(3, 3)]


@pytest.fixture
async def panel() -> AsyncIterator[SimPanel]:
    async with SimPanel(latency_ms=300) as running:
        yield running


def panel_shared_config(panel: SimPanel, tmp_path: Path, redis: RedisServer, **extra: Any) -> Config:
    path = panel_config(panel, tmp_path, state={"backend": "redis", "namespace": "t"}, **extra)
    return load_config(str(path), env={"CONCLAVE_REDIS_URL": redis.url}, dotenv=None)


async def test_a_session_id_runs_once_at_a_time_across_replicas(
    panel: SimPanel, tmp_path: Path, redis_server: RedisServer
) -> None:
    config = panel_shared_config(panel, tmp_path, redis_server)
    arguments = {"question": "Which?", "session_id": "s-mine"}
    async with open_runtime(config) as one, open_runtime(config) as two:
        refused: list[BaseException] = []

        async def second() -> None:
            await anyio.sleep(0.1)
            try:
                await confer(two, arguments)
            except SessionInFlight as exc:
                refused.append(exc)

        async with anyio.create_task_group() as group:
            group.start_soon(second)
            first = await confer(one, arguments)
        assert not first.degraded
        assert len(refused) == 1 and "still running" in str(refused[0])
        again = await confer(two, arguments)  # once it ended, the id is free again
        assert again.session_id == "s-mine"


async def test_redis_restarting_in_the_middle_of_a_load_loses_nothing(
    panel: SimPanel, tmp_path: Path, redis_server: RedisServer
) -> None:
    config = panel_shared_config(panel, tmp_path, redis_server)
    results: list[Any] = []
    async with open_runtime(config) as replica:

        async def one_call(index: int) -> None:
            await anyio.sleep(index * 0.05)
            results.append(await confer(replica, {"question": f"q{index}"}))

        async with anyio.create_task_group() as group:
            for index in range(40):
                group.start_soon(one_call, index)
            await anyio.sleep(0.5)
            await anyio.to_thread.run_sync(redis_server.stop)
            await anyio.sleep(1.0)
            await anyio.to_thread.run_sync(redis_server.start)
        assert isinstance(replica.state, RedisState)
        await eventually(lambda: replica.state.link.up, 5)  # type: ignore[union-attr]
    assert len(results) == 40
    assert all(not r.degraded and len(r.answers) == 3 for r in results), "every call answered in full"
    events = read_events(tmp_path / "events.ndjson")
    ends = [e for e in events if e["event"] == "session_end"]
    assert len(ends) == 40 and {e["status"] for e in ends} == {"ok"}
    assert len(list((tmp_path / "transcripts").rglob("*.json"))) == 40, "every transcript written"
    outages = [e["event"] for e in events if e["event"].startswith("state_backend_")]
    assert outages == ["state_backend_unavailable", "state_backend_restored"], "one event per outage"


async def test_connections_idle_through_a_redis_restart_cost_no_second_outage(
    make_config: Callable[..., Config], redis_server: RedisServer, events_path: Path
) -> None:
    config = shared_config(make_config, redis_server)
    async with open_runtime(config) as replica:
        assert isinstance(replica.state, RedisState)
        link = replica.state.link

        async def together() -> None:
            """Commands at once, each on a connection of the pool's, as calls in a burst take them."""

            async def one(index: int) -> None:
                with contextlib.suppress(Unavailable):  # as a call would: it goes on locally
                    await link.command("SET", f"t:together:{index}", "1")

            async with anyio.create_task_group() as group:
                for index in range(4):
                    group.start_soon(one, index)

        await together()
        await anyio.to_thread.run_sync(redis_server.restart)
        await eventually(lambda: not link.up)  # the maintenance loop found it gone
        await eventually(lambda: link.up)
        await together()
        await together()
        assert link.up
    outages = [e["event"] for e in read_events(events_path) if e["event"].startswith("state_backend_")]
    assert outages == ["state_backend_unavailable", "state_backend_restored"], "one restart, one outage"


PASSWORD = "rds-canary-7f3a9c1e5b"


def test_a_password_in_the_url_works_and_is_never_shown(tmp_path: Path) -> None:
    from tests.test_cli import conclave

    server = RedisServer(tmp_path, password=PASSWORD)
    server.start()
    try:
        (tmp_path / "config.yaml").write_text(
            yaml.safe_dump({"state": {"backend": "redis"}}), encoding="utf-8"
        )
        # the simulated panel: every provider in use answers, so only the state can fail
        good = conclave("doctor", "--simulated", cwd=tmp_path, env={"CONCLAVE_REDIS_URL": server.url})
        wrong = server.url.replace(PASSWORD, PASSWORD[::-1])
        bad = conclave("doctor", "--simulated", cwd=tmp_path, env={"CONCLAVE_REDIS_URL": wrong})
    finally:
        server.stop()
    state_line = next(line for line in good.stdout.splitlines() if line.startswith("state:"))
    assert "reachable" in state_line and ":***@127.0.0.1" in state_line, state_line
    assert good.returncode == 0, good.stdout + good.stderr
    assert bad.returncode == 1 and "UNREACHABLE" in bad.stdout and "AuthenticationError" in bad.stdout
    log = (tmp_path / ".conclave" / "events.ndjson").read_text(encoding="utf-8")
    assert '"state_backend_unavailable"' in log, "the wrong password is an outage, on local state"
    for text in (good.stdout, good.stderr, bad.stdout, bad.stderr, log):
        assert PASSWORD not in text and PASSWORD[::-1] not in text


def test_a_password_in_the_config_file_is_refused_naming_the_variable(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        yaml.safe_dump({"state": {"backend": "redis", "redis_url": f"redis://:{PASSWORD}@127.0.0.1:6379/0"}})
    )
    with pytest.raises(ConfigError, match="CONCLAVE_REDIS_URL") as refused:
        load_config(str(path), env={}, dotenv=None)
    assert PASSWORD not in str(refused.value)


def test_the_redis_backend_without_a_url_is_refused_naming_the_variable(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"state": {"backend": "redis"}}))
    with pytest.raises(
        ConfigError, match="no Redis is named: set the environment variable CONCLAVE_REDIS_URL"
    ):
        load_config(str(path), env={}, dotenv=None)
    from_env = load_config(str(path), env={"CONCLAVE_REDIS_URL": "redis://127.0.0.1:1/0"}, dotenv=None)
    assert from_env.state.redis_url == "redis://127.0.0.1:1/0"


async def test_redis_away_from_the_start_is_an_outage_not_an_error(
    panel: SimPanel, tmp_path: Path, events_path: Path
) -> None:
    closed = "redis://127.0.0.1:9/0"  # the discard port: nothing answers on loopback
    path = panel_config(panel, tmp_path, state={"backend": "redis"}, telemetry={"path": str(events_path)})
    config = load_config(str(path), env={"CONCLAVE_REDIS_URL": closed}, dotenv=None)
    async with open_runtime(config) as replica:
        ok, line = await replica.state.health()
        result = await confer(replica, {"question": "Which?", "session_id": "s-local"})
    assert not ok and "UNREACHABLE" in line
    assert not result.degraded and [a.status for a in result.answers] == ["ok", "ok", "ok"]
    outages = [e for e in read_events(events_path) if e["event"] == "state_backend_unavailable"]
    assert len(outages) == 1 and outages[0]["fallback"] == "local state of this replica"
