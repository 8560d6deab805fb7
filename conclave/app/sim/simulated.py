"""Conclave pointed at the built-in simulated panel (one member per wire kind), so `doctor
--simulated`, `demo`, a first Python example and a CLI run against `conclave sim` use the real
adapters with no API key and no network."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Mapping
from types import TracebackType
from typing import TypeVar

from conclave.app.sim.page import page_server
from conclave.app.sim.server import SimPanel
from conclave.schema.config import Config, PriceConfig, ProviderConfig, ProviderKind, RolesConfig, load_config

# name -> (kind, model, rate card borrowed from a real model so costs look realistic)
SIMULATED_MEMBERS: dict[str, tuple[ProviderKind, str, PriceConfig]] = {
    "sim-openai": ("openai", "sim-gpt", PriceConfig(0.4, 1.6, cached_input_per_mtok=0.1)),
    "sim-anthropic": ("anthropic", "sim-claude", PriceConfig(3.0, 15.0, 0.3, 3.75)),
    "sim-gemini": ("gemini", "sim-gemini", PriceConfig(0.3, 2.5, cached_input_per_mtok=0.03)),
}
T = TypeVar("T")


def simulated_config(base: Config, base_urls: dict[str, str]) -> Config:
    """`base` with its providers, panel and roles replaced by the simulated members.

    `base_urls` maps a wire kind to the running panel's base URL for it.
    """
    providers = {
        name: ProviderConfig(
            name=name, kind=kind, model=model, base_url=base_urls[kind], api_key_env=None, price=price
        )
        for name, (kind, model, price) in SIMULATED_MEMBERS.items()
    }
    names = tuple(providers)
    roles = RolesConfig(
        proposer=names[0], critics=names[1:], synthesizer=names[1], synthesizer_fallbacks=(names[0], names[2])
    )
    return dataclasses.replace(
        base,
        providers=providers,
        panel=names,
        roles=roles,
        source=f"{base.source} (providers replaced by the simulated panel)",
    )


def set_options(base_urls: Mapping[str, str]) -> list[str]:
    """The `--set` options that point a `conclave` command at a running simulated panel, over
    whatever configuration it loads: the three members (without prices: cost shows as null), the
    panel made of them, and roles derived from that panel rather than from the file's."""
    options: list[str] = []
    for name, (kind, model, _price) in SIMULATED_MEMBERS.items():
        url = json.dumps(base_urls[kind])  # quoted: an IPv6 host's brackets are YAML syntax
        options += [
            "--set",
            f"providers.{name}={{kind: {kind}, model: {model}, base_url: {url}, api_key_env: null}}",
        ]
    return [*options, "--set", f"panel=[{', '.join(SIMULATED_MEMBERS)}]", "--set", "roles={}"]


def allow_local_page(config: Config, port: int) -> Config:
    """`config` with fetch let through to 127.0.0.1:`port`, and to nothing else private."""
    policy = config.fetch
    fetch = dataclasses.replace(
        policy,
        allow_hosts=(*policy.allow_hosts, "127.0.0.1"),
        allow_private=(*policy.allow_private, "127.0.0.1/32"),
        allow_ports=(*policy.allow_ports, port),
    )
    return dataclasses.replace(config, fetch=fetch)


class SimulatedPanel:
    """The simulated panel and a one-page local web site, to try Conclave with no API key and no
    network; every answer is a labelled, deterministic fake.

        async with conclave.SimulatedPanel() as sim, conclave.Conclave(sim.config) as c:
            result = await c.confer("Which option?", review=True, synthesize=True)
            page = await c.fetch(sim.page_url)

    `config` is `base` (a Config, a path, or None to discover one) with its providers replaced by
    three simulated members, and fetch let through to the page. Unscripted members answer role
    prompts with valid envelopes (critics ask for a revision in round 1 and accept from round 2);
    `panel` is the `SimPanel`, to script them (`panel.set_scenario`).
    """

    def __init__(self, base: Config | str | None = None, *, latency_ms: float = 0.0) -> None:
        self._base = base if isinstance(base, Config) else load_config(base)
        self.panel = SimPanel(latency_ms=latency_ms, role_answers=True)
        self._stack: contextlib.AsyncExitStack | None = None
        self._config: Config | None = None
        self._page_url: str | None = None

    @property
    def config(self) -> Config:
        return self._opened(self._config)

    @property
    def page_url(self) -> str:
        """An HTML page saying how tall the Exampleville lighthouse is."""
        return self._opened(self._page_url)

    async def __aenter__(self) -> SimulatedPanel:
        async with contextlib.AsyncExitStack() as stack:
            panel = await stack.enter_async_context(self.panel)
            port = await stack.enter_async_context(page_server())
            self._config = allow_local_page(simulated_config(self._base, panel.base_urls()), port)
            self._page_url = f"http://127.0.0.1:{port}/lighthouse"
            self._stack = stack.pop_all()  # opened: __aexit__ closes them
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        stack, self._stack, self._config, self._page_url = self._stack, None, None, None
        if stack is not None:
            await stack.__aexit__(kind, exc, tb)

    def _opened(self, value: T | None) -> T:
        if value is None:
            raise RuntimeError(
                "the simulated panel is not running: use `async with SimulatedPanel() as sim:`"
            )
        return value
