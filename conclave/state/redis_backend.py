"""State shared by every replica through Redis (docs/deploying.md#replicas-sharing-state-through-redis).

Nothing here costs a round trip on a provider call's usual path. Each replica keeps a mirror of
the shared breakers (read every `_SYNC_SECONDS`, and from every reply), so a closed breaker is
checked locally; only failures, trials and the success that closes a breaker go to Redis. A
mirror older than `_FRESH_SECONDS` (never read yet, or from before an outage) is read again
before a call or `list_providers` relies on it, so both agree with Redis within a second. The
concurrency limit is held as leases of slots in blocks: a replica takes a block when it runs
out, gives back what it does not use, and renews its lease, so a dead replica's slots come
back after `state.lease_seconds`. Egress budgets, task records and session claims are each one
atomic script or command when they are used.

If Redis cannot be reached, every operation falls back to this replica's own memory at once,
one `state_backend_unavailable` event is written for the outage, and a probe every second
brings the shared state back (`state_backend_restored`)."""

from __future__ import annotations

import contextlib
import math
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import anyio
import anyio.abc
import orjson
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from conclave.core.breaker import BreakerState, CircuitBreaker, Clock, breaker_open
from conclave.core.budgets import EgressBudget, EgressExhausted
from conclave.obs.telemetry import Telemetry
from conclave.schema.config import Config
from conclave.state.base import BreakerListener
from conclave.state.lua import SCRIPTS
from conclave.state.memory import LocalSessions, MemoryState

_SYNC_SECONDS = 0.25  # how stale a replica's view of the shared breakers and cancels may be
# The most a breaker's mirror may lag Redis when a call or `list_providers` relies on it: what
# a replica enforces and reports agrees with Redis within a second (docs/deploying.md).
# Past it the mirror is read again: a replica just started, or back from an outage, has not
# read its mirrors since the last sync, and its "closed" would be a guess.
_FRESH_SECONDS = 1.0
_PROBE_SECONDS = 1.0  # while Redis is away, how often it is tried again
_TICK_SECONDS = 0.1
# Any failure of Redis itself (refused, timed out, a wrong password, a read-only replica after a
# failover, out of memory) is an outage to this replica: it goes on with its own state.
_UNREACHABLE = (RedisError, OSError)


class Unavailable(Exception):
    """Redis could not be reached: the caller uses its local state instead."""


class Link:
    """The connection to Redis and whether it is up. An operation that cannot reach Redis marks
    an outage (one event); until a probe gets through, callers go straight to local state."""

    def __init__(self, client: aioredis.Redis, namespace: str, telemetry: Telemetry) -> None:
        self.client = client
        self.namespace = namespace
        self.replica = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.up = True
        self._telemetry = telemetry
        self._down_since = 0.0
        self._scripts: dict[str, AsyncScript] = {
            name: client.register_script(source) for name, source in SCRIPTS.items()
        }

    def key(self, *parts: str) -> str:
        return ":".join((self.namespace, *parts))

    async def run(self, script: str, keys: Sequence[str], args: Sequence[Any] = ()) -> Any:
        if not self.up:
            raise Unavailable
        try:
            return await self._scripts[script](keys=list(keys), args=list(args))
        except _UNREACHABLE as exc:
            self.lost(exc)
            raise Unavailable from None

    async def command(self, name: str, *args: Any) -> Any:
        if not self.up:
            raise Unavailable
        try:
            return await cast(Callable[..., Awaitable[Any]], self.client.execute_command)(name, *args)
        except _UNREACHABLE as exc:
            self.lost(exc)
            raise Unavailable from None

    async def expire_all(self, keys: Sequence[str], ms: int) -> None:
        """PEXPIRE on every key, in one round trip."""
        if not self.up:
            raise Unavailable
        try:
            async with self.client.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.pexpire(key, ms)
                await pipe.execute()
        except _UNREACHABLE as exc:
            self.lost(exc)
            raise Unavailable from None

    def lost(self, exc: BaseException) -> None:
        if self.up:
            self.up = False
            self._down_since = time.monotonic()
            self._telemetry.emit(
                "state_backend_unavailable",
                backend="redis",
                error=type(exc).__name__,
                detail=str(exc)[:300],
                fallback="local state of this replica",
            )

    async def probe(self) -> bool:
        """Try Redis again; True when it is back (and say so once)."""
        try:
            # A connection left idle in the pool through the outage may lead to a Redis that
            # has since restarted, and the client notices only when a command fails on it: that
            # would be a second outage, right after this one. Nothing uses the idle ones now.
            await self.client.connection_pool.disconnect(inuse_connections=False)
            await self.client.ping()
        except _UNREACHABLE:
            return False
        self.up = True
        self._telemetry.emit(
            "state_backend_restored",
            backend="redis",
            outage_seconds=round(time.monotonic() - self._down_since, 3),
        )
        return True


class SharedBreaker:
    """A provider's breaker in Redis, mirrored here; the local breaker stands in while Redis is
    away. Consecutive failures are counted across replicas; a success after failures, seen by
    this replica's mirror, resets the count."""

    def __init__(
        self, link: Link, local: CircuitBreaker, config: Config, on_change: BreakerListener, clock: Clock
    ) -> None:
        self.name = local.name
        self.keys = (link.key("breaker", self.name), link.key("breaker", self.name, "trial"))
        self._link = link
        self._local = local
        self._on_change = on_change
        self._clock = clock
        settings = config.breakers
        self._threshold = settings.failure_threshold
        self._cooldown_ms = int(settings.cooldown_seconds * 1000)
        self._trial_ms = int(config.limits.retry.attempt_timeout_seconds * 1000) + 1000
        self._ttl_ms = max(self._cooldown_ms * 10, 600_000)
        self._state: BreakerState = "closed"
        self._failures = 0
        self._open_until = 0.0
        self._read_at = -math.inf  # never read: stale, whatever the clock says
        self._reading = anyio.Lock()
        self._trial = False

    @property
    def state(self) -> BreakerState:
        if not self._link.up:
            return self._local.state
        if self._state == "open" and self._clock() >= self._open_until:
            return "half_open"
        return self._state

    def mirror(self, state: Any, failures: Any, left_ms: Any) -> None:
        """Take what Redis just said of this breaker (a read, or the reply to a change)."""
        self._read_at = self._clock()
        self._state = "open" if _text(state) == "open" else "closed"
        self._failures = int(failures)
        self._open_until = self._read_at + int(left_ms) / 1000

    async def current(self) -> BreakerState:
        await self._read_if_stale()
        return self.state

    async def _read_if_stale(self) -> None:
        """One round trip, only when the maintenance loop has not refreshed the mirror lately.
        The calls that find it stale together (a burst as a replica starts) share one read, and
        wait on the lock rather than each taking one of the pool's connections."""
        if not self._stale():
            return
        async with self._reading:
            if self._stale():
                with contextlib.suppress(Unavailable):  # the link is down now: local state answers
                    self.mirror(*await self._link.run("breaker_read", self.keys[:1], (self._cooldown_ms,)))

    def _stale(self) -> bool:
        return self._link.up and self._clock() - self._read_at >= _FRESH_SECONDS

    async def check(self) -> None:
        await self._read_if_stale()
        if self._link.up:
            state = self.state
            if state == "closed":
                return
            if state == "open":  # by the mirror: refused here, without asking Redis
                left = max(self._open_until - self._clock(), 0.0)
                raise breaker_open("provider", self.name, self._failures, left)
            try:
                state, granted, left_ms, failures = await self._link.run(
                    "breaker_trial", self.keys, (self._cooldown_ms, self._trial_ms, self._link.replica)
                )
            except Unavailable:
                pass
            else:
                self.mirror(state, failures, left_ms)
                if granted:
                    self._trial = _text(state) == "half_open"
                    if self._trial:
                        self._on_change(self.name, "half_open", int(failures))
                    return
                raise breaker_open("provider", self.name, int(failures), int(left_ms) / 1000)
        self._local.check()

    async def record_failure(self) -> None:
        if self._link.up:
            try:
                state, failures, left_ms, opened = await self._link.run(
                    "breaker_failure",
                    self.keys,
                    (self._threshold, self._cooldown_ms, self._link.replica, self._ttl_ms),
                )
            except Unavailable:
                pass
            else:
                self._trial = False
                self.mirror(state, failures, left_ms)
                if opened:
                    self._on_change(self.name, "open", int(failures))
                return
        self._local.record_failure()

    async def record_success(self) -> None:
        if self._link.up:
            if self._state == "closed" and self._failures == 0 and not self._trial:
                return  # nothing to reset, as far as this replica has seen
            try:
                previous = await self._link.run("breaker_success", self.keys)
            except Unavailable:
                pass
            else:
                self._trial = False
                self.mirror("closed", 0, 0)
                if _text(previous) != "closed":
                    self._on_change(self.name, "closed", 0)
                return
        self._local.record_success()

    async def release(self) -> None:
        if self._trial and self._link.up:
            self._trial = False
            with contextlib.suppress(Unavailable):
                await self._link.run("breaker_release", self.keys[1:], (self._link.replica,))
            return
        self._local.release()


class SharedSlots:
    """`limits.max_concurrency` provider calls in flight across every replica. The slots are
    leased from Redis in blocks, so a call costs a round trip only when this replica runs out."""

    def __init__(self, link: Link, limit: int, lease_ms: int) -> None:
        self._link = link
        self._limit = limit
        self._lease_ms = lease_ms
        self._block = max(1, limit // 16)
        self._keys = (link.key("slots", "held"), link.key("slots", "leases"))
        self._held = 0
        self._in_use = 0
        self._waiting = 0
        self._last_taken = 0.0
        self._renew_at = 0.0
        self._lock = anyio.Lock()
        self._freed = anyio.Event()

    async def acquire(self, seconds: float) -> None:
        if self._in_use < self._held:
            self._take()
            return
        self._waiting += 1
        try:
            with anyio.fail_after(seconds):
                while self._in_use >= self._held:
                    await self._grow()
                    if self._in_use < self._held:
                        break
                    with anyio.move_on_after(_TICK_SECONDS):  # another replica may free some
                        await self._freed.wait()
        finally:
            self._waiting -= 1
        self._take()

    def release(self) -> None:
        self._in_use -= 1
        self._freed.set()
        self._freed = anyio.Event()

    def _take(self) -> None:
        self._in_use += 1
        self._last_taken = time.monotonic()

    async def _grow(self) -> None:
        async with self._lock:
            if self._in_use < self._held:
                return
            await self._lease(min(self._in_use + self._waiting + self._block, self._limit))

    async def settle(self) -> None:
        """Give back what is not in use (keeping a block while calls are coming), and renew the
        lease in time: from the maintenance loop."""
        now = time.monotonic()
        busy = self._waiting > 0 or now - self._last_taken < 1.0
        wanted = min(self._in_use + (self._block if busy else 0), self._limit)
        if self._held > wanted or (self._held > 0 and now >= self._renew_at):
            async with self._lock:
                await self._lease(wanted)

    async def _lease(self, wanted: int) -> None:
        try:
            self._held = int(
                await self._link.run(
                    "slots",
                    self._keys,
                    (self._link.replica, wanted, self._in_use, self._limit, self._lease_ms),
                )
            )
            self._renew_at = time.monotonic() + self._lease_ms / 3000
        except Unavailable:
            self._held = self._limit  # alone until Redis is back: the limit holds per replica

    async def give_back(self) -> None:
        with contextlib.suppress(Unavailable):
            await self._link.run("slots", self._keys, (self._link.replica, 0, 0, self._limit, self._lease_ms))


@dataclass(slots=True)
class SharedEgress(EgressBudget):
    """A session's egress budget in Redis, whichever replica fetches; the fields are the last
    counts seen, and stand in while Redis is away."""

    link: Link | None = None
    key: str = ""
    ttl_ms: int = 86_400_000

    async def take_request(self) -> None:
        assert self.link is not None
        try:
            taken, self.requests, self.used_bytes = await self.link.run(
                "egress_take", (self.key,), (self.max_requests, self.max_bytes, self.ttl_ms)
            )
        except Unavailable:
            await EgressBudget.take_request(self)
            return
        if not taken:
            self.check_request()  # raises, naming the limit from the counts just read
            raise EgressExhausted("egress budget exhausted")

    async def add_bytes(self, count: int) -> None:
        assert self.link is not None
        try:
            self.requests, self.used_bytes = await self.link.run(
                "egress_bytes", (self.key,), (count, self.ttl_ms)
            )
        except Unavailable:
            self.record_bytes(count)


class SharedTaskBoard:
    def __init__(self, link: Link) -> None:
        self._link = link

    def _key(self, task_id: str) -> str:
        return self._link.key("task", task_id)

    async def publish(self, task_id: str, wire: dict[str, Any], ttl_ms: int) -> None:
        with contextlib.suppress(Unavailable):
            await self._link.run("task_publish", (self._key(task_id),), (orjson.dumps(wire), max(ttl_ms, 1)))

    async def fetch(self, task_id: str) -> dict[str, Any] | None:
        try:
            raw = await self._link.command("GET", self._key(task_id))
        except Unavailable:
            return None
        return _task(raw)

    async def request_cancel(self, task_id: str) -> dict[str, Any] | None:
        now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        key = self._key(task_id)
        try:
            raw = await self._link.run("task_cancel", (key, f"{key}:cancel"), (now,))
        except Unavailable:
            return None
        return _task(raw)

    async def cancelled(self, task_ids: Iterable[str]) -> set[str]:
        ids = list(task_ids)
        if not ids:
            return set()
        try:
            flags = await self._link.command("MGET", *(f"{self._key(i)}:cancel" for i in ids))
        except Unavailable:
            return set()
        return {task_id for task_id, flag in zip(ids, flags, strict=True) if flag is not None}


class SharedSessions:
    """Session ids in flight on any replica, each claimed with an expiring key."""

    def __init__(self, link: Link, lease_ms: int) -> None:
        self._link = link
        self._lease_ms = lease_ms
        self._local = LocalSessions()
        self._claimed: set[str] = set()

    async def claim(self, session_id: str) -> bool:
        if not await self._local.claim(session_id):
            return False
        try:
            won = await self._link.command(
                "SET", self._key(session_id), self._link.replica, "NX", "PX", self._lease_ms
            )
        except Unavailable:
            return True  # this replica's own record stands in
        if not won:
            await self._local.release(session_id)
            return False
        self._claimed.add(session_id)
        return True

    async def release(self, session_id: str) -> None:
        await self._local.release(session_id)
        if session_id in self._claimed:
            self._claimed.discard(session_id)
            with contextlib.suppress(Unavailable):
                await self._link.run("session_release", (self._key(session_id),), (self._link.replica,))

    async def renew(self) -> None:
        """Keep the claims of the calls still running (from the maintenance loop)."""
        if self._claimed:
            with contextlib.suppress(Unavailable):
                await self._link.expire_all([self._key(i) for i in self._claimed], self._lease_ms)

    def _key(self, session_id: str) -> str:
        return self._link.key("session", session_id)


class RedisState:
    name = "redis"

    def __init__(self, config: Config, link: Link, *, clock: Clock, shown_url: str) -> None:
        self._config = config
        self._link = link
        self._clock = clock
        self._shown_url = shown_url
        self._local = MemoryState(config, clock=clock)
        lease_ms = int(config.state.lease_seconds * 1000)
        self.slots = SharedSlots(link, config.limits.max_concurrency, lease_ms)
        self.tasks = SharedTaskBoard(link)
        self.sessions = SharedSessions(link, lease_ms)
        self._breakers: list[SharedBreaker] = []

    @property
    def link(self) -> Link:
        return self._link

    def breaker(self, name: str, on_change: BreakerListener) -> SharedBreaker:
        local = self._local.local_breaker(name, on_change)
        shared = SharedBreaker(self._link, local, self._config, on_change, self._clock)
        self._breakers.append(shared)
        return shared

    def egress(self, session_id: str | None) -> EgressBudget:
        policy = self._config.fetch
        if session_id is None:
            return EgressBudget(policy.session_max_bytes, policy.session_max_requests)
        return SharedEgress(
            policy.session_max_bytes,
            policy.session_max_requests,
            link=self._link,
            key=self._link.key("egress", session_id),
        )

    async def health(self) -> tuple[bool, str]:
        where = f"redis {self._shown_url}, namespace {self._link.namespace!r}"
        try:
            info = await self._link.client.info("server")
        except _UNREACHABLE as exc:
            return (
                False,
                f"{where}: UNREACHABLE ({type(exc).__name__}: {str(exc)[:200]}); calls run on local state",
            )
        return True, f"{where}: reachable (Redis {info.get('redis_version', '?')})"

    async def maintain(self) -> None:
        """Keep the mirrors fresh, the leases renewed and the probe going, for the life of the
        backend."""
        next_sync = next_probe = next_renewal = 0.0
        renew_every = self._config.state.lease_seconds / 3
        while True:
            await anyio.sleep(_TICK_SECONDS)
            now = time.monotonic()
            if not self._link.up:
                if now >= next_probe:
                    next_probe = now + _PROBE_SECONDS
                    await self._link.probe()
                continue
            await self.slots.settle()
            if now >= next_sync:
                next_sync = now + _SYNC_SECONDS
                await self._read_breakers()
            if now >= next_renewal:
                next_renewal = now + renew_every
                await self.sessions.renew()

    async def _read_breakers(self) -> None:
        """Every provider's breaker as Redis has it, in one round trip, into the mirrors."""
        if not self._breakers:
            return
        cooldown_ms = int(self._config.breakers.cooldown_seconds * 1000)
        keys = [breaker.keys[0] for breaker in self._breakers]
        try:
            flat = await self._link.run("breaker_read", keys, (cooldown_ms,))
        except Unavailable:
            return
        for index, breaker in enumerate(self._breakers):
            breaker.mirror(*flat[index * 3 : index * 3 + 3])

    async def close(self) -> None:
        await self.slots.give_back()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _task(raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return None
    value = orjson.loads(raw)
    return value if isinstance(value, dict) else None


@contextlib.asynccontextmanager
async def open_redis_state(
    config: Config, telemetry: Telemetry, *, clock: Clock, url: str, shown_url: str
) -> AsyncIterator[RedisState]:
    """The backend, its maintenance loop running; Redis being away at start is an outage like
    any other, not an error."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=32,
        timeout=2.0,
        socket_connect_timeout=0.5,
        socket_timeout=2.0,
        retry=Retry(NoBackoff(), 0),  # an outage is handled here, at once, not retried away
    )
    client = aioredis.Redis(connection_pool=pool)
    link = Link(client, config.state.namespace, telemetry)
    state = RedisState(config, link, clock=clock, shown_url=shown_url)
    try:
        await client.ping()
    except _UNREACHABLE as exc:
        link.lost(exc)
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(state.maintain)
            try:
                yield state
            finally:
                group.cancel_scope.cancel()
        with anyio.CancelScope(shield=True), anyio.move_on_after(2):
            await state.close()
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(2):
            await client.aclose()


__all__ = ["RedisState", "Unavailable", "open_redis_state"]
