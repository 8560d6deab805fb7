"""Native tool calls on the three wires: rendering scripted calls the service's way, and the
checks each service makes of a tool history before it reaches a model (WIRE.md §2-4).

Only rules that are cheap and well known are checked: every call answered in the very next
turn, results that answer no call, and thinking signatures repeated unchanged. The panel signs
what it thinks with a digest of the content, so a signature can be checked without keeping
state: an altered thought, or a signature moved to another part, no longer matches.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from conclave.sim.scenarios import NativeCall

_SIGNING_PREFIX = b"conclave-sim thought:"
_OPENAI_TOOL_CHOICES = frozenset({"none", "auto", "required"})
_ANTHROPIC_TOOL_CHOICES = frozenset({"auto", "any", "tool", "none"})
_GEMINI_MODES = frozenset({"MODE_UNSPECIFIED", "AUTO", "ANY", "NONE", "VALIDATED"})


class Rejected(Exception):
    """A request the service would refuse with a 400: `args[0]` is its message."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def declares_tools(body: Mapping[str, Any]) -> bool:
    tools = body.get("tools")
    return isinstance(tools, list) and bool(tools)


def signature(content: str) -> str:
    """The panel's thinking signature: opaque base64, as the services' are, but derived."""
    return base64.b64encode(hashlib.sha256(_SIGNING_PREFIX + content.encode("utf-8")).digest()).decode()


# ---------------------------------------------------------------------------- rendering


def openai_calls(calls: Sequence[NativeCall], seq: int) -> list[dict[str, Any]]:
    return [
        {
            "id": call.id or f"call_sim{seq:013d}{i:03d}",
            "type": "function",
            "function": {"name": call.name, "arguments": _arguments_text(call.arguments)},
        }
        for i, call in enumerate(calls)
    ]


def anthropic_blocks(
    thinking: str | None, text: str, calls: Sequence[NativeCall], seq: int
) -> list[dict[str, Any]]:
    """Thinking first, then text, then the calls. Claude sends no empty text block."""
    blocks: list[dict[str, Any]] = []
    if thinking is not None:
        blocks.append({"type": "thinking", "thinking": thinking, "signature": signature(thinking)})
    if text:
        blocks.append({"type": "text", "text": text})
    for i, call in enumerate(calls):
        call_id = call.id or f"toolu_sim{seq:015d}{i:03d}"
        blocks.append(
            {"type": "tool_use", "id": call_id, "name": call.name, "input": _arguments_object(call)}
        )
    return blocks


def gemini_parts(thinking: str | None, text: str, calls: Sequence[NativeCall]) -> list[dict[str, Any]]:
    """A thought part, text, then functionCall parts; with thinking, the first call (or the text
    when there is no call) carries the thoughtSignature. Gemini gives a call no id of its own."""
    parts: list[dict[str, Any]] = [{"text": thinking, "thought": True}] if thinking is not None else []
    if text:
        parts.append({"text": text})
    for call in calls:
        function_call: dict[str, Any] = {"name": call.name}
        if call.id is not None:
            function_call["id"] = call.id
        arguments = _arguments_object(call)
        if arguments:  # Gemini leaves `args` out of a call without arguments
            function_call["args"] = arguments
        parts.append({"functionCall": function_call})
    signed = next((p for p in parts if "functionCall" in p), None) or (parts[-1] if text else None)
    if thinking is not None and signed is not None:
        signed["thoughtSignature"] = _part_signature(signed)
    return parts


def _arguments_text(arguments: Mapping[str, Any] | str) -> str:
    return arguments if isinstance(arguments, str) else orjson.dumps(dict(arguments)).decode()


def _arguments_object(call: NativeCall) -> Any:
    """Arguments as the object wires carry them: a scripted raw string is decoded as their own
    decoders would (the last duplicate key wins), or sent as it is when it is not JSON."""
    if not isinstance(call.arguments, str):
        return dict(call.arguments)
    try:
        return orjson.loads(call.arguments)
    except orjson.JSONDecodeError:
        return call.arguments


def _part_signature(part: Mapping[str, Any]) -> str:
    signed = {k: v for k, v in part.items() if k != "thoughtSignature"}
    return signature(orjson.dumps(signed, option=orjson.OPT_SORT_KEYS).decode())


# ---------------------------------------------------------------------------- OpenAI


def check_openai(body: Mapping[str, Any], messages: Sequence[Mapping[str, Any]]) -> None:
    _check_openai_declarations(body)
    pending: list[str] = []  # call ids still waiting for their tool message
    asked_at = 0
    for i, message in enumerate(messages):
        if message.get("role") == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in pending:
                raise Rejected(
                    "Invalid parameter: messages with role 'tool' must be a response to a "
                    "preceeding message with 'tool_calls'.",
                    f"messages.[{i}].role",
                )
            pending.remove(call_id)
            continue
        _openai_unanswered(pending, asked_at)
        if message.get("role") == "assistant" and message.get("tool_calls"):
            pending, asked_at = _openai_call_ids(message["tool_calls"], i), i
    _openai_unanswered(pending, asked_at)


def _openai_unanswered(pending: list[str], asked_at: int) -> None:
    if pending:
        raise Rejected(
            "An assistant message with 'tool_calls' must be followed by tool messages responding "
            "to each 'tool_call_id'. The following tool_call_ids did not have response messages: "
            + ", ".join(pending),
            f"messages.[{asked_at}].role",
        )


def _openai_call_ids(calls: Any, i: int) -> list[str]:
    if not isinstance(calls, list):
        raise Rejected(
            f"Invalid type for 'messages[{i}].tool_calls': expected an array.", f"messages.[{i}].tool_calls"
        )
    ids: list[str] = []
    for j, call in enumerate(calls):
        where = f"messages[{i}].tool_calls[{j}]"
        if not isinstance(call, dict) or not isinstance(call.get("id"), str):
            raise Rejected(f"Missing required parameter: '{where}.id'.", where)
        function = call.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
            raise Rejected(
                f"Invalid type for '{where}.function.arguments': expected a string.",
                f"{where}.function.arguments",
            )
        ids.append(call["id"])
    return ids


def _check_openai_declarations(body: Mapping[str, Any]) -> None:
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if tools is None:
        if choice is not None:
            raise Rejected(
                "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
                "tool_choice",
            )
        return
    if not isinstance(tools, list) or not tools:
        raise Rejected(
            "Invalid 'tools': empty array. Expected an array with minimum length 1, "
            "but got an empty array instead.",
            "tools",
        )
    for k, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise Rejected(
                f"Missing required parameter: 'tools[{k}].function.name'.", f"tools[{k}].function.name"
            )
    if isinstance(choice, str) and choice not in _OPENAI_TOOL_CHOICES:
        raise Rejected(
            f"Invalid value: '{choice}'. Supported values are: 'none', 'auto', and 'required'.", "tool_choice"
        )


# ---------------------------------------------------------------------------- Anthropic


def check_anthropic(body: Mapping[str, Any], messages: Sequence[Mapping[str, Any]]) -> None:
    _check_anthropic_declarations(body)
    uses_tools = False
    asked: list[str] = []  # tool_use ids of the previous assistant message
    for i, message in enumerate(messages):
        blocks = [b for b in _blocks(message) if isinstance(b, dict)]
        answered = _anthropic_results(blocks, asked, i)
        missing = [call_id for call_id in asked if call_id not in answered]
        if missing:
            raise Rejected(_anthropic_unanswered(i - 1, missing))
        asked = []
        if message.get("role") == "assistant":
            _check_thinking(blocks, i)
            asked = [str(b.get("id")) for b in blocks if b.get("type") == "tool_use"]
        uses_tools = uses_tools or bool(asked) or bool(answered)
    if asked:
        raise Rejected(_anthropic_unanswered(len(messages) - 1, asked))
    if uses_tools and not declares_tools(body):
        raise Rejected("Requests which include `tool_use` or `tool_result` blocks must define tools.")


def _blocks(message: Mapping[str, Any]) -> list[Any]:
    content = message.get("content")
    return content if isinstance(content, list) else []


def _anthropic_results(blocks: list[dict[str, Any]], asked: list[str], i: int) -> list[str]:
    answered: list[str] = []
    for j, block in enumerate(blocks):
        if block.get("type") != "tool_result":
            continue
        call_id = block.get("tool_use_id")
        if call_id not in asked:
            raise Rejected(
                f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result` blocks: "
                f"{call_id}. Each `tool_result` block must have a corresponding `tool_use` block in "
                "the previous message."
            )
        answered.append(call_id)
    return answered


def _anthropic_unanswered(i: int, ids: list[str]) -> str:
    return (
        f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately after: "
        f"{', '.join(ids)}. Each `tool_use` block must have a corresponding `tool_result` block in "
        "the next message."
    )


def _check_thinking(blocks: list[dict[str, Any]], i: int) -> None:
    for j, block in enumerate(blocks):
        if block.get("type") != "thinking":
            continue
        if not isinstance(block.get("signature"), str):
            raise Rejected(f"messages.{i}.content.{j}.thinking.signature: Field required")
        if block["signature"] != signature(str(block.get("thinking"))):
            raise Rejected(f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block")


def _check_anthropic_declarations(body: Mapping[str, Any]) -> None:
    tools = body.get("tools")
    for k, tool in enumerate(tools if isinstance(tools, list) else []):
        for key in ("name", "input_schema"):
            if not isinstance(tool, dict) or key not in tool:
                raise Rejected(f"tools.{k}.custom.{key}: Field required")
    choice = body.get("tool_choice")
    if choice is not None and (
        not isinstance(choice, dict) or choice.get("type") not in _ANTHROPIC_TOOL_CHOICES
    ):
        tag = choice.get("type") if isinstance(choice, dict) else choice
        raise Rejected(
            f"tool_choice: Input tag '{tag}' found using 'type' does not match any of the expected "
            "tags: 'auto', 'any', 'tool', 'none'"
        )


# ---------------------------------------------------------------------------- Gemini


def check_gemini(body: Mapping[str, Any], contents: Sequence[Mapping[str, Any]]) -> None:
    _check_gemini_declarations(body)
    previous_calls = 0
    for content in contents:
        parts = [p for p in _parts(content) if isinstance(p, dict)]
        responses = sum(1 for p in parts if "functionResponse" in p)
        if responses != previous_calls and (responses or previous_calls):
            raise Rejected(
                "Please ensure that the number of function response parts is equal to the number "
                "of function call parts of the function call turn."
            )
        previous_calls = 0
        if content.get("role") == "model":
            _check_thought_signatures(parts)
            previous_calls = sum(1 for p in parts if "functionCall" in p)
    if previous_calls:
        raise Rejected(
            "Please ensure that the number of function response parts is equal to the number "
            "of function call parts of the function call turn."
        )


def _parts(content: Mapping[str, Any]) -> list[Any]:
    parts = content.get("parts")
    return parts if isinstance(parts, list) else []


def _check_thought_signatures(parts: list[dict[str, Any]]) -> None:
    """A signature must sit unchanged on the part it came with; a turn that thought must keep
    the signature of its first call."""
    for part in parts:
        sig = part.get("thoughtSignature")
        if sig is not None and sig != _part_signature(part):
            raise Rejected("Thought signature is not valid.")
    calls = [p for p in parts if "functionCall" in p]
    if calls and any(p.get("thought") for p in parts) and "thoughtSignature" not in calls[0]:
        name = calls[0]["functionCall"].get("name") if isinstance(calls[0]["functionCall"], dict) else ""
        raise Rejected(
            "Function call is missing a thought_signature in functionCall parts. This is required "
            "for tools to work correctly, and missing thought_signature may lead to degraded model "
            f"performance. Additional data, function call `default_api:{name}` , position "
            f"{parts.index(calls[0]) + 1}. Please refer to "
            "https://ai.google.dev/gemini-api/docs/thought-signatures for more details."
        )


def _check_gemini_declarations(body: Mapping[str, Any]) -> None:
    tools = body.get("tools")
    for k, tool in enumerate(tools if isinstance(tools, list) else []):
        declarations = tool.get("functionDeclarations") if isinstance(tool, dict) else None
        for d, declaration in enumerate(declarations if isinstance(declarations, list) else []):
            if not isinstance(declaration, dict) or not declaration.get("name"):
                where = f"tools[{k}].function_declarations[{d}]"
                raise Rejected(f"* GenerateContentRequest.{where}.name: Name cannot be empty.")
    config = body.get("toolConfig")
    calling = config.get("functionCallingConfig") if isinstance(config, dict) else None
    mode = calling.get("mode") if isinstance(calling, dict) else None
    if mode is not None and mode not in _GEMINI_MODES:
        raise Rejected(
            "Invalid value at 'tool_config.function_calling_config.mode' "
            f'(type.googleapis.com/google.ai.generativelanguage.v1beta.FunctionCallingConfig.Mode), "{mode}"'
        )
