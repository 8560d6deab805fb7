"""The two MCP eras a request can belong to (docs/server.md#mcp-both-eras), and what the stateless
one asks of a server.

- **Handshake** (2025-11-25 and older): `initialize` opens a session; requests carry no version.
- **Stateless** (2026-07-28): every request carries its protocol version and the client's
  capabilities in `params._meta`; there is no `initialize`, `ping` or session, every result says
  its `resultType`, list results carry caching hints, and `server/discover` tells a client what
  the server speaks.

The era is chosen per message: a request whose `_meta` names a protocol version is stateless.
This module reads and checks that metadata, and shapes what a stateless request gets back; the
server (`core`) dispatches, and the HTTP transport adds its header checks and status codes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from conclave.app.server.jsonrpc import INVALID_PARAMS, METHOD_NOT_FOUND, RpcError
from conclave.core.records import record
from conclave.core.version import __version__

HANDSHAKE_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
STATELESS_VERSIONS = ("2026-07-28",)
ALL_VERSIONS = (*STATELESS_VERSIONS, *HANDSHAKE_VERSIONS)

PROTOCOL_VERSION = "io.modelcontextprotocol/protocolVersion"
CLIENT_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
SERVER_INFO = "io.modelcontextprotocol/serverInfo"
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"

HEADER_MISMATCH = -32020
MISSING_CLIENT_CAPABILITY = -32021
UNSUPPORTED_PROTOCOL_VERSION = -32022
# Errors a stateless request gets over HTTP with a status of their own, not 200.
HTTP_STATUS = {
    INVALID_PARAMS: 400,
    HEADER_MISMATCH: 400,
    MISSING_CLIENT_CAPABILITY: 400,
    UNSUPPORTED_PROTOCOL_VERSION: 400,
    METHOD_NOT_FOUND: 404,
}

TASK_METHODS = frozenset({"tasks/get", "tasks/update", "tasks/cancel"})
RESOURCE_METHODS = frozenset({"resources/list", "resources/templates/list", "resources/read"})
STATELESS_METHODS = frozenset(
    {"server/discover", "tools/list", "tools/call", *TASK_METHODS, *RESOURCE_METHODS}
)
# Conclave's tools and their descriptions never change while it runs: lists stay fresh an hour.
LIST_TTL_MS = 3_600_000
# The sessions are people's questions and answers, and a new one can come with any call: stale at
# once, and never for a cache shared between callers.
SESSIONS_TTL_MS = 0
SESSIONS_SCOPE = "private"
# What the server offers in both eras (`initialize`, `server/discover`); subscriptions are not served.
CAPABILITIES: Mapping[str, Any] = {"tools": {"listChanged": False}, "resources": {"listChanged": False}}
SERVER_IDENTITY = {"name": "conclave", "title": "Conclave", "version": __version__}


@record
class Stateless:
    """What a stateless request said about itself in `_meta`."""

    version: str
    client_capabilities: Mapping[str, Any]
    meta: Mapping[str, Any]

    def declares_extension(self, name: str) -> bool:
        extensions = self.client_capabilities.get("extensions")
        return isinstance(extensions, Mapping) and name in extensions


def meta_of(params: Any) -> Mapping[str, Any] | None:
    meta = params.get("_meta") if isinstance(params, Mapping) else None
    return meta if isinstance(meta, Mapping) else None


def is_stateless(params: Any) -> bool:
    """A request is served statelessly when its `_meta` names a protocol version."""
    meta = meta_of(params)
    return meta is not None and PROTOCOL_VERSION in meta


def stateless_context(params: Any) -> Stateless:
    """The request's own protocol fields, checked: missing or malformed ones are -32602, a
    version this server does not speak is -32022 with the versions it does."""
    meta = meta_of(params)
    if meta is None:
        raise RpcError(INVALID_PARAMS, "Invalid params: a request of revision 2026-07-28 needs params._meta")
    version = meta.get(PROTOCOL_VERSION)
    if not isinstance(version, str):
        raise RpcError(INVALID_PARAMS, f"Invalid params: _meta needs {PROTOCOL_VERSION} (a string)")
    capabilities = meta.get(CLIENT_CAPABILITIES)
    if not isinstance(capabilities, Mapping):
        raise RpcError(INVALID_PARAMS, f"Invalid params: _meta needs {CLIENT_CAPABILITIES} (an object)")
    if version not in STATELESS_VERSIONS:
        raise unsupported_version(version)
    return Stateless(version, capabilities, meta)


def unsupported_version(requested: str) -> RpcError:
    return RpcError(
        UNSUPPORTED_PROTOCOL_VERSION,
        f"Unsupported protocol version {requested!r}; supported: {', '.join(ALL_VERSIONS)}",
        {"supported": list(ALL_VERSIONS), "requested": requested},
    )


def missing_extension(extension: str, method: str) -> RpcError:
    return RpcError(
        MISSING_CLIENT_CAPABILITY,
        f"Missing required client capability: {method} needs the {extension} extension declared",
        {"requiredCapabilities": {"extensions": {extension: {}}}},
    )


def complete(
    result: Mapping[str, Any], *, cacheable: bool = False, ttl_ms: int = LIST_TTL_MS, scope: str = "public"
) -> dict[str, Any]:
    """A stateless result: its `resultType`, the server's identity, and caching hints on what can
    be cached (lists and reads)."""
    out = {**result, "resultType": result.get("resultType", "complete")}
    out["_meta"] = {**(result.get("_meta") or {}), SERVER_INFO: SERVER_IDENTITY}
    if cacheable:
        out.update(ttlMs=ttl_ms, cacheScope=scope)
    return out


def sessions_result(result: Mapping[str, Any]) -> dict[str, Any]:
    """A stateless result that shows sessions (`resources/list`, `resources/read`)."""
    return complete(result, cacheable=True, ttl_ms=SESSIONS_TTL_MS, scope=SESSIONS_SCOPE)


def discover(instructions: str, *, tasks: bool) -> dict[str, Any]:
    """`server/discover`: the versions, capabilities and identity, before anything else."""
    capabilities: dict[str, Any] = {name: dict(offer) for name, offer in CAPABILITIES.items()}
    if tasks:
        capabilities["extensions"] = {TASKS_EXTENSION: {}}
    result = {
        "supportedVersions": list(ALL_VERSIONS),
        "capabilities": capabilities,
        "instructions": instructions,
    }
    return complete(result, cacheable=True)
