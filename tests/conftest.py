"""Shared fixtures. Tests cannot reach the real network: any connection or name lookup
outside loopback fails the test at once."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from conclave.app.sim import SimPanel
from conclave.schema.config import Config, load_config
from conclave.schema.schemas import first_error
from tests.redis_server import RedisServer

_LOCAL_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


def _is_loopback(host: Any) -> bool:
    if not isinstance(host, str):
        return True  # unix sockets and the like
    if host in _LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


@pytest.fixture(autouse=True)
def _no_real_network(monkeypatch: pytest.MonkeyPatch) -> None:
    real_connect = socket.socket.connect
    real_getaddrinfo = socket.getaddrinfo

    def guarded_connect(self: socket.socket, address: Any) -> Any:
        host = address[0] if isinstance(address, tuple) else address
        if not _is_loopback(host):
            pytest.fail(f"test tried to reach the real network: {address!r}")
        return real_connect(self, address)

    def guarded_getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host is not None and not _is_loopback(host if isinstance(host, str) else host.decode()):
            raise socket.gaierror(socket.EAI_NONAME, f"network disabled in tests: {host!r}")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", guarded_connect)
    monkeypatch.setattr(socket, "getaddrinfo", guarded_getaddrinfo)


@pytest.fixture
def anyio_backend() -> str:
    # The aiohttp transport and the simulated panel run on asyncio.
    return "asyncio"


@pytest.fixture
def write_config(tmp_path: Path) -> Callable[[dict[str, Any]], Path]:
    """Write a config dict as YAML into the test's directory and return its path."""

    def write(data: dict[str, Any], name: str = "config.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(data), encoding="utf-8")
        return path

    return write


@pytest.fixture
def events_path(tmp_path: Path) -> Iterator[Path]:
    """The test's event log; after the test every line must match its schema in schemas/events."""
    path = tmp_path / "events.ndjson"
    yield path
    if path.exists():
        for number, line in enumerate(path.read_bytes().splitlines(), 1):
            event = orjson.loads(line)
            error = first_error(f"events/{event.get('event')}.json", event)
            assert error is None, f"event line {number} breaks its schema: {error.message}: {event}"


@pytest.fixture
def make_config(write_config: Callable[[dict[str, Any]], Path], events_path: Path) -> Callable[..., Config]:
    """A validated Config with the given providers, retry/breaker settings and environment."""

    def make(
        providers: dict[str, dict[str, Any]],
        *,
        env: dict[str, str] | None = None,
        retry: dict[str, Any] | None = None,
        breakers: dict[str, Any] | None = None,
        **sections: Any,
    ) -> Config:
        data: dict[str, Any] = {
            # An entry named like a preset (`openai`) would take the preset's key variable over:
            # here an entry without one needs none, as the test wrote it.
            "providers": {name: {"api_key_env": None, **entry} for name, entry in providers.items()},
            "panel": list(providers),
            "limits": {
                "retry": {
                    "max_attempts": 3,
                    "initial_delay_seconds": 0.01,
                    "max_delay_seconds": 0.05,
                    **(retry or {}),
                }
            },
            "breakers": {"failure_threshold": 3, "cooldown_seconds": 30, **(breakers or {})},
            "telemetry": {"path": str(events_path)},
            **sections,
        }
        return load_config(str(write_config(data)), env=env or {}, dotenv=None)

    return make


class FakeClock:
    """A controllable clock; `sleep` advances it instead of waiting."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A real Redis on a loopback port for the test; skipped (loudly) where none is installed."""
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def panel() -> AsyncIterator[SimPanel]:
    """The simulated panel on loopback, started for one test (a module may define its own)."""
    async with SimPanel() as sim:
        yield sim
