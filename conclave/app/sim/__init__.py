"""The simulated panel: a scripted HTTP fake of OpenAI, Anthropic and Gemini.

Start it with `async with SimPanel() as panel:` (or `python -m conclave.app.sim`), point
adapters at `panel.base_url(kind)`, and script each model with a `Scenario`. With
`role_answers=True` (the standalone panel's default), a model nobody scripted answers
Conclave's role prompts with valid envelopes (`roles.py`). With an `Oracle` (`oracle.py`), members
answer the questions it knows right at configured accuracies, their errors partly correlated.
"""

from conclave.app.sim.oracle import Oracle, OracleItem
from conclave.app.sim.recording import ReceivedRequest, mask_secret
from conclave.app.sim.scenarios import NativeCall, Reply, Rule, Scenario
from conclave.app.sim.server import SimPanel

__all__ = [
    "NativeCall",
    "Oracle",
    "OracleItem",
    "ReceivedRequest",
    "Reply",
    "Rule",
    "Scenario",
    "SimPanel",
    "mask_secret",
]
