"""The simulated panel: a scripted HTTP fake of OpenAI, Anthropic and Gemini.

Start it with `async with SimPanel() as panel:` (or `python -m conclave.sim`), point
adapters at `panel.base_url(kind)`, and script each model with a `Scenario`. With
`role_answers=True` (the standalone panel's default), a model nobody scripted answers
Conclave's role prompts with valid envelopes (`roles.py`).
"""

from conclave.sim.recording import ReceivedRequest, mask_secret
from conclave.sim.scenarios import NativeCall, Reply, Rule, Scenario
from conclave.sim.server import SimPanel

__all__ = ["NativeCall", "ReceivedRequest", "Reply", "Rule", "Scenario", "SimPanel", "mask_secret"]
