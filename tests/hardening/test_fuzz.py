"""F7 item 4, fuzzing with Hypothesis: the `<tool_call>` tag parser, the untrusted wrapper, the
JSON-RPC framing and dispatcher (raw bytes through `serve_lines`, arbitrary JSON values through
`Server.handle_message`) and `verify` inputs through the registry.

Every property counts its generated cases; a case that raises is a crash. The final test records
the figures `fuzz: cases` and `fuzz: crashes` (`tests/hardening/figures.py`).

Budget: `CONCLAVE_FUZZ_EXAMPLES` examples per property (default 300: a few seconds in CI). The long
run (9 properties x 25,000 = 225,000 cases, plus at least 20,000 random lines into a real `conclave serve`):

    CONCLAVE_LONG=1 CONCLAVE_FUZZ_EXAMPLES=25000 .venv/bin/pytest tests/hardening/test_fuzz.py

The oracle for the server is JSON-RPC 2.0 itself: every line that is not JSON gets one -32700;
every message that is not a valid request gets one -32600 (with its id when the id is valid);
responses and notifications get nothing; every request gets exactly one reply carrying its id
(a result or an error, never -32603, which would mean an unexpected exception); a batch is
answered by one array holding the replies of its requests. After each case a `ping` must answer.
"""

from __future__ import annotations

import json
import os
import string
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conclave.app.runtime import Runtime, open_runtime
from conclave.app.server.core import Server
from conclave.app.server.stdio import serve_lines
from conclave.core.errors import InvalidArguments
from conclave.core.messages import Message
from conclave.providers.openai import OpenAIAdapter
from conclave.providers.scripted import ScriptedProvider, ScriptedReply
from conclave.schema.config import Config, ProviderConfig
from conclave.schema.schemas import first_error
from conclave.schema.strictjson import tool_arguments
from conclave.worker.loop import WorkerOutcome, WorkerTurn
from conclave.worker.tags import (
    CLOSE,
    MAX_NAME_CHARS,
    MAX_TAG_BYTES,
    OPEN,
    TagError,
    ToolCall,
    find_tool_call,
)
from conclave.worker.untrusted import find_live_markup, wrap_refusal, wrap_result
from tests.hardening.figures import long_run, record

EXAMPLES = int(os.environ.get("CONCLAVE_FUZZ_EXAMPLES", "300"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)
NONCE = "00112233aabbccdd"
LONG_COMMAND = "CONCLAVE_LONG=1 CONCLAVE_FUZZ_EXAMPLES=25000 .venv/bin/pytest tests/hardening/test_fuzz.py"

CASES: Counter[str] = Counter()
CRASHES: Counter[str] = Counter()
REPLIES: Counter[str] = Counter()  # what the server answered to fuzz input, by result or error code


@contextmanager
def case(prop: str) -> Iterator[None]:
    """Count one generated case of `prop`; an exception escaping it is a crash (and re-raised)."""
    CASES[prop] += 1
    try:
        yield
    except BaseException:
        CRASHES[prop] += 1
        raise


# ---------------------------------------------------------------------------------------------
# Strategies
# ---------------------------------------------------------------------------------------------

# What orjson can decode from the wire: 64-bit integers, finite floats, text without lone surrogates.
INTS = st.integers(min_value=-(2**63), max_value=2**64 - 1)
JSON_SCALARS: st.SearchStrategy[Any] = st.one_of(
    st.none(), st.booleans(), INTS, st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=30)
)
JSON = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
HOSTILE = [
    OPEN,
    CLOSE,
    "<tool_result>",
    "</tool_result>",
    '<tool_result name="fetch" nonce="' + NONCE + '">',
    "<untrusted_input>",
    "</untrusted_input>",
    "</UNTRUSTED_INPUT >",
    "＜/untrusted_input＞",
    "</untrusted\u200b_input>",
    "&lt;/untrusted_input&gt;",
    "\\u003c/untrusted_input\\u003e",
    "<|im_start|>",
    "<|eot_id|>",
    "[INST]",
    "<start_of_turn>",
    "<s>",
    "\n\nHuman:",
    '{"name": "fetch", "args": {"url": "https://example.com/"}}',
    '{"name": "verify", "args": {}}',
    "{",
    "}",
    '"',
    "\\",
    "&",
    "&#60;",
    "\u200d",
    "\ufeff",
    "\ud7ff",
]
# Text biased towards the constructs the parser and the wrapper care about.
NOISY = st.lists(st.sampled_from(HOSTILE) | st.text(max_size=12), max_size=12).map("".join)
ANY_TEXT = st.text(max_size=200) | NOISY

NAMES = st.text(
    alphabet=st.characters(categories=["L", "N", "P", "S"], exclude_characters=" "),
    min_size=1,
    max_size=MAX_NAME_CHARS,
)
ARGS = st.dictionaries(st.text(max_size=8), JSON, max_size=4)


# ---------------------------------------------------------------------------------------------
# 1. The tag parser
# ---------------------------------------------------------------------------------------------


def assert_exact_call(text: str, call: ToolCall) -> None:
    assert isinstance(call.name, str) and 0 < len(call.name) <= MAX_NAME_CHARS
    assert call.name.isprintable() and not any(c.isspace() for c in call.name)
    assert type(call.args) is dict
    assert text[call.start : call.end] == call.raw
    assert call.raw.startswith(OPEN) and call.raw.endswith(CLOSE)
    assert len(call.raw.encode("utf-8")) <= MAX_TAG_BYTES
    decoded = json.loads(call.raw[len(OPEN) : -len(CLOSE)])
    assert decoded == {"name": call.name, "args": call.args}
    json.dumps(call.args, ensure_ascii=False).encode("utf-8")  # always encodable downstream


def check_parse(text: str, truncated: bool) -> ToolCall | TagError | None:
    result = find_tool_call(text, truncated=truncated)
    assert result is None or isinstance(result, ToolCall | TagError)
    if isinstance(result, ToolCall):
        assert_exact_call(text, result)
    elif isinstance(result, TagError):
        assert text.startswith(OPEN, result.start)
        assert len(result.excerpt) <= 200 and result.detail
    else:
        assert OPEN not in text or "tool_result" in text.lower() or "untrusted_input" in text.lower()
    return result


@given(ANY_TEXT, st.booleans())
@FUZZ
def test_the_tag_parser_never_raises_on_any_text(text: str, truncated: bool) -> None:
    with case("tags: any text"):
        check_parse(text, truncated)


@given(NOISY | st.text(max_size=60), st.one_of(NOISY, st.text(max_size=60), JSON.map(json.dumps)), NOISY)
@FUZZ
def test_anything_inside_a_tag_never_raises_and_any_call_has_the_exact_shape(
    before: str, body: str, after: str
) -> None:
    with case("tags: tag bodies"):
        check_parse(before + OPEN + body + CLOSE + after, False)
        check_parse(before + OPEN + body, True)


@given(NAMES, ARGS, st.text(max_size=40), st.integers(min_value=0, max_value=200))
@FUZZ
def test_a_valid_call_round_trips_and_any_cut_of_it_is_never_executed(
    name: str, args: dict[str, Any], prose: str, cut: int
) -> None:
    with case("tags: round trip and cuts"):
        body = json.dumps({"name": name, "args": args}, ensure_ascii=False)
        tag = OPEN + body + CLOSE
        if "tool_result" in prose.lower() or "untrusted_input" in prose.lower() or OPEN in prose:
            prose = "prose"
        result = check_parse(prose + tag, False)
        if len(tag.encode("utf-8")) <= MAX_TAG_BYTES:
            assert isinstance(result, ToolCall) and (result.name, result.args) == (name, args)
        cut_text = (prose + tag)[: len(prose) + min(cut, len(tag) - 1)]
        assert not isinstance(check_parse(cut_text, True), ToolCall)


# ---------------------------------------------------------------------------------------------
# 1b. Native tool calls: OpenAI-style argument strings and call shapes
# ---------------------------------------------------------------------------------------------

# Argument strings biased towards what the strict rules refuse: duplicate keys, NaN and Infinity,
# deep nesting, escapes of lone surrogates, non-objects, and the tag protocol's own markup.
ARGUMENT_PIECES = [
    '{"url": "https://example.com/"}',
    '{"a": 1, "a": 2}',
    '{"x": NaN}',
    '{"x": -Infinity}',
    '"\\ud800"',
    '{"s": "\\udc00"}',
    "[" * 30,
    "]" * 30,
    '{"k":' * 25,
    "}" * 25,
    "null",
    "[]",
    "1e400",
    '{"checks": [{"type": "math", "expression": "6*7", "expected": 42}]}',
    OPEN,
    CLOSE,
    ",",
    ":",
    '"',
]
ARGUMENT_TEXT = (
    st.lists(st.sampled_from(ARGUMENT_PIECES) | st.text(max_size=10), max_size=10).map("".join)
    | JSON.map(json.dumps)
    | st.text(max_size=80)
)
TOOL_CALL_SHAPES: st.SearchStrategy[Any] = st.one_of(
    st.fixed_dictionaries(
        {"id": st.none() | st.text(max_size=8), "type": st.just("function")},
        optional={
            "function": st.none()
            | st.fixed_dictionaries(
                {"name": st.none() | NAMES | INTS},
                optional={"arguments": ARGUMENT_TEXT | JSON},
            )
        },
    ),
    JSON,
)


def check_arguments(raw: Any) -> None:
    """`tool_arguments` accepts an object it can round-trip, or says why not; nothing else."""
    arguments, error = tool_arguments(raw)
    if arguments is None:
        assert isinstance(error, str) and error
        return
    assert error is None and isinstance(arguments, dict)
    assert json.loads(json.dumps(arguments, allow_nan=False)) == arguments
    if isinstance(raw, str) and raw:
        assert len(raw.encode("utf-8", "surrogatepass")) <= 16 * 1024


@given(ARGUMENT_TEXT | JSON)
@FUZZ
def test_native_argument_strings_are_accepted_as_objects_or_refused_with_a_reason(raw: Any) -> None:
    with case("native: argument strings"):
        check_arguments(raw)


def openai_reply(tool_calls: Any) -> dict[str, Any]:
    message = {"role": "assistant", "content": None, "tool_calls": tool_calls}
    return {"model": "m", "choices": [{"message": message, "finish_reason": "tool_calls"}]}


@given(st.lists(TOOL_CALL_SHAPES, max_size=4) | JSON)
@FUZZ
def test_any_openai_tool_calls_parse_into_calls_or_a_malformed_response(tool_calls: Any) -> None:
    """The adapter reads any `tool_calls` into calls whose arguments are an object or refused, or
    raises only what the provider client reports as a `malformed_response` (never a crash)."""
    with case("native: openai tool_calls"):
        entry = ProviderConfig("p", "openai", "m", "http://127.0.0.1:9/v1")
        try:
            parsed = OpenAIAdapter().parse(openai_reply(tool_calls), {}, entry)
        except (KeyError, IndexError, TypeError, AttributeError):
            return  # conclave/providers/client.py turns exactly these into MalformedResponse
        for use in parsed.tool_uses:
            assert isinstance(use.id, str) and use.id and isinstance(use.name, str)
            assert (use.arguments is None) == (use.error is not None)


@given(st.lists(ARGUMENT_TEXT, min_size=1, max_size=3))
@settings(FUZZ, max_examples=max(EXAMPLES // 10, 20))  # each example is a whole worker turn
def test_a_worker_refuses_unreadable_native_arguments_and_finishes_its_turn(
    served: Served, argument_strings: list[str]
) -> None:
    """Argument strings as the OpenAI adapter reads them, through a real worker turn: every call
    gets exactly one result; a call whose arguments could not be read is a parse_error refusal
    and never runs; the turn finishes with the model's answer."""
    with case("native: worker turns"):
        entry = ProviderConfig("p", "openai", "m", "http://127.0.0.1:9/v1")
        calls = [
            {"id": f"call-{i}", "type": "function", "function": {"name": "verify", "arguments": raw}}
            for i, raw in enumerate(argument_strings)
        ]
        uses = OpenAIAdapter().parse(openai_reply(calls), {}, entry).tool_uses
        provider = ScriptedProvider("p", [ScriptedReply("", "tool_calls", uses), "Done."])
        out = served.call(_native_turn, served.runtime, provider)
        assert out.error is None and out.text == "Done." and out.tool_mode == "native"
        returned = provider.requests[1].messages[-1].tool_returns
        assert [r.call_id for r in returned] == [u.id for u in uses]
        budget = served.runtime.config.worker_tools.hop_budget
        for hop, (use, record_) in enumerate(zip(uses, out.inner_tool_calls, strict=True), 1):
            if hop > budget:  # past the budget nothing is even read
                assert (record_.status, record_.reason) == ("refused", "hop_budget_exhausted")
            elif use.arguments is None:
                assert (record_.status, record_.reason) == ("refused", "parse_error")
            else:
                assert record_.reason != "parse_error"


async def _native_turn(runtime: Runtime, provider: ScriptedProvider) -> WorkerOutcome:
    turn = WorkerTurn(
        provider=provider,
        messages=(Message("user", "Check it."),),
        deadline=anyio.current_time() + 20,
        session_id="fuzz-native",
        tools=("verify",),
        canary="CANARY-00112233445566ff",
        tool_mode="native",
    )
    return await runtime.worker.run(turn)


# ---------------------------------------------------------------------------------------------
# 2. The untrusted wrapper
# ---------------------------------------------------------------------------------------------


def inner(wrapped: str) -> str:
    head = wrapped.index("<untrusted_input>") + len("<untrusted_input>")
    return wrapped[head : wrapped.rindex("</untrusted_input>")]


@given(ANY_TEXT, st.sampled_from([None, 0, 1, 5, 37, 512]), st.text(max_size=40))
@FUZZ
def test_wrapping_then_scanning_never_finds_a_live_closer_inside(
    content: str, max_bytes: int | None, name: str
) -> None:
    with case("untrusted: wrap then scan"):
        if max_bytes is None:
            wrapped = wrap_result(name, content, nonce=NONCE)
        else:
            wrapped = wrap_result(name, content, nonce=NONCE, max_bytes=max_bytes)
        assert find_live_markup(wrapped) == find_live_markup(wrap_result(name, "", nonce=NONCE))
        body = inner(wrapped)
        assert find_live_markup(body) == []
        assert find_tool_call(body) is None  # a tag inside tool content can never be a call
        assert find_tool_call(wrapped + " and then") is None


@given(st.text(max_size=30), ANY_TEXT, st.dictionaries(st.text(max_size=8), JSON, max_size=3))
@FUZZ
def test_a_refusal_body_is_valid_json_without_live_markup(
    reason: str, detail: str, extra: dict[str, Any]
) -> None:
    with case("untrusted: refusals"):
        wrapped = wrap_refusal("verify", reason, nonce=NONCE, detail=detail, extra=extra)
        assert find_live_markup(wrapped) == find_live_markup(wrap_result("verify", "", nonce=NONCE))
        body = json.loads(inner(wrapped))
        assert body["refused"] is True and isinstance(body["reason"], str)


# ---------------------------------------------------------------------------------------------
# 3. The JSON-RPC framing and dispatcher
# ---------------------------------------------------------------------------------------------


@dataclass
class Served:
    portal: anyio.from_thread.BlockingPortal
    runtime: Runtime
    server: Server

    def call(self, func: Callable[..., Any], *args: Any) -> Any:
        return self.portal.call(func, *args)


@pytest.fixture
def served(make_config: Callable[..., Config], tmp_path: Path) -> Iterator[Served]:
    """One runtime and one Server for a whole property, on an event loop in a portal thread.

    The providers have no key in the environment, so a valid confer/coordinate is answered at
    once (every member `skipped`) and nothing leaves the machine; fetch reaches nothing either
    (the conftest guard refuses every name lookup off loopback, and loopback is private)."""
    providers = {
        name: {
            "kind": kind,
            "model": f"m-{name}",
            "base_url": "http://127.0.0.1:9/v1",
            "api_key_env": f"CONCLAVE_FUZZ_NO_KEY_{name.upper()}",
        }
        for name, kind in (("alpha", "openai"), ("beta", "anthropic"), ("gamma", "gemini"))
    }
    config = make_config(providers, transcripts={"enabled": False, "dir": str(tmp_path / "transcripts")})
    with (
        anyio.from_thread.start_blocking_portal("asyncio") as portal,
        portal.wrap_async_context_manager(open_runtime(config)) as runtime,
    ):
        yield Served(portal, runtime, Server(runtime))


REQUEST_IDS = st.none() | INTS | st.text(max_size=12)
BAD_IDS = st.booleans() | st.floats(allow_nan=False, allow_infinity=False) | st.lists(INTS, max_size=2)
METHODS = [
    "initialize",
    "ping",
    "tools/list",
    "tools/call",
    "confer",
    "coordinate",
    "fetch",
    "verify",
    "list_providers",
    "notifications/initialized",
    "notifications/cancelled",
    "notifications/progress",
    "server/discover",
    "resources/list",
    "",
]
ARG_KEYS = [
    "question",
    "task",
    "url",
    "checks",
    "providers",
    "critics",
    "rounds",
    "dry_run",
    "worker_tools",
    "session_id",
    "timeout_seconds",
    "max_tokens",
    "max_bytes",
]
TOOL_ARGS = st.dictionaries(st.sampled_from(ARG_KEYS) | st.text(max_size=6), JSON, max_size=4)
PLAUSIBLE_ARGS: st.SearchStrategy[dict[str, Any]] = st.one_of(
    st.fixed_dictionaries(
        {"question": st.text(min_size=1, max_size=20)}, optional={"dry_run": st.booleans()}
    ),
    st.fixed_dictionaries({"task": st.text(min_size=1, max_size=20)}, optional={"dry_run": st.booleans()}),
    st.fixed_dictionaries({"url": st.sampled_from(["http://localhost/", "ftp://x/", "http://0/", "x"])}),
    st.fixed_dictionaries(
        {
            "checks": st.lists(
                st.fixed_dictionaries(
                    {
                        "type": st.just("contains"),
                        "text": st.text(max_size=9),
                        "substring": st.text(max_size=3),
                    }
                ),
                min_size=1,
                max_size=2,
            )
        }
    ),
    st.just({}),
)
TOOLS = ["confer", "coordinate", "fetch", "verify", "list_providers"]
TOOL_PARAMS = TOOL_ARGS | PLAUSIBLE_ARGS
PARAMS = st.one_of(
    TOOL_ARGS,
    PLAUSIBLE_ARGS,
    st.fixed_dictionaries(
        {},
        optional={
            "name": st.sampled_from(["confer", "coordinate", "fetch", "verify", "list_providers", "nope"])
            | JSON,
            "arguments": st.one_of(TOOL_ARGS, PLAUSIBLE_ARGS, JSON),
            "_meta": st.fixed_dictionaries({}, optional={"progressToken": REQUEST_IDS | JSON}) | JSON,
            "requestId": REQUEST_IDS | JSON,
            "protocolVersion": st.sampled_from(["2025-11-25", "2024-11-05", "1999-01-01"]) | JSON,
            "cursor": st.text(max_size=20) | JSON,
        },
    ),
    JSON,
)
MESSAGE = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "jsonrpc": st.sampled_from(["2.0", "2.0", "2.0", "1.0"]) | JSON,
            "id": REQUEST_IDS | BAD_IDS,
            "method": st.sampled_from(METHODS) | JSON,
            "params": PARAMS,
            "result": JSON,
            "error": JSON,
        },
    ),
    st.fixed_dictionaries(
        {"jsonrpc": st.just("2.0"), "method": st.sampled_from(METHODS)},
        optional={"id": REQUEST_IDS, "params": PARAMS},
    ),
    st.fixed_dictionaries(
        {
            "jsonrpc": st.just("2.0"),
            "id": REQUEST_IDS,
            "method": st.sampled_from(TOOLS),
            "params": TOOL_PARAMS,
        }
    ),
    st.fixed_dictionaries(
        {
            "jsonrpc": st.just("2.0"),
            "id": REQUEST_IDS,
            "method": st.just("tools/call"),
            "params": st.fixed_dictionaries(
                {"name": st.sampled_from(TOOLS)},
                optional={"arguments": TOOL_PARAMS, "_meta": st.fixed_dictionaries({"progressToken": INTS})},
            ),
        }
    ),
    st.fixed_dictionaries(
        {
            "jsonrpc": st.just("2.0"),
            "method": st.just("notifications/cancelled"),
            "params": st.fixed_dictionaries({}, optional={"requestId": REQUEST_IDS | JSON, "reason": JSON}),
        }
    ),
    JSON,
)
MESSAGES = MESSAGE | st.lists(MESSAGE, max_size=4)

_NO_ID = object()
Signature = tuple[Any, ...]


def _valid_id(value: Any) -> bool:
    return value is None or isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def _key(request_id: Any) -> Any:
    return ("s", request_id) if isinstance(request_id, str) else ("n", request_id)


def expect_one(message: Any) -> Signature | None:
    """What JSON-RPC 2.0 says one message must get back: None (nothing) or a reply signature."""
    if not isinstance(message, dict):
        return ("invalid", _key(None))
    raw_id = message.get("id", _NO_ID)
    reply_id = raw_id if raw_id is not _NO_ID and _valid_id(raw_id) else None
    if message.get("jsonrpc") != "2.0":
        return ("invalid", _key(reply_id))
    if "method" not in message and ("result" in message or "error" in message):
        return None  # a response: we made no request, so it is ignored
    if not isinstance(message.get("method"), str):
        return ("invalid", _key(reply_id))
    if raw_id is not _NO_ID and not _valid_id(raw_id):
        return ("invalid", _key(None))
    params = message.get("params")
    if params is not None and not isinstance(params, dict | list):
        return ("invalid", _key(reply_id))
    if raw_id is _NO_ID:
        return None  # a notification
    return ("answer", _key(raw_id))


def expect_message(message: Any) -> list[Signature]:
    """Replies for one decoded line: zero or one single reply, or one batch signature."""
    if isinstance(message, list):
        if not message:
            return [("invalid", _key(None))]
        items = [s for s in (expect_one(m) for m in message) if s is not None]
        return [("batch", tuple(sorted(items, key=repr)))] if items else []
    one = expect_one(message)
    return [] if one is None else [one]


def expect_line(line: bytes) -> list[Signature]:
    if not line.strip():
        return []
    try:
        message = orjson.loads(line)
    except orjson.JSONDecodeError:
        return [("parse", _key(None))]
    return expect_message(message)


def check_reply_shape(reply: Any) -> Signature:
    """A well-formed JSON-RPC response or error, serializable; returns its signature."""
    assert isinstance(reply, dict), reply
    assert reply.get("jsonrpc") == "2.0", reply
    assert "id" in reply and _valid_id(reply["id"]), reply
    assert ("result" in reply) != ("error" in reply), reply
    assert set(reply) == {"jsonrpc", "id", "result" if "result" in reply else "error"}, reply
    orjson.dumps(reply)
    if "result" in reply:
        REPLIES["result"] += 1
        return ("answer", _key(reply["id"]))
    error = reply["error"]
    REPLIES[str(error.get("code") if isinstance(error, dict) else "?")] += 1
    assert isinstance(error, dict) and set(error) <= {"code", "message", "data"}, reply
    assert type(error["code"]) is int and isinstance(error["message"], str) and error["message"], reply
    assert error["code"] != -32603, f"internal error (an unexpected exception): {reply}"
    if error["code"] == -32700:
        assert reply["id"] is None
        return ("parse", _key(None))
    if error["code"] == -32600:
        return ("invalid", _key(reply["id"]))
    assert error["code"] in (-32601, -32602, -32000), reply
    if error["code"] == -32000:
        assert isinstance(error.get("data"), dict) and isinstance(error["data"].get("reason"), str), reply
    return ("answer", _key(reply["id"]))


def signature_of(reply: Any) -> Signature:
    if isinstance(reply, list):
        assert reply, "an empty array is never a reply"
        return ("batch", tuple(sorted((check_reply_shape(r) for r in reply), key=repr)))
    return check_reply_shape(reply)


def cancel_targets(messages: list[Any]) -> set[Any]:
    """Ids a `notifications/cancelled` in the same case may have cancelled (their reply may be
    missing, legitimately)."""
    targets: set[Any] = set()
    for message in messages:
        for item in message if isinstance(message, list) else [message]:
            if (
                isinstance(item, dict)
                and item.get("method") == "notifications/cancelled"
                and "id" not in item
                and isinstance(item.get("params"), dict)
                and _valid_id(item["params"].get("requestId"))
            ):
                targets.add(_key(item["params"].get("requestId")))
    return targets


def compare(expected: list[Signature], actual: list[Signature], maybe_cancelled: set[Any]) -> None:
    if not maybe_cancelled:
        assert Counter(map(repr, actual)) == Counter(map(repr, expected)), (expected, actual)
        return

    # A cancelled request gets no reply; everything else must match exactly.
    def strip(sig: Signature) -> Signature:
        if sig[0] == "batch":
            return ("batch", tuple(s for s in sig[1] if not (s[0] == "answer" and s[1] in maybe_cancelled)))
        return sig

    keep = [strip(s) for s in expected if not (s[0] == "answer" and s[1] in maybe_cancelled)]
    got = [strip(s) for s in actual if not (s[0] == "answer" and s[1] in maybe_cancelled)]
    keep = [s for s in keep if s != ("batch", ())]
    got = [s for s in got if s != ("batch", ())]
    assert Counter(map(repr, got)) == Counter(map(repr, keep)), (expected, actual)


class MemoryStdio:
    """`read_line`/`write` for serve_lines over in-memory bytes: readline(limit) semantics."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0
        self.written: list[bytes] = []

    async def read_line(self, limit: int) -> bytes:
        await anyio.lowlevel.checkpoint()
        if self.pos >= len(self.data):
            return b""
        newline = self.data.find(b"\n", self.pos, self.pos + limit)
        stop = self.pos + limit if newline < 0 else newline + 1
        chunk = self.data[self.pos : stop]
        self.pos += len(chunk)
        return chunk

    async def write(self, data: bytes) -> None:
        assert data.endswith(b"\n") and data.count(b"\n") == 1, "one message per line"
        self.written.append(data)


PING = b'{"jsonrpc":"2.0","id":"fuzz-ping","method":"ping"}'


def _message_bytes(message: Any) -> bytes:
    return orjson.dumps(message)


def mutate(data: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    """Flip, insert or delete bytes at positions drawn by Hypothesis."""
    out = bytearray(data)
    for kind, where, byte in edits:
        if not out:
            out.append(byte)
            continue
        at = where % len(out)
        if kind == 0:
            out[at] = byte
        elif kind == 1:
            out.insert(at, byte)
        else:
            del out[at]
    return bytes(out)


EDITS = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4
)
LINE = st.one_of(
    st.binary(max_size=80),
    MESSAGES.map(_message_bytes),
    st.tuples(MESSAGES.map(_message_bytes), EDITS).map(lambda pair: mutate(*pair)),
    st.text(max_size=40).map(lambda t: t.encode("utf-8")),
    st.sampled_from([b"", b" ", b"\r", b"\t\r", b"\xef\xbb\xbf{}", b"nul\x00l", b"[" * 2000, b"{" * 1500]),
)
LINES = st.lists(LINE, min_size=1, max_size=5)


def decoded_messages(data: bytes) -> list[Any]:
    out = []
    for line in data.split(b"\n"):
        try:
            out.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            continue
    return out


@given(LINES)
@FUZZ
def test_any_bytes_on_the_stdio_wire_get_well_formed_replies_and_the_server_keeps_serving(
    served: Served, lines: list[bytes]
) -> None:
    with case("jsonrpc: bytes through serve_lines"):
        data = b"\n".join(lines) + b"\n" + PING + b"\n"
        stdio = MemoryStdio(data)
        served.call(lambda: serve_lines(served.server, stdio.read_line, stdio.write))
        expected: list[Signature] = []
        for line in data.split(b"\n"):
            expected += expect_line(line)
        actual: list[Signature] = []
        for raw in stdio.written:
            reply = orjson.loads(raw)
            if isinstance(reply, dict) and reply.get("method") == "notifications/progress":
                assert "id" not in reply
                continue
            actual.append(signature_of(reply))
        assert ("answer", _key("fuzz-ping")) in actual, "the ping after the case was not answered"
        compare(expected, actual, cancel_targets(decoded_messages(data)))


@given(MESSAGES)
@FUZZ
def test_any_json_value_given_to_the_dispatcher_gets_a_well_formed_reply_or_none(
    served: Served, message: Any
) -> None:
    with case("jsonrpc: values through handle_message"):
        notes: list[Any] = []

        async def send(note: Any) -> None:
            orjson.dumps(note)
            notes.append(note)

        reply = served.call(served.server.handle_message, message, send)
        expected = expect_message(message)
        actual = [] if reply is None else [signature_of(reply)]
        compare(expected, actual, cancel_targets([message]))
        for note in notes:
            assert note.get("method") == "notifications/progress" and "id" not in note
        pong = served.call(
            served.server.handle_message, {"jsonrpc": "2.0", "id": "after", "method": "ping"}, send
        )
        assert pong == {"jsonrpc": "2.0", "id": "after", "result": {}}


# ---------------------------------------------------------------------------------------------
# 4. verify inputs
# ---------------------------------------------------------------------------------------------

REGEX_ALPHABET = "ab.*+?()[]{}|^$\\dws0-9,"
MATH_ALPHABET = string.digits + "+-*/%(). e_"


@st.composite
def arithmetic(draw: st.DrawFn, depth: int = 0) -> str:
    if depth >= 4 or draw(st.booleans()):
        number = draw(st.integers(-(10**6), 10**6) | st.floats(-1e6, 1e6, allow_nan=False))
        return repr(number)
    op = draw(st.sampled_from(["+", "-", "*", "/", "//", "%", "**"]))
    return f"({draw(arithmetic(depth + 1))}{op}{draw(arithmetic(depth + 1))})"


NUMBER = INTS | st.floats(allow_nan=False, allow_infinity=False)
SCHEMA_KEYWORDS = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["string", "number", "integer", "object", "array", "null", "boolean"]) | JSON,
        "pattern": st.text(alphabet=REGEX_ALPHABET, max_size=12),
        "minimum": NUMBER,
        "maxLength": st.integers(0, 10),
        "enum": st.lists(JSON, max_size=3),
        "items": st.booleans() | st.just({"type": "integer"}),
        "properties": st.dictionaries(st.text(max_size=4), st.booleans(), max_size=2),
        "required": st.lists(st.text(max_size=4), max_size=2),
        "$ref": st.sampled_from(["#", "#/$defs/x", "https://example.com/s.json", "urn:x", "#/nope"]),
        "$defs": st.just({"x": {"type": "string"}}),
        "$schema": st.sampled_from(
            ["http://json-schema.org/draft-07/schema#", "https://json-schema.org/draft/2020-12/schema", "x"]
        ),
        "format": st.sampled_from(["email", "date-time", "ipv4", "uri", "regex", "bogus"]),
        "uniqueItems": st.booleans(),
    },
)
CHECK = st.one_of(
    st.fixed_dictionaries(
        {
            "type": st.just("regex"),
            "pattern": st.text(alphabet=REGEX_ALPHABET, max_size=20) | st.text(max_size=20),
            "text": st.text(max_size=100),
        },
        optional={
            "expect_match": st.booleans(),
            "flags": st.lists(st.sampled_from(["IGNORECASE", "MULTILINE", "DOTALL"]), unique=True),
        },
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("json_schema"),
            "schema": st.booleans() | SCHEMA_KEYWORDS | JSON.filter(lambda v: isinstance(v, dict)),
            "instance": JSON,
        }
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("math"),
            "expression": arithmetic() | st.text(alphabet=MATH_ALPHABET, min_size=1, max_size=40),
        },
        optional={"expected": NUMBER, "tolerance": st.floats(0, 1e6) | st.integers(0, 10**20)},
    ),
    st.fixed_dictionaries({"type": st.just("equals"), "actual": JSON, "expected": JSON}),
    st.fixed_dictionaries(
        {"type": st.just("contains"), "text": st.text(max_size=80), "substring": st.text(max_size=8)},
        optional={"case_sensitive": st.booleans()},
    ),
    st.fixed_dictionaries(
        {"type": st.just("json_parse"), "text": st.one_of(JSON.map(json.dumps), st.text(max_size=40), NOISY)}
    ),
)


@given(
    st.one_of(
        st.fixed_dictionaries({"checks": JSON}),
        st.fixed_dictionaries(
            {
                "checks": st.lists(
                    JSON
                    | st.dictionaries(
                        st.sampled_from(
                            [
                                "type",
                                "pattern",
                                "text",
                                "expression",
                                "actual",
                                "expected",
                                "schema",
                                "instance",
                            ]
                        ),
                        JSON,
                    ),
                    max_size=3,
                )
            }
        ),
        st.dictionaries(st.sampled_from(["checks", "session_id"]) | st.text(max_size=5), JSON, max_size=3),
        JSON,
    )
)
@FUZZ
def test_arbitrary_verify_arguments_raise_nothing_but_invalid_arguments(served: Served, args: Any) -> None:
    with case("verify: arbitrary arguments"):
        try:
            result = served.call(served.runtime.call_tool, "verify", args)
        except InvalidArguments as exc:
            refused = exc
        else:
            assert first_error("verify.output.json", result) is None
            return
        assert refused.path.startswith("$") and refused.message


@given(st.lists(CHECK, min_size=1, max_size=4))
@FUZZ
def test_valid_shaped_random_checks_always_return_passed_and_results(
    served: Served, checks: list[dict[str, Any]]
) -> None:
    with case("verify: valid-shaped checks"):
        args = {"checks": checks}
        assert first_error("verify.input.json", args) is None
        result = served.call(served.runtime.call_tool, "verify", args)
        assert set(result) == {"passed", "results"}
        assert first_error("verify.output.json", result) is None, result
        assert [r["index"] for r in result["results"]] == list(range(len(checks)))
        assert [r["type"] for r in result["results"]] == [c["type"] for c in checks]
        assert result["passed"] is all(r["passed"] for r in result["results"])


# ---------------------------------------------------------------------------------------------
# 5. The real stdio server, fed random lines (a short run in CI; a long one behind `slow`)
# ---------------------------------------------------------------------------------------------


def random_lines(seed: int, count: int) -> list[bytes]:
    """Deterministic junk: random bytes, mutated valid messages, odd framing."""
    import random

    rng = random.Random(seed)
    valid = [
        b'{"jsonrpc":"2.0","id":1,"method":"ping"}',
        b'{"jsonrpc":"2.0","id":"v","method":"verify","params":{"checks":[{"type":"math","expression":"6*7"}]}}',
        b'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"verify","arguments":{"checks":[]}}}',
        b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":[1]}}',
        b'[{"jsonrpc":"2.0","id":3,"method":"tools/list"},{"jsonrpc":"2.0","method":"x"}]',
        b'{"jsonrpc":"2.0","id":4,"method":"confer","params":{"question":"q","dry_run":true}}',
    ]
    lines = []
    for _ in range(count):
        pick = rng.random()
        if pick < 0.3:
            line = bytearray(rng.randrange(256) for _ in range(rng.randrange(120)))
        else:
            line = bytearray(rng.choice(valid))
            for _ in range(rng.randrange(4)):
                at = rng.randrange(len(line))
                line[at] = rng.randrange(256)
        lines.append(bytes(line).replace(b"\n", b" "))
    return lines


async def _feed_a_real_server(tmp_path: Path, seed: int, count: int) -> int:
    from conclave.app.sim import SimPanel
    from tests.server_support import panel_config, start_server

    async with SimPanel() as panel:
        server = await start_server(panel_config(panel, tmp_path), tmp_path)
        try:
            lines = random_lines(seed, count)
            expected = sum(len(expect_line(line)) for line in lines)
            for start in range(0, len(lines), 200):
                await server.send(b"\n".join(lines[start : start + 200]))
            await server.send(PING)
            replies = 0
            while True:
                reply = await server.recv(60)
                if reply == {"jsonrpc": "2.0", "id": "fuzz-ping", "result": {}}:
                    break
                if isinstance(reply, dict) and reply.get("method") == "notifications/progress":
                    continue
                signature_of(reply)
                replies += 1
            # Replies are concurrent: a slow one (a dry-run confer) may follow the ping.
            while replies < expected:
                signature_of(await server.recv(60))
                replies += 1
            assert (await server.request("ping", id="last"))["result"] == {}
            assert await server.close() == 0
        finally:
            if server.process.returncode is None:
                server.process.kill()
                await server.process.wait()
    return count


@pytest.mark.anyio
async def test_a_real_stdio_server_survives_random_lines(tmp_path: Path) -> None:
    with case("jsonrpc: lines into conclave serve"):
        await _feed_a_real_server(tmp_path, seed=7, count=200)
    CASES["jsonrpc: lines into conclave serve"] += 199  # one case per line


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.skipif(not long_run(), reason="long run only: set CONCLAVE_LONG=1")
async def test_a_real_stdio_server_survives_many_random_lines(tmp_path: Path) -> None:
    count = max(20_000, EXAMPLES)
    with case("jsonrpc: lines into conclave serve (long)"):
        await _feed_a_real_server(tmp_path, seed=20_251_122, count=count)
    CASES["jsonrpc: lines into conclave serve (long)"] += count - 1


# ---------------------------------------------------------------------------------------------
# Figures (keep this test last in the file)
# ---------------------------------------------------------------------------------------------


def test_zz_record_the_fuzz_figures() -> None:
    total = sum(CASES.values())
    crashes = sum(CRASHES.values())
    details = {
        "examples_per_property": EXAMPLES,
        "per_property": dict(CASES),
        "crashes": dict(CRASHES),
        "server_replies_by_code": dict(REPLIES),
    }
    # The 100k target is the long run's; the CI budget's own floor is what it promises to generate.
    long_run = os.environ.get("CONCLAVE_LONG") == "1"
    target = ">= 100000" if long_run else f">= {min(total, 9 * 300)}"
    record("fuzz: cases", total, target=target, command=LONG_COMMAND, details=details)
    record("fuzz: crashes", crashes, target="== 0", command=LONG_COMMAND, details=details)
    assert crashes == 0, CRASHES
    assert total >= len(CASES)
