"""The full council's wall time: a K=5 `confer` with review and synthesis against the simulated
panel at a fixed model latency, next to a plain K=5 `confer`, in one run.

Run: .venv/bin/python -m bench.council [--latency-ms 200] [--reps 10]

The three stages are sequential and each is one model latency when its calls run in parallel:
every member answers at once, every member reviews at once, then one chair writes. So the
ideal is three latencies; the figure printed is the median wall time and what it is over
that ideal. The panel runs in-process (its replies are scripted per session so that every
review is valid), over real loopback HTTP.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from conclave.app.runtime import open_runtime
from conclave.app.sim import Reply, Rule, Scenario, SimPanel
from conclave.deliberation import review
from conclave.deliberation.confer import confer
from conclave.schema.config import load_config

MEMBERS = ("m1", "m2", "m3", "m4", "m5")
KINDS = ("openai", "anthropic", "gemini", "openai", "anthropic")
SYNTHESIS = {"answer": "Option 2.", "confidence": 0.8}


def _config(panel: SimPanel, workdir: Path) -> Any:
    providers = {
        name: {"kind": kind, "model": f"model-{name}", "base_url": panel.base_url(kind)}  # type: ignore[arg-type]
        for name, kind in zip(MEMBERS, KINDS, strict=True)
    }
    data = {
        "providers": providers,
        "panel": list(MEMBERS),
        "roles": {"proposer": "m1", "critics": ["m2"], "synthesizer": "m1"},
        "telemetry": {"enabled": False},
        "transcripts": {"enabled": False},
    }
    path = workdir / "council.yaml"
    path.write_text(json.dumps(data), encoding="utf-8")
    return load_config(str(path), env={}, dotenv=None)


def _script(panel: SimPanel, session_id: str) -> None:
    for name in MEMBERS:
        shown = [m for m in MEMBERS if m != name]
        labels = [label for label, _ in review.shuffled(session_id, name, shown)]
        envelope = {"ranking": labels, "notes": {}, "confidence": 0.5}
        rules = (
            Rule("Rank every one of these labels", Reply(text=json.dumps(envelope))),
            Rule("Write the final answer to the question", Reply(text=json.dumps(SYNTHESIS))),
        )
        panel.set_scenario(
            f"model-{name}", Scenario(replies=(Reply(text=f"{name} says option 2."),), rules=rules)
        )


async def _measure(latency_ms: float, reps: int) -> dict[str, list[float]]:
    seconds: dict[str, list[float]] = {"plain": [], "council": []}
    with tempfile.TemporaryDirectory() as workdir:
        async with (
            SimPanel(latency_ms=latency_ms) as panel,
            open_runtime(_config(panel, Path(workdir))) as runtime,
        ):
            for rep in range(reps + 1):  # the first of each is a warm-up
                for kind in ("plain", "council"):
                    session_id = f"bench-{kind}-{rep}"
                    _script(panel, session_id)
                    args: dict[str, Any] = {"question": "Which option?", "session_id": session_id}
                    if kind == "council":
                        args.update(review=True, synthesize=True)
                    started = time.perf_counter()
                    result = await confer(runtime, args)
                    elapsed = time.perf_counter() - started
                    if result.degraded:
                        raise RuntimeError(f"a degraded run is no measurement: {result.degraded_reasons}")
                    if rep:
                        seconds[kind].append(elapsed)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--latency-ms", type=float, default=200.0)
    parser.add_argument("--reps", type=int, default=10)
    opts = parser.parse_args()
    seconds = anyio.run(_measure, opts.latency_ms, opts.reps)
    latency = opts.latency_ms / 1000
    print(f"K=5 confer at {opts.latency_ms:.0f} ms model latency, median of {opts.reps} runs")
    for kind, stages in (("plain", 1), ("council", 3)):
        median = statistics.median(seconds[kind])
        ideal = stages * latency
        print(
            f"  {kind:<8} ({stages} stage{'s' * (stages > 1)}): {median * 1000:7.1f} ms"
            f"  = {stages} x latency + {(median - ideal) * 1000:5.1f} ms"
        )


if __name__ == "__main__":
    main()
