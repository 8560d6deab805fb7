"""What tool handlers are handed: the config, the shared HTTP client, the event log, and the
state that outlives one call (egress budgets per session, from the state backend; breakers
per fetched host, which stay this process's own)."""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio
import httpx

from conclave.core.breaker import CircuitBreaker, Clock
from conclave.core.budgets import EgressBudget
from conclave.obs.telemetry import Telemetry
from conclave.schema.config import Config
from conclave.state.base import StateBackend
from conclave.state.memory import MemoryState

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Awaitable[list[IPAddress]]]


async def system_resolver(host: str, port: int) -> list[IPAddress]:
    """Every address the system resolver gives for `host` (resolved in a worker thread)."""
    infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    found: list[IPAddress] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%")[0])
        if address not in found:
            found.append(address)
    return found


@dataclass(slots=True)
class ToolContext:
    config: Config
    http: httpx.AsyncClient
    telemetry: Telemetry
    resolver: Resolver = system_resolver
    clock: Clock = time.monotonic
    state: StateBackend | None = None  # None: this process's memory
    _host_breakers: dict[str, CircuitBreaker] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        if self.state is None:
            self.state = MemoryState(self.config, clock=self.clock)

    def egress(self, session_id: str | None) -> EgressBudget:
        """The session's egress budget (docs/tools.md#fetch), shared by replicas with the Redis
        backend."""
        assert self.state is not None
        return self.state.egress(session_id)

    def host_breaker(self, host: str) -> CircuitBreaker:
        breaker = self._host_breakers.get(host)
        if breaker is None:
            breakers = self.config.breakers
            breaker = self._host_breakers[host] = CircuitBreaker(
                host,
                subject="host",
                failure_threshold=breakers.failure_threshold,
                cooldown_seconds=breakers.cooldown_seconds,
                clock=self.clock,
            )
        return breaker
