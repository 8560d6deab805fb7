"""Conclave: ask a panel of LLMs at once, or run a proposer -> critics -> synthesizer debate.

import conclave
result = await conclave.confer("Which option?")      # or conclave.confer_sync(...)
debate = await conclave.coordinate("Design the cache.")
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "confer", "confer_sync", "coordinate", "coordinate_sync", "serving_gc"]


def __getattr__(name: str) -> Any:
    # Imported on first use so `import conclave` (and the CLI's start-up) stays light.
    if name in ("confer", "confer_sync", "coordinate", "coordinate_sync"):
        from conclave import api

        return getattr(api, name)
    if name == "serving_gc":  # for hosts that serve many calls from one process (see gcpolicy)
        from conclave.gcpolicy import serving_gc

        return serving_gc
    raise AttributeError(f"module 'conclave' has no attribute {name!r}")
