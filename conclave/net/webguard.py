"""What a local web server of Conclave's accepts from a browser: the DNS-rebinding defence shared by
`serve --http` (its `/mcp` and `/rpc`) and the page of `conclave ui`.

A page on another site must not reach a server on this machine. Two headers say where a request
comes from: `Origin` (sent by browsers on cross-origin and state-changing requests) names the page
that made it, and `Host` names the site the browser thinks it is talking to. A rebinding attack
points its own domain at 127.0.0.1, so its requests arrive with its domain in `Host` even when they
carry no `Origin`. Both are checked by host name against the same set: the loopback names and the
address the server was bound to.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


def is_loopback(host: str) -> bool:
    """Whether a server bound to `host` is reachable from this machine alone."""
    name = host.lower().strip("[]")
    if name in LOOPBACK_HOSTS or name == "localhost.localdomain":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve anywhere


def allowed_hosts(bound_host: str) -> frozenset[str]:
    """The host names a request may name: loopback, and the address the server listens on
    (a wildcard bind such as 0.0.0.0 names no host a browser would send, so adds nothing)."""
    return LOOPBACK_HOSTS | {bound_host.lower().strip("[]")}


def origin_allowed(origin: str | None, allowed: frozenset[str]) -> bool:
    """No `Origin` (a non-browser client, or a same-origin navigation) is allowed; an `Origin`
    must name an allowed host. `null` (a sandboxed or file page) names none."""
    if origin is None:
        return True
    try:
        host = urlsplit(origin).hostname
    except ValueError:
        return False
    return (host or "").lower() in allowed


def host_allowed(host: str | None, allowed: frozenset[str]) -> bool:
    """The `Host` header, with or without its port, must name an allowed host; HTTP/1.1 requires
    one, so a request without it is refused too."""
    if not host:
        return False
    try:
        name = urlsplit(f"//{host}").hostname
    except ValueError:
        return False
    return (name or "").lower() in allowed
