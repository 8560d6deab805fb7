"""The wires the simulated panel speaks, one module per kind as in `conclave/providers/`, behind
one registry: the server routes, parses and renders through `WIRES`. A new kind's counterpart is
its module and one line here; tests/test_provider_kinds.py holds `WIRES` to the providers' kinds.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from conclave.app.sim.kinds import anthropic, gemini, openai
from conclave.app.sim.kinds.base import SimWire

WIRES: Mapping[str, SimWire] = MappingProxyType(
    {w.kind: w for w in (openai.WIRE, anthropic.WIRE, gemini.WIRE)}
)

__all__ = ["WIRES", "SimWire"]
