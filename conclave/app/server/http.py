"""HTTP transport: MCP Streamable HTTP on `/mcp` (POST; a JSON reply, or an SSE stream when the
caller asked for progress and accepts it; 202 for notifications) and plain JSON-RPC on
`POST /rpc`, and an OpenAI-compatible chat endpoint under `/v1` (`openai_compat`). Browsers'
cross-site requests are refused by checking `Origin`. `GET /` says what is served where, for
whoever opens the address by hand.

A stateless request (revision 2026-07-28, see `eras`) must also mirror its version, method and
tool name (a resource read: its URI) in the `MCP-Protocol-Version`, `Mcp-Method` and `Mcp-Name`
headers, and its errors about the protocol itself come with their own status: 400, or 404 for a
method not served."""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import orjson
from aiohttp import web

from conclave.app.server import eras
from conclave.app.server.core import Server
from conclave.app.server.jsonrpc import (
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    RequestId,
    RpcError,
    decode,
    error_response,
    request_id_of,
    to_rpc_error,
)
from conclave.app.server.lifecycle import serving
from conclave.app.server.openai_compat import KEY_ENV
from conclave.app.server.openai_compat import mount as mount_openai
from conclave.app.server.openai_request import MODELS
from conclave.net.webguard import allowed_hosts, host_allowed, is_loopback, origin_allowed
from conclave.obs.telemetry import traced
from conclave.schema.config import Config

MAX_BODY_BYTES = 32 * 1024 * 1024
UI_PATH = "/ui/"  # where `conclave.app.ui.mount` puts the session page


async def run_http(config: Config, host: str, port: int, *, worker_of: int | None = None) -> None:
    """Serve until cancelled. `worker_of`: this is a worker of `serve --workers`, accepting on
    the port beside the others (SO_REUSEPORT), and it stops once that supervisor is gone."""
    live = None
    if config.server.ui and worker_of is None:
        # The page hears this process's sessions as they stream. Not a worker's: a page's requests
        # reach any of the workers, most often not the one running its session.
        from conclave.deliberation.live import LiveDeltas

        live = LiveDeltas()
    async with serving(config, live=live) as server:
        # handler_cancellation: a client that hangs up cancels its call, upstream requests included
        app = build_app(server, bound_host=host, ui=config.server.ui)
        if config.server.ui:
            from conclave.app.ui import mount  # only then: the page's code is not on the request path

            mount(app, config, bound_host=host, live=live)
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, host, port, reuse_port=worker_of is not None or None)
        await site.start()
        bound = runner.addresses[0][1] if runner.addresses else port
        page = ", the session page on /ui/" if config.server.ui else ""
        print(
            f"conclave: serving MCP on http://{host}:{bound}/mcp and JSON-RPC on /rpc{page}, "
            "OpenAI-compatible chat on /v1",
            file=sys.stderr,
        )
        if not is_loopback(host) and not os.environ.get(KEY_ENV):
            print(f"conclave: {KEY_ENV} is not set: every /v1 request will be refused (401)", file=sys.stderr)
        try:
            if worker_of is not None:
                await _while_supervised(worker_of)
            else:
                await anyio.sleep_forever()
        finally:
            await runner.cleanup()


async def _while_supervised(supervisor: int) -> None:
    """Return once the supervisor is no longer this process's parent (killed, say, without the
    chance to stop its workers, perhaps even before this worker got here), so no worker is left
    serving on its own."""
    while os.getppid() == supervisor:  # noqa: ASYNC110 - nothing signals a parent's death: poll
        await anyio.sleep(1.0)
    with contextlib.suppress(OSError):  # its stderr went with it, most likely
        print("conclave: the supervising process is gone; this worker stops", file=sys.stderr)


def build_app(server: Server, *, bound_host: str = "127.0.0.1", ui: bool = False) -> web.Application:
    """The transport's routes; `ui`: the session page is mounted at `/ui/` too (the index says so).
    The /v1 routes read their key from CONCLAVE_API_KEY now, once: every worker of `--workers N`
    builds its own app from the same environment."""
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    allowed = allowed_hosts(bound_host)

    async def mcp(request: web.Request) -> web.StreamResponse:
        refusal = _check_origin(request, allowed)
        return await _exchange(server, request, refusal, notifications_status=202, mcp=True)

    async def rpc(request: web.Request) -> web.StreamResponse:
        refusal = _check_origin(request, allowed)
        return await _exchange(server, request, refusal, notifications_status=204, mcp=False)

    async def not_allowed(_request: web.Request) -> web.Response:
        return web.Response(status=405, headers={"allow": "POST"})

    app.router.add_post("/mcp", mcp)
    app.router.add_route("*", "/mcp", not_allowed)
    app.router.add_post("/rpc", rpc)
    app.router.add_get("/", _index_handler(allowed, ui=ui))
    mount_openai(app, server, allowed=allowed, bound_host=bound_host, key=os.environ.get(KEY_ENV) or None)
    return app


# -- GET /: what is served where -------------------------------------------------------------------


def _index_handler(allowed: frozenset[str], *, ui: bool) -> Callable[[web.Request], Awaitable[web.Response]]:
    """Someone who opens the server's address in a browser, or curls it, learns where the
    endpoints are instead of getting a bare 404. Behind the session page's own guard (`Host`
    and `Origin` must name this machine): a page on another site learns nothing here either."""
    endpoints = _endpoints(ui)

    async def index(request: web.Request) -> web.Response:
        if not host_allowed(request.headers.get("host"), allowed):
            return _plain("Host not allowed: open this server at 127.0.0.1 or localhost.\n", status=403)
        if not origin_allowed(request.headers.get("origin"), allowed):
            return _plain("Origin not allowed.\n", status=403)
        if "application/json" in request.headers.get("accept", ""):
            return _json({"service": "conclave", "endpoints": endpoints})
        return _plain(_index_text(endpoints))

    return index


def _endpoints(ui: bool) -> dict[str, Any]:
    return {
        "mcp": {"path": "/mcp", "method": "POST", "protocol": "MCP Streamable HTTP"},
        "rpc": {"path": "/rpc", "method": "POST", "protocol": "JSON-RPC 2.0"},
        "openai_chat": {
            "path": "/v1/chat/completions",
            "method": "POST",
            "protocol": "OpenAI Chat Completions",
        },
        "openai_models": {"path": "/v1/models", "method": "GET", "protocol": "OpenAI Models"},
        "ui": {"path": UI_PATH, "method": "GET", "protocol": "HTML"} if ui else None,
    }


def _index_text(endpoints: dict[str, Any]) -> str:
    lines = [
        "Conclave: multi-model deliberation over MCP and JSON-RPC.",
        "",
        "POST /mcp  MCP Streamable HTTP: point an MCP client at this URL + /mcp",
        "POST /rpc  plain JSON-RPC 2.0: the tools are methods (confer, coordinate, fetch, verify,",
        "           list_providers), their arguments the params",
        f"POST /v1/chat/completions  OpenAI-compatible chat: models {', '.join(MODELS)}",
        "           (GET /v1/models); base URL: this address + /v1",
    ]
    if endpoints["ui"] is not None:
        lines.append(f"GET  {UI_PATH}  the read-only page of recent sessions")
    else:
        lines.append(f"The session page ({UI_PATH}) is off: set server.ui: true to serve it.")
    return "\n".join([*lines, "", "Send Accept: application/json for this as JSON.", ""])


def _plain(text: str, *, status: int = 200) -> web.Response:
    headers = {"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"}
    return web.Response(text=text, status=status, content_type="text/plain", headers=headers)


@dataclass(frozen=True, slots=True)
class _Refusal:
    status: int
    error: RpcError


def _check_origin(request: web.Request, allowed: frozenset[str]) -> _Refusal | None:
    """DNS-rebinding defence: a browser page from another origin must not reach a local server."""
    origin = request.headers.get("origin")
    if origin_allowed(origin, allowed):
        return None
    return _Refusal(403, RpcError(INVALID_REQUEST, f"Origin {origin} is not allowed"))


def _stateless(request: web.Request, message: Any) -> bool:
    """A request of the stateless era: its header or its own `_meta` says so."""
    if not isinstance(message, dict) or "id" not in message:
        return False  # a batch or a notification: neither exists in that era
    header = request.headers.get("mcp-protocol-version")
    return header in eras.STATELESS_VERSIONS or eras.is_stateless(message.get("params"))


def _check_headers(request: web.Request, message: Any) -> _Refusal | None:
    """Before any work: the headers must mirror the body, and the request must be one this
    server serves, so that a refusal still gets its own status."""
    headers = request.headers
    params = message.get("params")
    asked = (eras.meta_of(params) or {}).get(eras.PROTOCOL_VERSION)
    sent = headers.get("mcp-protocol-version")
    if isinstance(asked, str) and sent is not None and sent != asked:  # before judging either
        return _mismatch(f"the MCP-Protocol-Version header {sent!r} does not match the body's {asked!r}")
    try:
        context = eras.stateless_context(params)
    except RpcError as error:
        return _Refusal(400, error)
    for header, expected, required in _mirrored(message.get("method"), params, context.version):
        sent = headers.get(header)
        if sent is None:
            if not required:
                continue
            return _mismatch(f"the {header} header is missing")
        if _header_value(sent) != expected:
            return _mismatch(f"the {header} header {sent!r} does not match the body's {expected!r}")
    if message.get("method") not in eras.STATELESS_METHODS:
        return _Refusal(404, RpcError(METHOD_NOT_FOUND, f"Method not found: {message.get('method')}"))
    return None


def _mirrored(method: Any, params: Any, version: str) -> list[tuple[str, Any, bool]]:
    """(header, the body's value it must carry, whether it must be there)."""
    pairs = [("MCP-Protocol-Version", version, True), ("Mcp-Method", method, True)]
    if isinstance(params, dict) and method == "tools/call":
        pairs.append(("Mcp-Name", params.get("name"), True))
    if isinstance(params, dict) and method == "resources/read":
        pairs.append(("Mcp-Name", params.get("uri"), True))
    if isinstance(params, dict) and method in eras.TASK_METHODS:
        # The tasks extension routes a task's requests by its id; checked when sent.
        pairs.append(("Mcp-Name", params.get("taskId"), False))
    return pairs


def _header_value(value: str) -> str:
    """A header value, decoded when it is in the `=?base64?...?=` form (non-ASCII names)."""
    if value.startswith("=?base64?") and value.endswith("?="):
        try:
            return base64.b64decode(value[9:-2], validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return value
    return value


def _mismatch(why: str) -> _Refusal:
    return _Refusal(400, RpcError(eras.HEADER_MISMATCH, f"Header mismatch: {why}"))


def _check_handshake_version(request: web.Request) -> _Refusal | None:
    version = request.headers.get("mcp-protocol-version")
    if version is None or version in eras.HANDSHAKE_VERSIONS:
        return None
    return _Refusal(400, eras.unsupported_version(version))


async def _exchange(
    server: Server, request: web.Request, refusal: _Refusal | None, *, notifications_status: int, mcp: bool
) -> web.StreamResponse:
    if refusal is not None:
        return _json(error_response(await _id_if_readable(request), refusal.error), status=refusal.status)
    try:
        message = decode(await request.read())
    except RpcError as parse_error:
        return _json(error_response(None, parse_error), status=400)
    except web.HTTPRequestEntityTooLarge:
        return _json(error_response(None, RpcError(PARSE_ERROR, "Parse error: body too large")), status=413)
    stateless = mcp and _stateless(request, message)
    if mcp:
        refusal = _check_headers(request, message) if stateless else _check_handshake_version(request)
        if refusal is not None:
            return _json(error_response(request_id_of(message), refusal.error), status=refusal.status)
    with traced(request.headers.get("traceparent")):  # _meta's, if any, comes first
        return await _answer(server, request, message, notifications_status, stateless)


async def _answer(
    server: Server, request: web.Request, message: Any, notifications_status: int, stateless: bool
) -> web.StreamResponse:
    if _wants_stream(request, message):
        return await _stream(server, request, message)
    try:
        reply = await server.handle_message(message, _drop, connection=object())
    except Exception as exc:  # the safety net: a JSON-RPC error body, not aiohttp's plain-text 500
        return _json(error_response(request_id_of(message), _internal(server, exc)), status=500)
    if reply is None:
        return web.Response(status=notifications_status)
    return _json(reply, status=_status_of(reply) if stateless else 200)


def _status_of(reply: Any) -> int:
    """A stateless request's protocol errors carry their own HTTP status."""
    error = reply.get("error") if isinstance(reply, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return eras.HTTP_STATUS.get(code, 200) if isinstance(code, int) else 200


async def _id_if_readable(request: web.Request) -> RequestId:
    """A refused request is still answered by its id, when its body has one."""
    try:
        return request_id_of(decode(await request.read()))
    except (RpcError, web.HTTPRequestEntityTooLarge):
        return None


def _internal(server: Server, exc: Exception) -> RpcError:
    return to_rpc_error(exc, method="(http)", telemetry=server.telemetry)


async def _drop(_message: Any) -> None:
    """Progress has nowhere to go on a plain JSON reply."""


def _wants_stream(request: web.Request, message: Any) -> bool:
    if "text/event-stream" not in request.headers.get("accept", ""):
        return False
    params = message.get("params") if isinstance(message, dict) else None
    meta = params.get("_meta") if isinstance(params, dict) else None
    return isinstance(meta, dict) and "progressToken" in meta


async def _stream(server: Server, request: web.Request, message: Any) -> web.StreamResponse:
    """SSE: progress notifications as they happen, then the response, then the stream ends.

    Each HTTP request is its own connection for request ids: a client cancels by hanging up
    (aiohttp then cancels the handler); a cancel notification from another POST cannot reach it."""
    stream = web.StreamResponse(headers={"content-type": "text/event-stream", "cache-control": "no-cache"})
    await stream.prepare(request)

    async def send(note: Any) -> None:
        await stream.write(b"event: message\ndata: " + orjson.dumps(note) + b"\n\n")

    try:
        reply = await server.handle_message(message, send, connection=object())
    except Exception as exc:  # the headers are sent: the error goes down the stream
        reply = error_response(request_id_of(message), _internal(server, exc))
    if reply is not None:
        await send(reply)
    await stream.write_eof()
    return stream


def _json(body: Any, *, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")
