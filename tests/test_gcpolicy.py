"""`conclave serve` tunes the garbage collector once start-up is done; the Python API does not."""

from __future__ import annotations

import json
import subprocess
import sys

from conclave.app.gcpolicy import OLDER_THRESHOLDS, YOUNG_THRESHOLD

PROBE = "import gc, json; print(json.dumps([gc.get_threshold(), gc.get_freeze_count()]))"


def _run(code: str) -> list[object]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    result: list[object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_serving_gc_freezes_start_up_objects_and_raises_the_young_threshold() -> None:
    threshold, frozen = _run(f"import conclave; conclave.serving_gc(); {PROBE}")
    assert threshold == [YOUNG_THRESHOLD, *OLDER_THRESHOLDS]
    assert isinstance(frozen, int) and frozen > 1000, "start-up's objects are left out of collections"


def test_importing_and_using_the_api_leaves_the_host_collector_alone() -> None:
    threshold, frozen = _run(f"import conclave.app.api, conclave.app.runtime; {PROBE}")
    assert threshold == [700, 10, 10]
    assert frozen == 0
