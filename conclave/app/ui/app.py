"""The page's HTTP side: a read-only aiohttp application, on its own (`conclave ui`) or mounted at
`/ui` on `serve --http` (`server.ui: true`).

Every request passes one guard before any handler: only GET and HEAD (the page starts nothing;
anything else is 405), and `Host` and `Origin` must name this machine (`webguard`, the DNS
rebinding defence `/mcp` shares). Every response, refusals and the event stream included, carries
a strict Content-Security-Policy (no inline script or style, nothing from another origin) and the
headers that keep the page out of frames and its address out of referrers.

Routes, under the mount's prefix: `/` the sessions, `/session?id=…` one session (after the turns
of its thread before it, when it is a follow-up: `threads`), `/events` the
event log as server-sent events (from `?from=` a byte offset, or `Last-Event-ID` when the browser
reconnects; `?session=` one session's events, ending after its `session_end`), `/evals` the runs of
`conclave eval` under `evals.dir`, `/eval?run=…` one run, `/eval/chart.svg?run=…` and
`/eval/results.jsonl?run=…` its chart and its results, `/static/…`. A run is named, never a path:
a name that is not one, or a run or file that is not there, is 404.

Mounted on `serve --http`, the page is handed the runtime's hub (`deliberation.live.LiveDeltas`),
and `/live?session=…` streams a session's answers as they come, as SSE `delta` events (`gap`
when the page fell behind and some were dropped), then `end` when the session ends. A session not
running in this process gets `end` at once; a malformed id, or a page without a hub (`conclave ui`
on its own), is 404. Deltas never reach the event log: `/live` is their only way to the page.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import Path

import anyio
import orjson
from aiohttp import web
from aiohttp.typedefs import Middleware

from conclave.app.tail import POLL_SECONDS, Filters, Follower, format_event, matches, parse_line
from conclave.app.ui import evalpages, model, pages, threads
from conclave.app.ui.evals import CHART_SVG, RESULTS, EvalRuns, inside
from conclave.app.ui.markup import Safe
from conclave.app.ui.sessions import Sessions
from conclave.deliberation.live import Gap, LiveDeltas, LiveItem
from conclave.deliberation.threads import SESSION_ID
from conclave.net.webguard import allowed_hosts, host_allowed, origin_allowed
from conclave.schema.config import Config

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cache-Control": "no-store",
}
STATIC = {"app.js": "text/javascript", "style.css": "text/css"}
KEEPALIVE_SECONDS = 15.0
FILE_CHUNK = 262_144
READ_METHODS = frozenset({"GET", "HEAD"})


SESSIONS = web.AppKey("sessions", Sessions)
LIVE = web.AppKey("live", LiveDeltas)
EVALS = web.AppKey("evals", EvalRuns)
CLOSING = web.AppKey("closing", anyio.Event)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def build_app(
    config: Config, *, bound_host: str = "127.0.0.1", prefix: str = "", live: LiveDeltas | None = None
) -> web.Application:
    """The page's application; `prefix` is where it will be mounted ("" at the root); `live`: the
    hub of the runtime serving it, whose running sessions' answers the page then shows as they
    stream in (none for `conclave ui`, a process of its own)."""
    app = web.Application(middlewares=[_guard(allowed_hosts(bound_host))])
    if live is not None:
        app[LIVE] = live
    app[SESSIONS] = Sessions(Path(config.telemetry.path), Path(config.transcripts.dir))
    app[EVALS] = EvalRuns(Path(config.evals.dir).expanduser())
    app[CLOSING] = anyio.Event()
    app.on_response_prepare.append(_secure)
    app.on_shutdown.append(_close_streams)
    files = {name: (resources.files("conclave.app.ui") / "static" / name).read_bytes() for name in STATIC}
    app.router.add_get("/", _sessions_handler(prefix))
    app.router.add_get("/session", _session_handler(prefix))
    app.router.add_get("/events", _events)
    app.router.add_get("/live", _live)
    app.router.add_get("/evals", _evals_handler(prefix))
    app.router.add_get("/eval", _eval_handler(prefix))
    app.router.add_get("/eval/chart.svg", _run_file(CHART_SVG, "image/svg+xml"))
    app.router.add_get("/eval/results.jsonl", _run_file(RESULTS, "application/x-ndjson", attachment=True))
    app.router.add_get("/static/{name}", _static_handler(files))
    return app


def mount(
    parent: web.Application, config: Config, *, bound_host: str, live: LiveDeltas | None = None
) -> None:
    """The page at `/ui/` of another application (`serve --http` with `server.ui: true`), with the
    hub of the runtime that application serves when it has one."""
    parent.add_subapp("/ui/", build_app(config, bound_host=bound_host, prefix="/ui", live=live))


# -- the guard and the headers ----------------------------------------------------------------


def _guard(allowed: frozenset[str]) -> Middleware:
    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method not in READ_METHODS:
            return _refuse(405, "This page is read-only.", allow="GET, HEAD")
        if not host_allowed(request.headers.get("host"), allowed):
            return _refuse(403, "Host not allowed: open this page at 127.0.0.1 or localhost.")
        if not origin_allowed(request.headers.get("origin"), allowed):
            return _refuse(403, "Origin not allowed.")
        return await handler(request)

    return guard


def _refuse(status: int, why: str, **headers: str) -> web.Response:
    return web.Response(status=status, text=why + "\n", headers=headers)


async def _secure(_request: web.Request, response: web.StreamResponse) -> None:
    response.headers.update(SECURITY_HEADERS)


async def _close_streams(app: web.Application) -> None:
    """A server stopping ends its event streams at once, instead of waiting them out."""
    app[CLOSING].set()


# -- pages ------------------------------------------------------------------------------------


def _sessions_handler(prefix: str) -> Handler:
    async def sessions(request: web.Request) -> web.StreamResponse:
        index = request.app[SESSIONS]
        offset = index.refresh()
        rows = index.recent()
        if request.query.get("fragment"):
            return _html(pages.sessions_table(rows, prefix))
        return _html(pages.sessions_page(rows, prefix, offset))

    return sessions


def _session_handler(prefix: str) -> Handler:
    async def session(request: web.Request) -> web.StreamResponse:
        index = request.app[SESSIONS]
        sid = request.query.get("id", "")
        offset = index.refresh()
        summary = index.summary(sid)
        if summary is None:
            return _html(
                pages.not_found(prefix, f"No session {sid!r} in the event log or the transcripts."), 404
            )
        transcript = None if summary.running else index.transcript(sid)
        thread = None
        if transcript is not None:
            view = model.from_transcript(summary, transcript)
            thread = threads.thread_of(index, transcript)
        else:
            view = model.from_events(summary, index.events(sid))
        if request.query.get("fragment"):  # a session that just ended: its thread comes with it
            return _html(pages.session_body(view, thread, prefix))
        live = request.app.get(LIVE)
        streaming = live is not None and summary.running and live.is_running(sid)
        return _html(pages.session_page(view, prefix, offset, streaming=streaming, thread=thread))

    return session


def _evals_handler(prefix: str) -> Handler:
    async def evals(request: web.Request) -> web.StreamResponse:
        index = request.app[EVALS]
        return _html(evalpages.evals_page(index.runs(), prefix, str(index.root)))

    return evals


def _eval_handler(prefix: str) -> Handler:
    async def eval_run(request: web.Request) -> web.StreamResponse:
        index = request.app[EVALS]
        name = request.query.get("run", "")
        run = index.run(name)
        if run is None:
            return _html(pages.not_found(prefix, f"No eval run {name!r} in {index.root}.", "evals"), 404)
        chart, results = (inside(run.folder, filename) is not None for filename in (CHART_SVG, RESULTS))
        return _html(evalpages.eval_page(run, prefix, chart=chart, results=results))

    return eval_run


def _run_file(filename: str, content_type: str, *, attachment: bool = False) -> Handler:
    """A file of a run, streamed: only `filename` of the folder `?run=` names, inside evals.dir."""

    async def run_file(request: web.Request) -> web.StreamResponse:
        name = request.query.get("run", "")
        path = request.app[EVALS].file(name, filename)
        if path is None:
            raise web.HTTPNotFound()
        headers = {"Content-Type": content_type}
        if attachment:  # the name is a run name (RUN_NAME): nothing to quote in it
            headers["Content-Disposition"] = f'attachment; filename="{name}-{filename}"'
        try:
            handle = path.open("rb")
        except OSError:
            raise web.HTTPNotFound() from None
        with handle:
            left = os.fstat(handle.fileno()).st_size  # what is sent, were the file to grow meanwhile
            stream = web.StreamResponse(headers=headers)
            stream.content_length = left
            await stream.prepare(request)
            while request.method != "HEAD" and left > 0 and (chunk := handle.read(min(left, FILE_CHUNK))):
                await stream.write(chunk)
                left -= len(chunk)
            await stream.write_eof()
        return stream

    return run_file


def _html(body: Safe, status: int = 200) -> web.Response:
    return web.Response(text=body, status=status, content_type="text/html", charset="utf-8")


def _static_handler(files: dict[str, bytes]) -> Handler:
    async def static(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in files:
            raise web.HTTPNotFound()
        return web.Response(body=files[name], content_type=STATIC[name], charset="utf-8")

    return static


# -- the live stream --------------------------------------------------------------------------


async def _events(request: web.Request) -> web.StreamResponse:
    """New events of the log as they are appended, each as an SSE `log` event whose data is the
    event and its `conclave tail` line; its id is the log offset to resume from."""
    index = request.app[SESSIONS]
    session = request.query.get("session")
    filters = Filters(sessions=(session,)) if session else Filters(events=("session_start", "session_end"))
    follower = Follower(index.log, _start(request, index))
    stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await stream.prepare(request)
    await stream.write(b"retry: 1000\n\n")
    closing = request.app[CLOSING]
    quiet = 0.0
    while not closing.is_set():
        ended = False
        for raw in follower.poll():
            event = parse_line(raw)
            if event is None or not matches(event, filters):
                continue
            await stream.write(_sse(event, follower.offset - len(follower.partial)))
            ended = ended or (
                bool(session) and event.get("event") == "session_end" and event.get("session_id") == session
            )
            quiet = 0.0
        if ended:
            await stream.write(b"event: end\ndata: {}\n\n")
            break
        if quiet >= KEEPALIVE_SECONDS:  # a comment: proxies keep the line open, a gone reader is noticed
            await stream.write(b": keepalive\n\n")
            quiet = 0.0
        await anyio.sleep(POLL_SECONDS)
        quiet += POLL_SECONDS
    return stream


async def _live(request: web.Request) -> web.StreamResponse:
    """One running session's answers as they stream in: SSE `delta` events (`{provider, role,
    kind, text, index}`), `gap` (`{dropped}`) where this reader fell behind, then `end` when the
    session ends (at once, for a session not running in this process). Never waits on the
    providers: a slow reader only loses deltas, and is told how many."""
    live = request.app.get(LIVE)
    if live is None:
        raise web.HTTPNotFound(
            text="No live answers here: they stream to the page served by `conclave serve --http`.\n"
        )
    session_id = request.query.get("session", "")
    if not SESSION_ID.fullmatch(session_id):
        raise web.HTTPNotFound(text="Not a session id.\n")
    async with live.subscribe(session_id) as heard:
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
        if request.method == "HEAD":
            return stream
        lock = anyio.Lock()
        async with anyio.create_task_group() as group:

            async def send(data: bytes) -> None:
                async with lock:
                    try:
                        await stream.write(data)
                    except ConnectionError:  # the reader is gone
                        group.cancel_scope.cancel()

            group.start_soon(_keepalive, send)
            group.start_soon(_cancel_when, request.app[CLOSING], group.cancel_scope)
            async for item in heard:
                await send(_live_sse(item))
            await send(b"event: end\ndata: {}\n\n")
            group.cancel_scope.cancel()
    return stream


async def _keepalive(send: Callable[[bytes], Awaitable[None]]) -> None:
    """A comment now and then: proxies keep the line open, and a gone reader is noticed."""
    while True:
        await anyio.sleep(KEEPALIVE_SECONDS)
        await send(b": keepalive\n\n")


async def _cancel_when(event: anyio.Event, scope: anyio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


def _live_sse(item: LiveItem) -> bytes:
    if isinstance(item, Gap):
        return b"event: gap\ndata: %s\n\n" % orjson.dumps({"dropped": item.dropped})
    provider, role, delta = item
    data = {"provider": provider, "role": role, "kind": delta.kind, "text": delta.text, "index": delta.index}
    return b"event: delta\ndata: %s\n\n" % orjson.dumps(data)


def _start(request: web.Request, index: Sessions) -> int:
    """Where the stream starts: where the browser's last stream stopped, else where the page it
    shows was read up to, else the end of the log now."""
    for value in (request.headers.get("last-event-id"), request.query.get("from")):
        if value and value.isdigit():
            return int(value)
    return index.refresh()


def _sse(event: dict[str, object], offset: int) -> bytes:
    data = orjson.dumps(
        {"event": event.get("event"), "session_id": event.get("session_id"), "line": format_event(event)}
    )
    return b"event: log\nid: %d\ndata: %s\n\n" % (offset, data)


# -- `conclave ui` ----------------------------------------------------------------------------


async def run_ui(config: Config, host: str, port: int) -> None:
    """Serve the page until cancelled; prints where it is (the port, when 0 was asked)."""
    runner = web.AppRunner(
        build_app(config, bound_host=host), access_log=None, handler_cancellation=True, shutdown_timeout=1.0
    )
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        bound = runner.addresses[0][1] if runner.addresses else port
        shown = f"[{host}]" if ":" in host else host
        print(
            f"conclave ui: http://{shown}:{bound}/  (read-only; Ctrl-C to stop)", file=sys.stderr, flush=True
        )
        await anyio.sleep_forever()
    finally:
        await runner.cleanup()
