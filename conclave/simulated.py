"""A configuration whose panel is the built-in simulated panel (one member per wire kind),
so `doctor --simulated` (and later `demo`) run the real adapters with no API key."""

from __future__ import annotations

from dataclasses import replace

from conclave.config import Config, PriceConfig, ProviderConfig, ProviderKind, RolesConfig

# name -> (kind, model, rate card borrowed from a real model so costs look realistic)
SIMULATED_MEMBERS: dict[str, tuple[ProviderKind, str, PriceConfig]] = {
    "sim-openai": ("openai", "sim-gpt", PriceConfig(0.4, 1.6, cached_input_per_mtok=0.1)),
    "sim-anthropic": ("anthropic", "sim-claude", PriceConfig(3.0, 15.0, 0.3, 3.75)),
    "sim-gemini": ("gemini", "sim-gemini", PriceConfig(0.3, 2.5, cached_input_per_mtok=0.03)),
}


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
    return replace(
        base,
        providers=providers,
        panel=names,
        roles=roles,
        source=f"{base.source} (providers replaced by the simulated panel)",
    )
