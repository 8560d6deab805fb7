"""The garbage-collector policy of a process Conclave owns (`conclave serve`).

CPython's default thresholds suit short scripts, not a server holding hundreds of calls in
flight: a young collection runs every 700 allocations, each call's objects live for the whole
provider round trip, so nearly all of them survive into the oldest generation, and full
collections (which walk every object, the imported modules' included) come often: under load
the collector takes a large share of the server's CPU.

So, once start-up is done, `serving_gc()`:
- freezes what start-up built (modules, schemas, compiled validators): full collections no
  longer walk it;
- raises the young-generation threshold, so a call's objects usually die (by reference
  counting, at no cost to the collector) before the collector ever looks at them.

Reference cycles are still collected, only later: memory grows a little.
The Python API leaves the host process's collector alone; a host that wants the same can
call `serving_gc()` itself.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 20_000  # CPython's default is 700
OLDER_THRESHOLDS = (10, 10)  # CPython's defaults, kept


def serving_gc() -> None:
    """Freeze start-up's objects and raise the young-generation threshold (see the module)."""
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
