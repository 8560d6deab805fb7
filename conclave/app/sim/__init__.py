"""The simulated panel: a scripted HTTP fake of OpenAI, Anthropic and Gemini.

Start it with `async with SimPanel() as panel:` (or `python -m conclave.app.sim`), point
adapters at `panel.base_url(kind)`, and script each model with a `Scenario`. With
`role_answers=True` (the standalone panel's default), a model nobody scripted answers
Conclave's role prompts with valid envelopes (`roles.py`).
"""

from conclave.app.sim.recording import ReceivedRequest, mask_secret
from conclave.app.sim.scenarios import NativeCall, Reply, Rule, Scenario
from conclave.app.sim.server import SimPanel

__all__ = ["NativeCall", "ReceivedRequest", "Reply", "Rule", "Scenario", "SimPanel", "mask_secret"]
