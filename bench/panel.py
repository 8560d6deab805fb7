"""The fake provider: Conclave's simulated panel in its own process, at a fixed latency.

It runs as `python -m conclave.app.sim --port 0 --latency-ms L --no-record`, which prints one
`<kind> <base_url>` line per wire format; the scripts the suite needs are then PUT through
the panel's HTTP control API (`/_sim/scenarios/{model}`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

KINDS = ("openai", "anthropic", "gemini")


@contextmanager
def panel_process(latency_ms: float) -> Iterator[dict[str, str]]:
    """Start the panel; yield `{kind: base_url}`; stop it (SIGTERM, then SIGKILL) on exit."""
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "conclave.app.sim", "--port", "0",
            "--latency-ms", str(latency_ms), "--no-record",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        urls: dict[str, str] = {}
        for _ in KINDS:
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the simulated panel exited before listening (status {proc.wait()})")
            kind, url = line.split()
            urls[kind] = url
        yield urls
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def control_url(urls: Mapping[str, str]) -> str:
    parts = urlsplit(urls["openai"])
    return f"{parts.scheme}://{parts.netloc}/_sim"


def put_scenarios(urls: Mapping[str, str], scenarios: Mapping[str, Mapping[str, Any]]) -> None:
    """Script each model through `PUT /_sim/scenarios/{model}`; a refused script is an error."""
    base = control_url(urls)
    for model, scenario in scenarios.items():
        request = urllib.request.Request(
            f"{base}/scenarios/{model}",
            data=json.dumps(scenario).encode(),
            method="PUT",
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            body = json.loads(response.read())
        if not body.get("ok"):
            raise RuntimeError(f"the panel refused the scenario for {model}: {body}")
