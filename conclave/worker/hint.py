"""The system-prompt hint a worker gets when tools are on, and the tools as declared natively. The
wording is data (`conclave/prompts/worker_tools*.txt`); this module fills it in from the registry."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from pathlib import Path
from string import Template
from typing import Any

import orjson

from conclave.core.messages import ToolDeclaration
from conclave.tools.registry import ToolRegistry

_PROMPTS = Path(__file__).resolve().parent.parent / "prompts"


@cache
def _template(name: str) -> Template:
    return Template((_PROMPTS / name).read_text(encoding="utf-8"))


def tool_hint(registry: ToolRegistry, tools: Sequence[str], *, hop_budget: int, canary: str) -> str:
    """The tag protocol's hint: the rules, the tag syntax and every tool's schema."""
    lines = [_describe(registry, name) for name in tools]
    hint = _template("worker_tools.txt").substitute(
        hop_budget=hop_budget, canary=canary, tools="\n".join(lines)
    )
    return hint.strip()


def native_hint(*, hop_budget: int, canary: str) -> str:
    """The same rules without tag syntax: the tools themselves are declared in the request."""
    return _template("worker_tools_native.txt").substitute(hop_budget=hop_budget, canary=canary).strip()


# What the model may do next, after an answer that imitated tool markup (`imitation_reprompt`).
_NEXT_AFTER_IMITATION = {
    "tags": "If you need a tool, call it now with a tool call tag exactly as the system prompt shows, "
    "then wait for its result. Otherwise answer again in plain prose, without any tool markup.",
    "native": "If you need a tool, call it now through the tools declared with this request (a real "
    "call, not text), then wait for its result. Otherwise answer again in plain prose, without any "
    "tool markup.",
    "final": "No more tool calls can run in this answer: answer again in plain prose with what you "
    "have, without any tool markup.",
}


def imitation_reprompt(*, native: bool, final_round: bool) -> str:
    """The one re-prompt after an answer that imitated tool output: call the tool properly, or
    answer in prose. It names the tags without brackets, so it shows nothing to copy."""
    key = "final" if final_round else "native" if native else "tags"
    return _template("worker_tools_imitation.txt").substitute(next=_NEXT_AFTER_IMITATION[key]).strip()


def declarations(registry: ToolRegistry, tools: Sequence[str]) -> tuple[ToolDeclaration, ...]:
    return tuple(
        ToolDeclaration(name, registry.get(name).description, _model_facing(registry.get(name).input_schema))
        for name in tools
    )


def with_hint(system: str | None, hint: str) -> str:
    return f"{system}\n\n{hint}" if system else hint


def _describe(registry: ToolRegistry, name: str) -> str:
    tool = registry.get(name)
    schema = _model_facing(tool.input_schema)
    return f"- {name}: {tool.description}\n  input schema: {orjson.dumps(schema).decode()}"


def _model_facing(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema without the fields the server fills in (session_id) or that only document it."""
    properties = {k: v for k, v in schema.get("properties", {}).items() if k != "session_id"}
    slim = {k: v for k, v in schema.items() if k not in ("$schema", "$id", "title", "description")}
    return {**slim, "properties": properties}
