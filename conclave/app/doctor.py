"""`conclave doctor`: is the configuration sane, is each key present, does each provider
answer one tiny call? Providers the panel or roles use must pass; the rest are reported."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import anyio

from conclave.app.runtime import Runtime
from conclave.core.errors import ProviderError
from conclave.core.messages import CompletionRequest
from conclave.schema.config import Config

Verdict = Literal["ok", "missing_key", "error"]
PROBE = CompletionRequest.ask("Reply with the single word OK.", max_tokens=16)


@dataclass(frozen=True, slots=True)
class ProviderCheck:
    name: str
    kind: str
    model: str
    in_use: bool
    verdict: Verdict
    detail: str

    @property
    def broken(self) -> bool:
        return self.in_use and self.verdict != "ok"


def providers_in_use(config: Config) -> set[str]:
    roles = config.roles
    return {*config.panel, roles.proposer, *roles.critics, roles.synthesizer, *roles.synthesizer_fallbacks}


async def check_providers(runtime: Runtime, *, timeout_seconds: float) -> list[ProviderCheck]:
    in_use = providers_in_use(runtime.config)
    results: dict[str, ProviderCheck] = {}

    async def probe(name: str) -> None:
        results[name] = await _probe_one(runtime, name, name in in_use, timeout_seconds)

    async with anyio.create_task_group() as tg:
        for name in runtime.config.providers:
            tg.start_soon(probe, name)
    return [results[name] for name in runtime.config.providers]


async def _probe_one(runtime: Runtime, name: str, in_use: bool, seconds: float) -> ProviderCheck:
    entry = runtime.config.providers[name]

    def check(verdict: Verdict, detail: str) -> ProviderCheck:
        return ProviderCheck(name, entry.kind, entry.model, in_use, verdict, detail)

    if not runtime.config.key_present(name):
        return check("missing_key", f"set the environment variable {entry.api_key_env}")
    client = runtime.providers.get(name)
    try:
        completion = await client.complete(PROBE, deadline=anyio.current_time() + seconds)
    except ProviderError as exc:
        return check("error", f"{exc.code}: {exc.message}")
    cost = "cost unknown" if completion.usage.cost_usd is None else f"${completion.usage.cost_usd:.6f}"
    return check("ok", f"answered in {completion.latency_ms:.0f} ms as {completion.model} ({cost})")
