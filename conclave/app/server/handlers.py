"""What the tools only the server and the CLI run do (`confer`, `coordinate`, `list_providers`)
and how their results read as text (the MCP `content` block). `catalog.TOOLS` names these
functions; a starting server imports this module in the background with the runtime."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from conclave.app.catalog import Invocation
from conclave.app.doctor import providers_in_use
from conclave.app.runtime import Runtime
from conclave.deliberation.confer import confer
from conclave.deliberation.coordinate import coordinate
from conclave.deliberation.session import default_tool_mode


async def run_confer(args: Mapping[str, Any], invocation: Invocation) -> dict[str, Any]:
    runtime = invocation.require_runtime()
    return (await confer(runtime, args, progress=invocation.progress, deltas=invocation.deltas)).to_dict()


async def run_coordinate(args: Mapping[str, Any], invocation: Invocation) -> dict[str, Any]:
    runtime = invocation.require_runtime()
    return (await coordinate(runtime, args, progress=invocation.progress, deltas=invocation.deltas)).to_dict()


async def run_list_providers(_args: Mapping[str, Any], invocation: Invocation) -> dict[str, Any]:
    runtime = invocation.require_runtime()
    config = runtime.config
    in_use = providers_in_use(config)
    return {
        "providers": [
            {
                "name": name,
                "kind": entry.kind,
                "model": entry.model,
                "api_key_env": entry.api_key_env,
                "key_present": config.key_present(name),
                "in_panel": name in config.panel,
                "roles": _roles_of(runtime, name) if name in in_use else [],
                # As the state backend has it (`current`), not as this replica last saw it: a
                # breaker another replica opened shows here within a second, called here or not.
                "breaker": await runtime.providers.get(name).breaker.current(),
                "price_known": entry.price is not None,
                "tool_mode": default_tool_mode(runtime, name),
            }
            for name, entry in config.providers.items()
        ]
    }


def _roles_of(runtime: Runtime, name: str) -> list[str]:
    roles = runtime.config.roles
    return [
        role
        for role, who in (
            ("proposer", [roles.proposer]),
            ("critic", roles.critics),
            ("synthesizer", [roles.synthesizer, *roles.synthesizer_fallbacks]),
        )
        if name in who
    ]


def render_confer(result: Mapping[str, Any]) -> str:
    lines = [_headline("confer", result)]
    for answer in result.get("answers", []):
        lines.append(f"\n## {answer['provider']} ({answer.get('model') or '?'}) — {answer['status']}")
        lines.append(answer["text"] if answer.get("text") else _error_line(answer))
    if result.get("vote"):
        lines += _vote_lines(result["vote"])
    synthesis = result.get("synthesis") or {}
    if synthesis.get("envelope"):
        lines.append(f"\n## synthesis by {synthesis['provider']}\n{synthesis['envelope'].get('answer')}")
        lines += _decided(synthesis)
    if result.get("plan"):
        lines.append("\nplan: " + orjson.dumps(result["plan"]).decode())
    return "\n".join(lines)


def _vote_lines(vote: Mapping[str, Any]) -> list[str]:
    """The vote as a model reading the text would want it: the consensus, then each field."""
    consensus = vote.get("consensus")
    head = (
        "consensus " + orjson.dumps(consensus).decode()
        if consensus is not None
        else f"no consensus: {vote.get('reason')}"
    )
    lines = [f"\n## vote — {head}"]
    for field in vote.get("fields") or []:
        winner = "a tie" if field.get("winner") is None else orjson.dumps(field["winner"]).decode()
        dissent = ", ".join(
            f"{d['provider']} {orjson.dumps(d['value']).decode()}" for d in field.get("dissent") or []
        )
        lines.append(
            f"- {field['field']}: {winner} ({field['votes']} of {field['of']})"
            + (f"; dissent: {dissent}" if dissent else "")
        )
    if vote.get("not_counted"):
        lines.append(f"- not counted (no valid answer): {', '.join(vote['not_counted'])}")
    return lines


def render_coordinate(result: Mapping[str, Any]) -> str:
    lines = [_headline("coordinate", result)]
    synthesis = result.get("synthesis") or {}
    envelope = synthesis.get("envelope")
    if envelope:
        lines.append(f"\n## synthesis by {synthesis['provider']} (confidence {envelope.get('confidence')})")
        lines.append(str(envelope.get("answer")))
        lines += _decided(synthesis)
        for point in envelope.get("dissent") or []:
            lines.append(f"- dissent: {point}")
    proposal = (result.get("proposal") or {}).get("envelope")
    if proposal:
        lines.append(f"\n## proposal by {result['proposal']['provider']}\n{proposal.get('proposal')}")
    for critique in result.get("critiques", []):
        verdict = (critique.get("envelope") or {}).get("verdict", critique["status"])
        lines.append(f"- critic {critique['provider']}: {verdict}")
    if result.get("plan"):
        lines.append("\nplan: " + orjson.dumps(result["plan"]).decode())
    return "\n".join(lines)


def _decided(synthesis: Mapping[str, Any]) -> list[str]:
    """The synthesis's decided `value`, when the call asked for one with `answer_schema`."""
    if synthesis.get("value") is None:
        return []
    return ["decided: " + orjson.dumps(synthesis["value"]).decode()]


def _headline(tool: str, result: Mapping[str, Any]) -> str:
    usage = result.get("usage") or {}
    cost = usage.get("cost_usd")
    head = f"{tool} session {result.get('session_id')}: cost {'unknown' if cost is None else f'${cost:.6f}'}"
    if result.get("degraded"):
        reasons = ", ".join(f"{r['provider']} {r['status']}" for r in result.get("degraded_reasons", []))
        head += f" — DEGRADED ({reasons})"
    return head


def _error_line(answer: Mapping[str, Any]) -> str:
    error = answer.get("error") or {}
    return f"[{error.get('code', answer['status'])}] {error.get('message', '')}"


def render_providers(result: Mapping[str, Any]) -> str:
    return "\n".join(
        f"{p['name']}: {p['kind']} {p['model']} key={'yes' if p['key_present'] else 'no'} "
        f"panel={'yes' if p['in_panel'] else 'no'} breaker={p['breaker']} tools={p['tool_mode']}"
        for p in result["providers"]
    )
