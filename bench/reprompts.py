"""How often a reply has to be asked for again: role envelopes (`role_envelope_invalid`) and
structured answers (`answer_invalid`), on the real local model (llama.cpp serving SmolLM2-135M,
as `conclave demo --local` runs it) or on the simulated panel.

Run: .venv/bin/python -m bench.reprompts                 (the local model: needs `scripts/setup dev`)
     .venv/bin/python -m bench.reprompts --simulated     (the simulated panel)

Each run makes `--runs` one-round debates (`coordinate`, then a `confer` with review and
synthesis) and `--runs` confers with `--choices`-style answers, at temperature 0 where the
model allows, and prints, per kind of turn, how many turns there were, how many first replies
were invalid (each one re-prompt), and how many stayed invalid after it. To compare two trees,
run this from each (`PYTHONPATH=.` from the tree's root).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

TASKS = (
    "Should a three-person team run its own message queue, or use a managed one?",
    "Pick a primary key type for a new orders table: integer or UUID?",
    "Is it worth adding a cache in front of a database that answers in 5 ms?",
)
CHOICES = ("run our own", "managed", "it depends")


async def _measure(runs: int, simulated: bool, work: Path) -> dict[str, Counter[str]]:
    import conclave
    from conclave.app.demo import LOCAL_PERSONAS, local_config
    from conclave.app.local import PersonaTransport, local_server
    from conclave.schema.answer_schema import choices_schema
    from conclave.schema.config import load_config

    base = _without_files(load_config(None, env={}, dotenv=None), work)
    schema = choices_schema(list(CHOICES))
    counts: dict[str, Counter[str]] = {}
    limits = {"max_tokens": 200, "temperature": 0, "timeout_seconds": 300}

    async def calls(client: Any) -> None:
        for i in range(runs):
            task = TASKS[i % len(TASKS)]
            debate = await client.coordinate(task, **limits)
            _roles(
                counts, [*(t for r in debate.rounds for t in (r.proposal, *r.critiques)), debate.synthesis]
            )
            council = await client.confer(task, review=True, synthesize=True, **limits)
            _roles(counts, [*council.reviewers, council.synthesis])
            decided = await client.confer(task, answer_schema=schema, **limits)
            _answers(counts, decided.answers)

    if simulated:
        async with conclave.SimulatedPanel(base) as sim, conclave.Conclave(sim.config) as client:
            await calls(client)
    else:
        async with local_server() as server:
            config = local_config(base, server.openai_base_url)
            async with conclave.Conclave(config, transport=PersonaTransport(LOCAL_PERSONAS)) as client:
                await calls(client)
    return counts


def _without_files(config: Any, work: Path) -> Any:
    import dataclasses

    telemetry = dataclasses.replace(config.telemetry, path=str(work / "events.ndjson"))
    transcripts = dataclasses.replace(config.transcripts, enabled=False)
    return dataclasses.replace(config, telemetry=telemetry, transcripts=transcripts)


def _roles(counts: dict[str, Counter[str]], turns: Sequence[Any]) -> None:
    for turn in turns:
        if turn is None or turn.attempts == 0:
            continue
        counter = counts.setdefault(turn.role, Counter())
        counter["turns"] += 1
        counter["re-prompts"] += turn.attempts == 2
        counter["still invalid"] += turn.status == "invalid_envelope"


def _answers(counts: dict[str, Counter[str]], answers: Sequence[Any]) -> None:
    counter = counts.setdefault("structured answer", Counter())
    for answer in answers:
        counter["turns"] += 1
        counter["re-prompts"] += answer.hops >= 2 and answer.status in ("ok", "invalid_answer")
        counter["still invalid"] += answer.status == "invalid_answer"


def _report(counts: dict[str, Counter[str]]) -> None:
    print(f"{'turns of':<20}{'turns':>8}{'re-prompts':>12}{'still invalid':>15}")
    for kind, counter in sorted(counts.items()):
        print(f"{kind:<20}{counter['turns']:>8}{counter['re-prompts']:>12}{counter['still invalid']:>15}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.reprompts",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--runs", type=int, default=3, help="debates, councils and structured confers each")
    parser.add_argument("--simulated", action="store_true", help="the simulated panel, not the local model")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="conclave-reprompts-") as work:
        counts = asyncio.run(_measure(args.runs, args.simulated, Path(work)))
    _report(counts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
