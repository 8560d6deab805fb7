"""A one-page web site on a loopback port, for `fetch` to reach with no network: the demo's
members fetch it, and `conclave.SimulatedPanel` offers it to a first Python example."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Final

from aiohttp import web

LIGHTHOUSE_PAGE: Final = """<!doctype html>
<html><head><title>Exampleville lighthouse</title></head>
<body><h1>Exampleville lighthouse</h1>
<p>The Exampleville lighthouse is 47 metres tall. It was first lit in 1893.</p></body></html>
"""


@contextlib.asynccontextmanager
async def page_server(text: str = LIGHTHOUSE_PAGE, path: str = "/lighthouse") -> AsyncIterator[int]:
    """Serve `text` as HTML at `path` on an ephemeral 127.0.0.1 port; yields the port."""

    async def page(_request: web.Request) -> web.Response:
        return web.Response(text=text, content_type="text/html")

    app = web.Application()
    app.router.add_get(path, page)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield int(runner.addresses[0][1])
    finally:
        await runner.cleanup()
