"""Provider adapters, one file per wire kind, behind an explicit registry (`kinds.KINDS`), and
the pool that hands out resilient clients (breakers persist for the life of the process)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator

import anyio

from conclave.core.breaker import BreakerState, Clock
from conclave.core.errors import ConfigError
from conclave.net.http import Transport
from conclave.obs.telemetry import Telemetry
from conclave.providers.base import Adapter
from conclave.providers.client import CompletionClient, ProviderClient, Sleep
from conclave.providers.instrumented import InstrumentedProviderClient
from conclave.providers.kinds import KINDS
from conclave.schema.config import Config
from conclave.state import StateBackend
from conclave.state.memory import MemoryState

ADAPTERS: dict[str, Adapter] = {kind: spec.adapter for kind, spec in KINDS.items()}

__all__ = ["ADAPTERS", "CompletionClient", "InstrumentedProviderClient", "ProviderClient", "ProviderPool"]


class ProviderPool:
    """Every configured provider as a `ProviderClient`, sharing one transport, and the
    breakers and concurrency limit of the state backend (this process's memory by default).
    With tracing on, each client is wrapped once, here, in an `InstrumentedProviderClient`."""

    def __init__(
        self,
        config: Config,
        *,
        transport: Transport,
        telemetry: Telemetry,
        state: StateBackend | None = None,
        clock: Clock = time.monotonic,
        sleep: Sleep = anyio.sleep,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.config = config
        self._telemetry = telemetry
        self.state = state or MemoryState(config, clock=clock)
        self._clients: dict[str, CompletionClient] = {
            name: ProviderClient(
                entry,
                ADAPTERS[entry.kind],
                transport=transport,
                api_key=config.api_key(name),
                breaker=self.state.breaker(name, self._breaker_changed),
                retry=config.limits.retry,
                telemetry=telemetry,
                slots=self.state.slots,
                clock=clock,
                sleep=sleep,
                jitter=jitter,
            )
            for name, entry in config.providers.items()
        }
        if telemetry.tracer.recording:  # decided once: with tracing off, calls go straight to the client
            self._clients = {
                name: InstrumentedProviderClient(client, telemetry, clock=clock)
                for name, client in self._clients.items()
            }

    def get(self, name: str) -> CompletionClient:
        try:
            return self._clients[name]
        except KeyError:
            known = ", ".join(sorted(self._clients))
            raise ConfigError(f"provider {name!r} is not configured; use one of: {known}") from None

    def __iter__(self) -> Iterator[CompletionClient]:
        return iter(self._clients.values())

    def _breaker_changed(self, name: str, state: BreakerState, failures: int) -> None:
        self._telemetry.tracer.event(f"breaker_{state}", **{"conclave.provider": name})
        if state == "open":
            self._telemetry.emit(
                "breaker_open",
                provider=name,
                consecutive_failures=failures,
                cooldown_seconds=self.config.breakers.cooldown_seconds,
            )
        elif state == "closed":
            self._telemetry.emit("breaker_closed", provider=name)
