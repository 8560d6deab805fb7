"""The simulated panel: a real aiohttp server speaking every provider wire format Conclave has
(one module per kind under `kinds/`).

Conclave's own adapters talk to it over loopback exactly as they talk to real
providers, so tests, the demo and the benchmark exercise the real HTTP path. Every
answer is scripted (`Scenario`) or a deterministic default labelled `[simulated <model>]`
(with `role_answers`, a valid role envelope when the prompt asks for a role: `roles.py`; for a
request for structured output, an object valid against its schema: `structured.py`, drawn by the
panel's `Oracle` when it knows the question: `oracle.py`), and every response carries
`server: conclave-sim`.

aiohttp runs on asyncio, so this module uses asyncio directly (latency is one
`asyncio.sleep` per request); the rest of Conclave stays on anyio. The request path is
kept lean because the benchmark runs this server as its fake provider, in its own process
but on the same cores as what it measures: no per-request logging, no access log, no
timer wake-ups while a request waits, orjson for bodies.

A request that asks for a stream (OpenAI's and Anthropic's `"stream": true`, Gemini's
`:streamGenerateContent`) gets the same turn as its wire's frames (`SimWire.stream`), written
after the latency as they would arrive: at once, or `stream_tokens_per_s` frames a second.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, Final, Literal

import orjson
from aiohttp import web

from conclave.app.sim import structured, wire
from conclave.app.sim.caching import Cached, PromptCache
from conclave.app.sim.kinds import WIRES
from conclave.app.sim.oracle import Oracle, OracleItem
from conclave.app.sim.recording import (
    Kind,
    ReceivedRequest,
    mask_headers,
    masked_path,
    recording_json,
)
from conclave.app.sim.roles import role_answer
from conclave.app.sim.scenarios import (
    Reply,
    Scenario,
    choose_reply,
    default_answer,
    render_text,
    resolve_latency_ms,
)

SERVER_NAME: Final = "conclave-sim"
BASE_PATHS: Final[Mapping[Kind, str]] = {kind: sim_wire.base_path for kind, sim_wire in WIRES.items()}
MAX_REQUEST_BYTES: Final = 64 * 1024 * 1024  # long prompts in benchmarks; aiohttp's default is 1 MiB
_NOT_JSON: Final = object()
_DEFAULT_REPLY: Final = Reply()
_SERVER_HEADER: Final = {"server": SERVER_NAME}


class SimPanel:
    """A scripted multi-provider fake, listening on loopback while the context is open.

    >>> async with SimPanel() as panel:
    ...     panel.set_scenario("m1", Scenario(replies=(Reply(status=429),)))
    ...     url = panel.base_url("openai")   # http://127.0.0.1:<port>/openai/v1
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        latency_ms: float = 0.0,
        scenarios: Mapping[str, Scenario] | None = None,
        record: bool = True,
        caching: bool = False,
        role_answers: bool = False,
        oracle: Oracle | None = None,
        stream_tokens_per_s: float | None = None,
    ) -> None:
        if stream_tokens_per_s is not None and not stream_tokens_per_s > 0:
            raise ValueError(f"stream_tokens_per_s must be > 0, got {stream_tokens_per_s}")
        self._host = host
        self._requested_port = port
        self._latency_ms = latency_ms
        self._scenarios: dict[str, Scenario] = dict(scenarios or {})
        self._calls: dict[str, int] = {}
        self._seq = 0
        self._record = record  # off for long benchmark runs, where the log would only grow
        self._cache = PromptCache() if caching else None  # each provider's caching rule, on request
        # Off by default: tests script their roles, and some check what an unscripted role gets.
        self._role_answers = role_answers
        self._oracle = oracle  # answers the questions it knows, when a request asks for a schema
        # Between two frames of a stream: each text frame is one simulated token.
        self._frame_gap = None if stream_tokens_per_s is None else 1.0 / stream_tokens_per_s
        self._runner: web.AppRunner | None = None
        self._port: int | None = None
        self.received: list[ReceivedRequest] = []
        # Models whose caller hung up while the panel was "thinking" or still streaming.
        self.aborted: list[str] = []

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> SimPanel:
        runner = web.AppRunner(
            self.build_app(), access_log=None, shutdown_timeout=1.0, handler_cancellation=True
        )
        await runner.setup()
        try:
            await web.TCPSite(runner, self._host, self._requested_port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self._port = int(runner.addresses[0][1])
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    def build_app(self) -> web.Application:
        """The aiohttp application: control routes under /_sim, everything else is API."""
        app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        app.router.add_get("/_sim/health", self._health)
        app.router.add_get("/_sim/requests", self._requests)
        app.router.add_post("/_sim/reset", self._reset)
        app.router.add_get("/_sim/calls", self._calls_json)
        app.router.add_get("/_sim/scenarios", self._scenarios_json)
        app.router.add_put("/_sim/scenarios/{model:.+}", self._put_scenario)
        # The announced paths are exact routes (a dictionary lookup); any other prefix still
        # reaches the API through the catch-all, which routes by suffix.
        for sim_wire in WIRES.values():
            if sim_wire.exact_route is not None:
                app.router.add_route("*", sim_wire.base_path + sim_wire.exact_route, self._api)
        app.router.add_route("*", "/{tail:.*}", self._api)
        return app

    # ------------------------------------------------------------------ public API

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("SimPanel is not listening; use `async with SimPanel() as panel`")
        return self._port

    def base_url(self, kind: Kind) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self.port}{BASE_PATHS[kind]}"

    def base_urls(self) -> dict[Kind, str]:
        """Every wire's base URL, by kind: what a config pointed at the panel needs."""
        return {kind: self.base_url(kind) for kind in BASE_PATHS}

    def set_scenario(self, model: str, scenario: Scenario) -> None:
        self._scenarios[model] = scenario

    def set_oracle(self, oracle: Oracle | None) -> None:
        """Answer requests for structured output on the questions `oracle` knows with its draws
        (`oracle.py`); None: every default answer is synthesized again."""
        self._oracle = oracle

    @property
    def oracle(self) -> Oracle | None:
        return self._oracle

    def reset(self) -> None:
        """Forget scenarios, call counters and the recording; the oracle, if any, stays and
        counts its draws from the start again."""
        if self._oracle is not None:
            self._oracle.reset()
        self._scenarios.clear()
        self._calls.clear()
        self._seq = 0
        self.received.clear()
        self.aborted.clear()

    def calls(self, model: str) -> int:
        """How many valid API calls `model` got (each one consumed a step of its script)."""
        return self._calls.get(model, 0)

    # ------------------------------------------------------------------ API requests

    async def _api(self, request: web.Request) -> web.StreamResponse:
        routed = wire.route(request.path)
        if routed is None or request.method != "POST":
            return _not_found(request)
        kind, path_model, path_streams = routed
        body = _decode(await request.read())
        self._seq += 1
        seq = self._seq
        model = path_model or _body_model(body)
        if self._record:
            self._remember(kind, request, model, body)
        if body is _NOT_JSON:
            return _error_response(kind, wire.invalid_json(kind), model, seq)
        try:
            parsed = wire.parse_request(
                kind,
                body,
                path_model=path_model,
                headers=request.headers,
                stream_query=request.query if path_streams else None,
            )
        except wire.WireError as exc:
            return _error_response(kind, exc.spec, model, seq)
        cached = self._cache.apply(kind, parsed.model, body) if self._cache is not None else Cached()
        return await self._answer(request, kind, parsed, seq, cached, body)

    async def _answer(
        self,
        request: web.Request,
        kind: Kind,
        parsed: wire.ParsedRequest,
        seq: int,
        cached: Cached,
        body: Any = None,
    ) -> web.StreamResponse:
        scenario = self._scenarios.get(parsed.model)
        if scenario is not None:
            if scenario.rejects_tools and parsed.declares_tools:
                return _error_response(kind, wire.tools_unsupported(parsed.model), parsed.model, seq)
            if scenario.rejects_stream and parsed.stream is not None:
                return _error_response(kind, wire.stream_unsupported(kind, parsed.model), parsed.model, seq)
        call = self._calls[parsed.model] = self._calls.get(parsed.model, 0) + 1
        reply = choose_reply(scenario, call, parsed.last_text) or _DEFAULT_REPLY
        delay_ms = resolve_latency_ms(reply, scenario, self._latency_ms)
        if delay_ms > 0:
            await self._think(request, parsed.model, delay_ms / 1000)
        if reply.fault is None:
            if reply.status != 200:
                return _error_response(kind, _reply_error(reply), parsed.model, seq, reply.headers)
        elif reply.fault == "stream_error" and parsed.stream is None:
            # A plain call meets the same error as the stream would, as its response.
            spec = _reply_error(reply, wire.stream_error_status(kind, reply.status))
            return _error_response(kind, spec, parsed.model, seq, reply.headers)
        answer = build_answer(
            parsed,
            reply,
            call=call,
            seq=seq,
            cached=cached,
            roles=self._role_answers,
            oracle=self._oracle,
            body=body,
        )
        if parsed.stream is not None:
            return await self._stream(request, kind, answer, reply, parsed.stream, parsed.model)
        return await _success_response(request, kind, answer, reply)

    async def _stream(
        self,
        request: web.Request,
        kind: Kind,
        answer: wire.Answer,
        reply: Reply,
        ask: wire.StreamAsk,
        model: str,
    ) -> web.StreamResponse:
        """Write the answer's frames as a stream (a fault breaks it halfway), pausing between
        frames when paced. A caller that hangs up stops the writing and is recorded in
        `aborted`, as while thinking."""
        frames = wire.stream_frames(kind, answer, ask, answerless=reply.fault == "missing_fields")
        frames = _faulted(kind, frames, reply, ask, model)
        headers = {**_SERVER_HEADER, **wire.stream_headers(kind, answer.seq, ask)}
        for name, value in reply.headers.items():
            headers[name.lower()] = value
        response = web.StreamResponse(status=200, headers=headers)
        gap = self._frame_gap
        try:
            await response.prepare(request)
            for i, frame in enumerate(frames):
                if gap is not None and i:
                    await asyncio.sleep(gap)
                await response.write(frame)
            if reply.fault == "drop":
                if request.transport is not None:
                    request.transport.close()  # mid-body: the chunked body never ends
                return response
            await response.write_eof()
        except ConnectionResetError:  # aiohttp's write to a transport the caller closed
            self.aborted.append(model)
        except asyncio.CancelledError:  # the runner cancels a handler whose caller hung up
            transport = request.transport
            if transport is None or transport.is_closing():
                self.aborted.append(model)
            raise
        return response

    async def _think(self, request: web.Request, model: str, seconds: float) -> None:
        """Wait out the latency. One timer per request, not a polling loop: the runner has
        aiohttp cancel this handler the moment its client hangs up (a cancelled call, a
        deadline), which is when the model is recorded as aborted."""
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            transport = request.transport
            if transport is None or transport.is_closing():
                self.aborted.append(model)
            raise

    def _remember(self, kind: Kind, request: web.Request, model: str, body: Any) -> None:
        self.received.append(
            ReceivedRequest(
                kind=kind,
                path=masked_path(request.path, list(request.query.items())),
                model=model,
                headers=mask_headers(request.headers.items()),
                body=None if body is _NOT_JSON else body,
            )
        )

    # ------------------------------------------------------------------ control requests

    async def _health(self, _: web.Request) -> web.Response:
        return _json({"ok": True, "simulated": True})

    async def _requests(self, _: web.Request) -> web.Response:
        return _raw_json(recording_json(self.received))

    async def _reset(self, _: web.Request) -> web.Response:
        self.reset()
        return _json({"ok": True})

    async def _calls_json(self, _: web.Request) -> web.Response:
        return _json(self._calls)

    async def _scenarios_json(self, _: web.Request) -> web.Response:
        return _json({model: s.to_dict() for model, s in self._scenarios.items()})

    async def _put_scenario(self, request: web.Request) -> web.Response:
        model = request.match_info["model"]
        try:
            scenario = Scenario.from_dict(orjson.loads(await request.read()))
        except (orjson.JSONDecodeError, ValueError, TypeError) as exc:
            return _json({"ok": False, "error": f"bad scenario for {model!r}: {exc}"}, 400)
        self.set_scenario(model, scenario)
        return _json({"ok": True, "model": model})


def _reply_error(reply: Reply, status: int | None = None) -> wire.ErrorSpec:
    return wire.ErrorSpec(
        reply.status if status is None else status,
        message=reply.error_message,
        error_type=reply.error_type,
        retry_delay=reply.retry_delay,
        quota_id=reply.quota_id,
    )


def _faulted(kind: Kind, frames: list[bytes], reply: Reply, ask: wire.StreamAsk, model: str) -> list[bytes]:
    """The frames a faulted stream sends: `malformed` cuts the JSON of its middle frame, `drop`
    and `truncated` stop after about half of them (the server then cuts the connection, or ends
    the body cleanly), `stream_error` sends that half and then the wire's error."""
    fault = reply.fault
    if fault is None or fault in ("empty", "missing_fields"):
        return frames
    half = len(frames) // 2
    if fault == "malformed":
        return [*frames[:half], _cut(frames[half]), *frames[half + 1 :]]
    if fault == "stream_error":
        spec = _reply_error(reply, wire.stream_error_status(kind, reply.status))
        return [*frames[:half], wire.stream_error_frame(kind, spec, model, ask)]
    return frames[:half]


def _cut(frame: bytes) -> bytes:
    """A frame whose JSON is a strict prefix of itself (never valid JSON); a server-sent event
    keeps its `data:` line and its ending, so a parser still delivers it."""
    start = frame.rfind(b"data: ")
    if start < 0:
        return frame[: len(frame) // 2]
    start += len(b"data: ")
    end = len(frame.rstrip(b"\r\n"))
    return frame[:start] + frame[start : start + (end - start) // 2] + frame[end:]


def build_answer(
    parsed: wire.ParsedRequest,
    reply: Reply,
    *,
    call: int,
    seq: int,
    cached: Cached | None = None,
    roles: bool = False,
    oracle: Oracle | None = None,
    body: Any = None,
) -> wire.Answer:
    """The turn a scripted reply (or the default answer) amounts to for this request; `cached`,
    what the provider's caching rule reads from (or writes to) its cache, comes out of the
    prompt's uncached tokens; with `roles`, the default answer to a role prompt is its envelope;
    with an `oracle`, a structured default answer to a question it knows is its draw (`body`, the
    decoded request, is where it looks for the question when the last user message lacks it)."""
    text, finish = _answer_text(parsed, reply, call, roles, oracle, body)
    calls = () if reply.fault == "empty" else reply.tool_calls
    written = text + "".join(str(c.arguments) for c in calls)
    cached = cached or Cached()
    prompt = wire.estimate_input_tokens(parsed.input_chars)
    return wire.Answer(
        model=reply.model or parsed.model,
        text=text,
        finish_reason=finish,
        input_tokens=max(prompt - cached.read - cached.written, 1),
        cached_tokens=reply.cached_tokens + cached.read,
        cache_write_tokens=cached.written,
        output_tokens=wire.estimate_output_tokens(written),
        reasoning_tokens=reply.reasoning_tokens,
        seq=seq,
        created=int(time.time()),
        calls=calls,
        thinking=None if reply.fault == "empty" else reply.thinking,
    )


def _answer_text(
    parsed: wire.ParsedRequest, reply: Reply, call: int, roles: bool, oracle: Oracle | None, body: Any
) -> tuple[str, Literal["stop", "length"]]:
    if reply.fault == "empty":
        return "", "length"
    if reply.text is not None:
        text = render_text(reply.text, model=parsed.model, call=call, last_user_text=parsed.last_user_text)
        return text, reply.finish_reason
    if reply.value is not None:  # the answer as an object, serialized as a model writes it
        return orjson.dumps(reply.value).decode(), reply.finish_reason
    if reply.tool_calls:
        return "", reply.finish_reason  # a turn that only calls, as models often answer
    # The default answer respects the request's token cap like a model would; a scripted
    # text is sent as written (a script that wants "length" says so).
    text = _default_text(parsed, roles, oracle, body)
    cap = parsed.max_tokens
    if cap is not None and wire.estimate_output_tokens(text) > cap:
        return text[: max(cap, 0) * 4], "length"
    return text, reply.finish_reason


def _default_text(
    parsed: wire.ParsedRequest, roles: bool, oracle: Oracle | None = None, body: Any = None
) -> str:
    # The role's ask closes the last message; a tool result coming back is not a role prompt. A
    # role's envelope comes first even when the request carries its schema (role turns do): it
    # plays the debate out as the scenario means it to (a critic asking for a revision).
    envelope = role_answer(parsed.model, parsed.last_text) if roles else None
    draw = None  # the oracle's draw for the item this request asks, when it knows one
    if oracle is not None and parsed.answer_schema is not None:
        item = _known(oracle, parsed, body)
        draw = None if item is None else functools.partial(oracle.draw, parsed.model, item)
    if envelope is not None:
        return envelope if parsed.answer_schema is None else _completed(envelope, parsed, draw)
    if parsed.answer_schema is not None:  # structured output: an object valid against the schema
        schema, question = parsed.answer_schema, parsed.last_user_text
        drawn = None if draw is None else draw(schema)
        if drawn is not None:
            return orjson.dumps(drawn).decode()
        return orjson.dumps(structured.synthesize(schema, model=parsed.model, question=question)).decode()
    return default_answer(parsed.model, parsed.last_user_text)


def _completed(
    envelope: str, parsed: wire.ParsedRequest, draw: Callable[[Mapping[str, Any]], Any] | None = None
) -> str:
    """A role's envelope with what the request's schema requires besides (a chair's `value`,
    drawn by the oracle when it knows the question)."""
    schema = parsed.answer_schema or {}
    filled = orjson.loads(envelope)
    for name in schema.get("required", ()):
        part = (schema.get("properties") or {}).get(name)
        if name not in filled and isinstance(part, dict):
            drawn = None if draw is None else draw(part)
            if drawn is None:
                drawn = structured.synthesize(part, model=parsed.model, question=parsed.last_user_text)
            filled[name] = drawn
    return orjson.dumps(filled).decode()


def _known(oracle: Oracle, parsed: wire.ParsedRequest, body: Any) -> OracleItem | None:
    """The oracle's item this request asks: its question in the last user message (a plain
    confer), else anywhere in the request (a staged confer and its chair carry the question in
    the system prompt)."""
    item = oracle.find(parsed.last_user_text)
    if item is None and body is not None:
        item = oracle.find("\n".join(_strings(body)))
    return item


def _strings(node: Any) -> list[str]:
    """Every string in a decoded request body, in document order."""
    out: list[str] = []
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, str):
            out.append(current)
        elif isinstance(current, dict):
            stack.extend(reversed(list(current.values())))
        elif isinstance(current, list):
            stack.extend(reversed(current))
    return out


async def _success_response(
    request: web.Request, kind: Kind, answer: wire.Answer, reply: Reply
) -> web.StreamResponse:
    body = wire.success_body(kind, answer)
    if reply.fault == "missing_fields":
        body = wire.without_answer(kind, body)
    data = wire.encode(body)
    headers = _headers(kind, answer.seq, 200, reply.headers)
    if reply.fault == "drop":
        return await _drop(request, data, headers)
    if reply.fault == "malformed" or reply.fault == "truncated":
        data = data[: len(data) // 2]  # a strict prefix of an object is never valid JSON
    return web.Response(body=data, status=200, headers=headers)


async def _drop(request: web.Request, data: bytes, headers: dict[str, str]) -> web.StreamResponse:
    """Promise a long body, send part of it, then close the connection mid-body."""
    response = web.StreamResponse(status=200, headers=headers)
    response.content_length = len(data) * 4 + 4096
    await response.prepare(request)
    await response.write(data[: len(data) // 2])
    if request.transport is not None:
        request.transport.close()
    # aiohttp's final write_eof now meets a closed transport and drops the connection quietly.
    return response


def _error_response(
    kind: Kind,
    spec: wire.ErrorSpec,
    model: str,
    seq: int,
    extra_headers: Mapping[str, str] | None = None,
) -> web.Response:
    body = wire.error_body(kind, spec, model=model, request_id=wire.request_id(kind, seq))
    headers = _headers(kind, seq, spec.status, extra_headers or {})
    return web.Response(body=body, status=spec.status, headers=headers)


def _headers(kind: Kind, seq: int, status: int, extra: Mapping[str, str]) -> dict[str, str]:
    headers = {**_SERVER_HEADER, **wire.response_headers(kind, seq, status)}
    for name, value in extra.items():
        headers[name.lower()] = value
    return headers


def _decode(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _NOT_JSON


def _body_model(body: Any) -> str:
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) else ""


def _not_found(request: web.Request) -> web.Response:
    message = f"{wire.LABEL}no route for {request.method} {request.path}"
    return _json({"error": {"message": message, "type": "not_found_error", "code": 404}}, 404)


def _json(payload: Any, status: int = 200) -> web.Response:
    return _raw_json(orjson.dumps(payload), status)


def _raw_json(data: bytes, status: int = 200) -> web.Response:
    headers = {**_SERVER_HEADER, "content-type": "application/json"}
    return web.Response(body=data, status=status, headers=headers)
