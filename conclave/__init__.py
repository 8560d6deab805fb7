"""Conclave: ask a panel of LLMs at once, or run a proposer -> critics -> synthesizer debate.

import conclave

async with conclave.Conclave() as c:                  # one runtime for many calls
    result = await c.confer("Which option?")         # a ConferResult; .to_dict() is the JSON
    debate = await c.coordinate("Design the cache.")  # a CoordinateResult
result = await conclave.confer("Which option?")      # one-shot; or conclave.confer_sync(...)

async with conclave.SimulatedPanel() as sim:          # offline: simulated models and a local page
    result = await conclave.confer("Which option?", config=sim.config)
"""

from typing import Any

from conclave.core.version import __version__

_API = (
    "Conclave",
    "ConferResult",
    "CoordinateResult",
    "confer",
    "confer_sync",
    "coordinate",
    "coordinate_sync",
)
# what a caller catches: every error is a ConclaveError; bad arguments and a bad config have their own,
# and so does a confer short of its members with on_partial="error"
_ERRORS = ("ConclaveError", "ConfigError", "InvalidArguments", "PartialResult")
__all__ = ["SimulatedPanel", "__version__", *_API, *_ERRORS, "serving_gc"]


def __getattr__(name: str) -> Any:
    # Imported on first use so `import conclave` (and the CLI's start-up) stays light.
    if name in _API:
        from conclave.app import api

        return getattr(api, name)
    if name in _ERRORS:
        from conclave.core import errors

        return getattr(errors, name)
    if name == "SimulatedPanel":  # for trying the API offline (see conclave.app.sim.simulated)
        from conclave.app.sim.simulated import SimulatedPanel

        return SimulatedPanel
    if name == "serving_gc":  # for hosts that serve many calls from one process (see gcpolicy)
        from conclave.app.gcpolicy import serving_gc

        return serving_gc
    raise AttributeError(f"module 'conclave' has no attribute {name!r}")
