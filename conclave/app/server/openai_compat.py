"""An OpenAI-compatible chat endpoint on `serve --http` (docs/openai-endpoint.md): `GET /v1/models`
and `POST /v1/chat/completions`, so that an app written for OpenAI's API can ask the panel.

The call runs the same way an MCP `tools/call` does: through `Server.run_tool` (the tool's
arguments checked against `schemas/`, then its catalog handler on the runtime), in the caller's
W3C trace (`traceparent`), with the call's deadline. A client that hangs up cancels the call,
upstream requests included (`serve --http` runs aiohttp with handler_cancellation).

Guards, before anything is read: the `Origin` check of `/mcp`; bound to loopback, the `Host` check
too (a DNS-rebinding page names its own host); bound beyond loopback, `Authorization: Bearer` must
carry `CONCLAVE_API_KEY`, which must then be set. On loopback the key is optional, but a wrong one
is refused."""

from __future__ import annotations

import hmac
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import orjson
from aiohttp import web

from conclave.app.catalog import tool_spec
from conclave.app.server.core import Server
from conclave.app.server.jsonrpc import to_rpc_error
from conclave.app.server.openai_reply import Reply, conclave_field, digest_sections, reply_of, usage_of
from conclave.app.server.openai_request import (
    MODELS,
    ChatCall,
    ModelSpec,
    OpenAIError,
    invalid_arguments,
    parse_chat,
)
from conclave.app.server.openai_stream import DONE, KEEPALIVE, Chunks, Prose, completion_id, sse
from conclave.core.errors import ConfigError, InvalidArguments, SessionInFlight, ToolError
from conclave.core.messages import Delta
from conclave.net.webguard import host_allowed, is_loopback, origin_allowed
from conclave.obs.telemetry import traced
from conclave.schema.config import Config

MAX_BODY_BYTES = 8 * 1024 * 1024  # the largest question plus context the tools take, with room for JSON
KEY_ENV = "CONCLAVE_API_KEY"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def mount(
    app: web.Application, server: Server, *, allowed: frozenset[str], bound_host: str, key: str | None
) -> None:
    """Add the /v1 routes to `app`; `key`: the value of CONCLAVE_API_KEY, if set."""
    guard = Guard(allowed, loopback=is_loopback(bound_host), key=key)
    created = int(time.time())
    app.router.add_get("/v1/models", guard.wrap(_models(server, created)))
    app.router.add_get("/v1/models/{model}", guard.wrap(_model(server, created)))
    app.router.add_post("/v1/chat/completions", guard.wrap(_completions(server)))


# -- the guard ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Guard:
    allowed: frozenset[str]
    loopback: bool
    key: str | None

    def wrap(self, handler: Handler) -> Handler:
        async def guarded(request: web.Request) -> web.StreamResponse:
            try:
                self.check(request)
            except OpenAIError as refusal:
                return error_response(refusal)
            return await handler(request)

        return guarded

    def check(self, request: web.Request) -> None:
        headers = request.headers
        if not origin_allowed(headers.get("origin"), self.allowed):
            raise OpenAIError(
                403, f"Origin {headers.get('origin')} is not allowed", code="origin_not_allowed"
            )
        # Beyond loopback the Host is whatever name reaches this machine (a proxy's, a DNS name):
        # the key guards it there. On loopback, a page that rebound its own name is refused here.
        if self.loopback and not host_allowed(headers.get("host"), self.allowed):
            raise OpenAIError(403, "Host not allowed: use 127.0.0.1 or localhost", code="host_not_allowed")
        self._authorize(headers.get("authorization"))

    def _authorize(self, header: str | None) -> None:
        if self.key is None:
            if self.loopback:
                return  # any key a client insists on sending is fine: there is none to match
            raise OpenAIError(
                401,
                f"This server is reachable beyond loopback: set {KEY_ENV} in its environment and "
                "send it as `Authorization: Bearer <key>`",
                type="invalid_request_error",
                code="invalid_api_key",
            )
        sent = header[7:].strip() if header and header[:7].lower() == "bearer " else None
        if sent is None and self.loopback:
            return
        if sent is None or not hmac.compare_digest(sent.encode(), self.key.encode()):
            raise OpenAIError(
                401,
                "Incorrect API key provided"
                if sent
                else "Missing API key: send `Authorization: Bearer <key>`",
                code="invalid_api_key",
            )


# -- /v1/models ---------------------------------------------------------------------------------------


def _models(server: Server, created: int) -> Handler:
    async def models(_request: web.Request) -> web.StreamResponse:
        config = (await server.runtime()).config
        return _json({"object": "list", "data": [model_entry(m, config, created) for m in MODELS.values()]})

    return models


def _model(server: Server, created: int) -> Handler:
    async def model(request: web.Request) -> web.StreamResponse:
        spec = MODELS.get(request.match_info["model"])
        if spec is None:
            return error_response(OpenAIError(404, "No such model", code="model_not_found", param="model"))
        return _json(model_entry(spec, (await server.runtime()).config, created))

    return model


def model_entry(spec: ModelSpec, config: Config, created: int) -> dict[str, Any]:
    """OpenAI's model object, with who answers under this name in a `conclave` member."""
    roles = config.roles
    panel: dict[str, Any] = {"tool": spec.tool, "description": spec.description}
    if spec.tool == "confer":
        panel["panel"] = list(config.panel)
        if spec.council:
            panel.update(review=True, chair=[roles.synthesizer, *roles.synthesizer_fallbacks])
    else:
        panel.update(
            proposer=roles.proposer,
            critics=list(roles.critics),
            synthesizer=[roles.synthesizer, *roles.synthesizer_fallbacks],
        )
    return {"id": spec.id, "object": "model", "created": created, "owned_by": "conclave", "conclave": panel}


# -- /v1/chat/completions -------------------------------------------------------------------------------


def _completions(server: Server) -> Handler:
    async def completions(request: web.Request) -> web.StreamResponse:
        try:
            call = parse_chat(await _body(request))
        except OpenAIError as refusal:
            return error_response(refusal)
        with traced(request.headers.get("traceparent")):
            if call.stream:
                return await _streamed(server, request, call)
            return await _whole(server, call)

    return completions


async def _body(request: web.Request) -> Any:
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        raise _too_large()
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise _too_large() from None
    if len(raw) > MAX_BODY_BYTES:
        raise _too_large()
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise OpenAIError(400, f"The body is not valid JSON: {exc}", code="invalid_json") from None


def _too_large() -> OpenAIError:
    return OpenAIError(413, f"The body is larger than {MAX_BODY_BYTES} bytes", code="request_too_large")


async def _run(
    server: Server,
    call: ChatCall,
    progress: Callable[[Mapping[str, Any]], Awaitable[None]] | None = None,
    deltas: Callable[[str, str | None, Delta], None] | None = None,
) -> dict[str, Any]:
    """The tool, as MCP runs it; Conclave's refusals as OpenAI's."""
    try:
        return await server.run_tool(tool_spec(call.model.tool), dict(call.args), progress, deltas)
    except InvalidArguments as exc:
        raise invalid_arguments(exc) from None
    except SessionInFlight as exc:
        raise OpenAIError(409, str(exc), code="session_in_flight", param="conclave.session_id") from None
    except (ToolError, ConfigError) as exc:
        raise OpenAIError(502, str(exc), type="server_error", code=exc.code) from None


async def _whole(server: Server, call: ChatCall) -> web.StreamResponse:
    try:
        result = await _run(server, call)
        reply = reply_of(call, result)
    except OpenAIError as refusal:
        return error_response(refusal)
    except Exception as exc:
        return error_response(internal(server, exc))
    message = {"role": "assistant", "content": reply.content, "refusal": reply.refusal}
    return _json(
        {
            "id": completion_id(),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": call.model.id,
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": reply.finish_reason}
            ],
            "usage": usage_of(result),
            "conclave": conclave_field(result),
        }
    )


async def _streamed(server: Server, request: web.Request, call: ChatCall) -> web.StreamResponse:
    """SSE chunks. The headers wait for the call to get under way (its first answer, delta or
    heartbeat), so that a call Conclave refuses at once still gets its own status."""
    relay = Relay(request, Chunks(call.model.id), Prose() if call.streams_prose else None)
    outcome: dict[str, Any] | Exception
    async with anyio.create_task_group() as group:
        group.start_soon(relay.pump)
        try:
            outcome = await _run(server, call, relay.progress, relay.hear if call.streams_prose else None)
        except Exception as exc:  # cancellation is not caught: a client that left cancels the call
            outcome = exc
        finally:
            relay.stop()
    if isinstance(outcome, Exception):
        refusal = outcome if isinstance(outcome, OpenAIError) else internal(server, outcome)
        return await relay.fail(refusal)
    try:
        reply = reply_of(call, outcome)
    except OpenAIError as refusal:
        return await relay.fail(refusal)
    return await relay.finish(call, reply, outcome)


class Relay:
    """Between the call and the client: the deltas arrive in the providers' stream tasks and must
    not wait, so they are kept (`Prose`) and a pump task writes what is new whenever it wakes."""

    def __init__(self, request: web.Request, chunks: Chunks, prose: Prose | None) -> None:
        self.request, self.chunks, self.prose = request, chunks, prose
        self.response: web.StreamResponse | None = None
        self._wake = anyio.Event()
        self._under_way = self._keepalive = self._stopped = False

    def hear(self, provider: str, role: str | None, delta: Delta) -> None:
        """The call's DeltaSink: called in a provider's stream task, so it only notes."""
        assert self.prose is not None
        if self.prose.hear(provider, role, delta):
            self._under_way = True
            self._wake.set()

    async def progress(self, step: Mapping[str, Any]) -> None:
        """The call's ProgressSink: an answer came, or a heartbeat (`waiting`): a keepalive."""
        self._under_way = True
        self._keepalive = self._keepalive or "waiting" in step
        self._wake.set()

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()

    async def pump(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()  # no await since the wait: nothing set in between is lost
            if self._stopped:
                return  # the tail is written by `finish`, after the call's result
            if self._under_way:
                await self._send_news()

    async def _send_news(self) -> None:
        stream = await self.open()
        if self._keepalive:
            self._keepalive = False
            await stream.write(KEEPALIVE)
        new = self.prose.take() if self.prose is not None else ""
        if new:
            await stream.write(self.chunks.event({"content": new}))

    async def open(self) -> web.StreamResponse:
        """The headers and the first chunk (the assistant's role), once."""
        if self.response is None:
            response = web.StreamResponse(
                headers={"content-type": "text/event-stream", "cache-control": "no-cache"}
            )
            await response.prepare(self.request)
            await response.write(self.chunks.event({"role": "assistant", "content": ""}))
            self.response = response
        return self.response

    async def finish(self, call: ChatCall, reply: Reply, result: Mapping[str, Any]) -> web.StreamResponse:
        stream = await self.open()
        conclave = conclave_field(result)
        for piece, replaced in self._content(call, reply, result):
            await stream.write(self.chunks.event(piece))
            if replaced:
                conclave["stream_draft_replaced"] = True
        await stream.write(self.chunks.event({}, reply.finish_reason, conclave=conclave))
        if call.include_usage:
            await stream.write(self.chunks.usage(usage_of(result)))
        await stream.write(DONE)
        await stream.write_eof()
        return stream

    def _content(
        self, call: ChatCall, reply: Reply, result: Mapping[str, Any]
    ) -> list[tuple[dict[str, Any], bool]]:
        """The content deltas still to send: the rest of the synthesis, a confer's digest one
        member at a time, or the structured answer (or its refusal) whole."""
        if reply.refusal is not None:
            return [({"refusal": reply.refusal}, False)]
        content = reply.content or ""
        if self.prose is not None and (reply.synthesized or self.prose.sent):
            rest, replaced = self.prose.close(content)
            return [({"content": rest}, replaced)] if rest else []
        if not call.model.synthesizes and not call.structured:
            return [({"content": piece}, False) for piece in digest_sections(result)]
        return [({"content": content}, False)] if content else []

    async def fail(self, refusal: OpenAIError) -> web.StreamResponse:
        """Before the headers: the error with its own status. After: in the stream, as OpenAI
        sends errors mid-stream (an `error` event), then [DONE]."""
        if self.response is None:
            return error_response(refusal)
        await self.response.write(sse(refusal.body()))
        await self.response.write(DONE)
        await self.response.write_eof()
        return self.response


# -- errors and bodies ---------------------------------------------------------------------------------


def internal(server: Server, exc: Exception) -> OpenAIError:
    """An unexpected failure: its traceback goes to the event log under an id the reply names;
    nothing else of it reaches the client."""
    error_id = to_rpc_error(exc, method="openai/chat.completions", telemetry=server.telemetry).data or {}
    return OpenAIError(
        500,
        f"Internal error (error_id {error_id.get('error_id')} in the server's event log)",
        type="server_error",
        code="internal_error",
    )


def error_response(refusal: OpenAIError) -> web.Response:
    return _json(refusal.body(), status=refusal.status)


def _json(body: Any, *, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")
