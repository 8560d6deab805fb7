"""How much of a deliberation's input the providers could read from their prompt caches, from
the requests themselves (docs/providers.md#prompt-caching): for every request after a provider's
first in a session, the share of its prompt that is a byte-identical prefix of an earlier request
to the same provider; and what the input would cost with those prefixes billed at the cached
rate, against all of it at the full rate.

Run: .venv/bin/python -m bench.caching [--context-tokens 20000]

Two calls against the simulated panel (over loopback HTTP; replies scripted):
- a 2-round `coordinate` on a 4-member panel (proposer, two critics, synthesizer) with a context
  of about `--context-tokens` tokens; again with a critic as the synthesizer (the shipped roles
  cast it so), whose synthesis then reads the task from the critic's cache; and
- a K=5 `confer` with review; and
- a K=5 `confer` followed up twice (`follow_up_of`): each member is sent the thread's history
  first, so each follow-up starts with what the provider was sent, and wrote, the turn before.
A request's prompt is what the provider caches, in its order: tools, system prompt, messages.
Anthropic's first request bills its prompt up to the breakpoint as a cache write (1.25 x).
Tokens are estimated as characters / 4 on both sides of each ratio, so the shares are
provider-independent. Prices are the rate card's for each simulated member.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from conclave.app.runtime import open_runtime
from conclave.app.sim import Reply, Rule, Scenario, SimPanel
from conclave.app.sim.caching import MIN_CACHED_TOKENS, common_prefix, comparable_prompt, marked_chars
from conclave.app.sim.simulated import SIMULATED_MEMBERS
from conclave.core.messages import Usage
from conclave.deliberation import review
from conclave.deliberation.confer import confer
from conclave.deliberation.coordinate import coordinate
from conclave.schema.config import PriceConfig, load_config

PRICES = {kind: price for kind, _model, price in SIMULATED_MEMBERS.values()}
PROPOSAL = {"proposal": "Use PostgreSQL with read replicas.", "rationale": "Transactions.", "confidence": 0.7}
REVISE = {"verdict": "revise", "issues": [{"severity": "major", "description": "Size the replicas."}]}
SYNTHESIS = {"answer": "PostgreSQL with two read replicas.", "confidence": 0.8}
COORDINATE = {"prop": "openai", "crit-a": "anthropic", "crit-b": "gemini", "synth": "anthropic"}
CONFER = {"m1": "openai", "m2": "anthropic", "m3": "gemini", "m4": "openai", "m5": "anthropic"}


def measure(requests: Sequence[tuple[str, str, dict[str, Any]]]) -> dict[str, float]:
    """`requests`: (provider, kind, wire body) in the order sent. The repeated share of the
    prompts after each provider's first, and the input bill with and without cached reads."""
    seen: dict[str, list[str]] = {}
    later = repeated = 0
    with_cache = without_cache = 0.0
    for provider, kind, body in requests:
        prompt = comparable_prompt(kind, body)
        earlier = seen.setdefault(provider, [])
        hit = max((common_prefix(prompt, old) for old in earlier), default=0)
        if earlier:
            later, repeated = later + len(prompt), repeated + hit
        price: PriceConfig = PRICES[kind]
        tokens, cached = len(prompt) / 4, hit / 4
        written = _written(kind, body, hit) / 4  # Anthropic bills a cache write
        with_cache += (
            (tokens - cached - written) * price.input_per_mtok
            + cached * _rate(price.cached_input_per_mtok, price)
            + written * _rate(price.cache_write_per_mtok, price)
        ) / 1e6
        without_cache += tokens * price.input_per_mtok / 1e6
        earlier.append(prompt)
    return {
        "share": repeated / later if later else 0.0,
        "later_tokens": later / 4,
        "bill_with_cache": with_cache,
        "bill_without_cache": without_cache,
    }


def _rate(rate: float | None, price: PriceConfig) -> float:
    return price.input_per_mtok if rate is None else rate


def _written(kind: str, body: dict[str, Any], hit: int) -> int:
    """Characters an Anthropic request writes to the cache: its prompt from what it read up to
    its last breakpoint (nothing under the 1,024-token minimum)."""
    marked = marked_chars(body) if kind == "anthropic" else 0
    return max(0, marked - hit) if marked >= MIN_CACHED_TOKENS * 4 else 0


def _config(panel: SimPanel, members: dict[str, str], workdir: Path, roles: dict[str, Any]) -> Any:
    providers = {
        name: {
            "kind": kind,
            "model": f"m-{name}",
            "base_url": panel.base_url(kind),  # type: ignore[arg-type]
            "price": {k: v for k, v in dataclasses.asdict(PRICES[kind]).items() if v is not None},
        }
        for name, kind in members.items()
    }
    data = {
        "providers": providers,
        "panel": list(members),
        "roles": roles,
        "telemetry": {"enabled": False},
        "transcripts": {"enabled": False},
    }
    path = workdir / "caching.yaml"
    path.write_text(json.dumps(data), encoding="utf-8")
    return load_config(str(path), env={}, dotenv=None)


Requests = list[tuple[str, str, dict[str, Any]]]


async def _coordinate(
    context_tokens: int, workdir: Path, synthesizer: str, *, caching: bool = False
) -> tuple[Requests, Usage]:
    """The debate's requests, and its usage and cost as the panel reports them (with each
    provider's caching rule played when `caching`)."""
    async with SimPanel(caching=caching) as panel:
        panel.set_scenario("m-prop", Scenario(replies=(Reply(text=json.dumps(PROPOSAL)),)))
        for critic in ("crit-a", "crit-b"):
            panel.set_scenario(f"m-{critic}", Scenario(replies=(Reply(text=json.dumps(REVISE)),)))
        panel.set_scenario("m-synth", Scenario(replies=(Reply(text=json.dumps(SYNTHESIS)),)))
        panel.set_scenario(
            "m-crit-a",
            Scenario(
                replies=(Reply(text=json.dumps(REVISE)),),
                rules=(Rule("Write the final answer to the task", Reply(text=json.dumps(SYNTHESIS))),),
            ),
        )
        roles = {"proposer": "prop", "critics": ["crit-a", "crit-b"], "synthesizer": synthesizer}
        context = ("The ledger records every payment, refund and fee, with its account. " * 10_000)[
            : context_tokens * 4
        ]
        async with open_runtime(_config(panel, COORDINATE, workdir, roles)) as runtime:
            args = {"task": "Choose the ledger's database.", "context": context, "rounds": 2}
            result = await coordinate(runtime, args)
        if result.degraded:
            raise RuntimeError(f"a degraded run is no measurement: {result.degraded_reasons}")
        return [(r.model[2:], COORDINATE[r.model[2:]], r.body) for r in panel.received], result.usage


async def _confer(workdir: Path) -> list[tuple[str, str, dict[str, Any]]]:
    async with SimPanel() as panel:
        session_id = "bench-caching-confer"
        for name in CONFER:
            shown = [m for m in CONFER if m != name]
            labels = [label for label, _ in review.shuffled(session_id, name, shown)]
            envelope = {"ranking": labels, "notes": {}, "confidence": 0.5}
            rules = (Rule("Rank every one of these labels", Reply(text=json.dumps(envelope))),)
            answer = Reply(text=f"{name}: option 2, because it is cheaper to run. " * 20)
            panel.set_scenario(f"m-{name}", Scenario(replies=(answer,), rules=rules))
        roles = {"proposer": "m1", "critics": ["m2"], "synthesizer": "m2"}
        async with open_runtime(_config(panel, CONFER, workdir, roles)) as runtime:
            question = {"question": "Which queue should we use?", "review": True, "session_id": session_id}
            result = await confer(runtime, question)
        if result.degraded:
            raise RuntimeError(f"a degraded run is no measurement: {result.degraded_reasons}")
        return [(r.model[2:], CONFER[r.model[2:]], r.body) for r in panel.received]


async def _thread(workdir: Path, *, caching: bool = False, turns: int = 3) -> tuple[Requests, Usage]:
    """A confer and its follow-ups (`follow_up_of`), each answer about 1,500 tokens: each turn's
    prompt starts with the turns before it, which the same provider was sent (or wrote) the turn
    before. Its requests, and its usage and cost as the panel reports them."""
    usage = Usage(cost_usd=0.0)
    async with SimPanel(caching=caching) as panel:
        for name in CONFER:
            answer = Reply(text=f"{name}: option 2, because it is cheaper to run. " * 130)
            panel.set_scenario(f"m-{name}", Scenario(replies=(answer,)))
        roles = {"proposer": "m1", "critics": ["m2"], "synthesizer": "m2"}
        async with open_runtime(_config(panel, CONFER, workdir, roles)) as runtime:
            parent = None
            for turn in range(turns):
                args: dict[str, Any] = {"question": f"Question {turn + 1} about the queue?"}
                if parent is not None:
                    args["follow_up_of"] = parent
                result = await confer(runtime, args)
                if result.degraded:
                    raise RuntimeError(f"a degraded run is no measurement: {result.degraded_reasons}")
                parent, usage = result.session_id, usage + result.usage
        return [(r.model[2:], CONFER[r.model[2:]], r.body) for r in panel.received], usage


async def _run(context_tokens: int) -> dict[str, dict[str, float]]:
    figures: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as workdir:
        for name, synthesizer in (
            ("coordinate, 4 members", "synth"),
            ("coordinate, a critic synthesizes", "crit-a"),
        ):
            requests, uncached = await _coordinate(context_tokens, Path(workdir), synthesizer)
            _, cached = await _coordinate(context_tokens, Path(workdir), synthesizer, caching=True)
            figures[name] = {
                **measure(requests),
                "panel_cost_cached": cached.cost_usd or 0.0,
                "panel_cost_uncached": uncached.cost_usd or 0.0,
                "panel_cached_tokens": float(cached.cached_input_tokens or 0),
            }
        figures["confer with review"] = measure(await _confer(Path(workdir)))
        requests, uncached = await _thread(Path(workdir))
        _, cached = await _thread(Path(workdir), caching=True)
        figures["confer, then 2 follow-ups"] = {
            **measure(requests),
            "panel_cost_cached": cached.cost_usd or 0.0,
            "panel_cost_uncached": uncached.cost_usd or 0.0,
            "panel_cached_tokens": float(cached.cached_input_tokens or 0),
        }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--context-tokens", type=int, default=20_000)
    opts = parser.parse_args()
    figures = anyio.run(_run, opts.context_tokens)
    print(f"prompt caching, from the requests (context: {opts.context_tokens} tokens for coordinate)")
    for name, f in figures.items():
        saved = 1 - f["bill_with_cache"] / f["bill_without_cache"] if f["bill_without_cache"] else 0.0
        print(
            f"  {name:<34} repeated prefix: {f['share']:6.1%} of {f['later_tokens']:,.0f} input tokens after"
            f" each provider's first call; input bill ${f['bill_with_cache']:.4f} with cached reads,"
            f" ${f['bill_without_cache']:.4f} without ({saved:.0%} lower)"
        )
        if "panel_cost_cached" in f:
            print(
                f"  {'':<34} the panel playing each provider's caching rule: {f['panel_cached_tokens']:,.0f}"
                f" cached tokens; the whole call ${f['panel_cost_cached']:.4f}, against"
                f" ${f['panel_cost_uncached']:.4f} without caching"
            )


if __name__ == "__main__":
    main()
