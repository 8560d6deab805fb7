"""The JSON-RPC 2.0 / MCP server: framing, dispatch, the tool surface, stdio and HTTP transports."""

from __future__ import annotations

from conclave.schema.config import Config


async def serve_stdio(config: Config) -> None:
    """Serve MCP and plain JSON-RPC on stdin/stdout until stdin closes."""
    from conclave.app.server.stdio import run_stdio

    await run_stdio(config)


async def serve_http(config: Config, host: str, port: int, worker_of: int | None = None) -> None:
    """Serve MCP Streamable HTTP on /mcp and plain JSON-RPC on POST /rpc until cancelled;
    `worker_of`: as a worker of `serve --workers` whose supervisor has this pid."""
    from conclave.app.server.http import run_http

    await run_http(config, host, port, worker_of=worker_of)
