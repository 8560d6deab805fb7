"""The wire kinds Conclave speaks, in one registry. Each kind is one module: its adapter and its
`KindSpec` (what the kind can do); adding a kind is that module, one line here, and its
simulated counterpart (docs/architecture.md#adding-a-wire-kind).

Everything that depends on the kind reads `KINDS`: the adapters the pool hands out, which kinds
call tools natively, the OpenTelemetry provider names. The config's `ProviderKind` and the
schemas' kind enums are checked against it by tests/test_provider_kinds.py."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from conclave.providers import anthropic, gemini, openai
from conclave.providers.base import KindSpec

KINDS: Mapping[str, KindSpec] = MappingProxyType(
    {spec.name: spec for spec in (openai.KIND, anthropic.KIND, gemini.KIND)}
)

__all__ = ["KINDS", "KindSpec"]
