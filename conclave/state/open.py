"""Opening the backend the config names."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

from conclave.core.breaker import Clock
from conclave.core.errors import ConfigError
from conclave.obs.telemetry import Telemetry
from conclave.schema.config import Config, redis_backend_problem
from conclave.state.base import StateBackend
from conclave.state.memory import MemoryState


@contextlib.asynccontextmanager
async def open_state(
    config: Config, telemetry: Telemetry, *, clock: Clock = time.monotonic
) -> AsyncIterator[StateBackend]:
    settings = config.state
    if problem := redis_backend_problem(settings.backend, settings.redis_url):  # a Config built in code
        raise ConfigError(problem)
    if settings.backend != "redis" or settings.redis_url is None:
        yield MemoryState(config, clock=clock)
        return
    from conclave.state.redis_backend import open_redis_state

    url = settings.redis_url
    async with open_redis_state(
        config, telemetry, clock=clock, url=url, shown_url=redis_url_shown(url)
    ) as state:
        yield state


def redis_url_shown(url: str) -> str:
    """The URL with any password masked: what logs, errors and `doctor` may print."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(unparsable URL)"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit((parts.scheme, f"{user}:***@{host}{port}", parts.path, parts.query, parts.fragment))
