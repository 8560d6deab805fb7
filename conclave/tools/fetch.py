"""`fetch`: one http(s) URL under the session's policies, every check made before a byte is sent.

Per hop: parse and normalize the URL (scheme, port, numeric host spellings) -> host allowlist
-> resolve the name off the event loop and vet EVERY address -> per-host breaker -> egress
budget -> connect to the vetted address itself (Host header and TLS SNI carry the name, so a
rebinding DNS answer has no window) -> redirects re-enter at the top, at most
`fetch.max_redirects`, credentials dropped when the origin changes. Bodies are decoded by
hand (identity or gzip only) so `max_bytes` bounds the decoded size and a gzip bomb cannot
inflate past it.
"""

from __future__ import annotations

import base64
import hashlib
import zlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any
from urllib.parse import urljoin

import anyio
import httpx

from conclave.core.breaker import CircuitBreaker
from conclave.core.budgets import EgressBudget, EgressExhausted
from conclave.core.errors import BreakerOpen, ToolRefused
from conclave.net.http import TransportError
from conclave.tools.context import IPAddress, ToolContext
from conclave.tools.html_text import html_to_text
from conclave.tools.netguard import (
    Blocked,
    Target,
    check_address,
    host_allowed,
    origin_changed,
    parse_networks,
)
from conclave.tools.netguard import parse_url as guard_parse_url

USER_AGENT = "conclave-fetch/0.1 (+https://github.com/conclave)"
ACCEPT = "text/html, application/xhtml+xml, application/json, text/plain;q=0.9, */*;q=0.1"
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
_TEXT_TYPES = (
    "text/",
    "application/json",
    "application/xml",
    "application/xhtml+xml",
    "application/javascript",
    "application/x-ndjson",
)
_TEXT_SUFFIXES = ("+json", "+xml")


@dataclass(frozen=True, slots=True)
class _Body:
    status: int
    content_type: str | None
    data: bytes
    truncated: bool


async def fetch(args: Mapping[str, Any], ctx: ToolContext) -> dict[str, Any]:
    policy = ctx.config.fetch
    url = str(args["url"])
    limit = min(int(args.get("max_bytes") or policy.max_bytes), policy.max_bytes)
    budget = ctx.egress(args.get("session_id"))
    started = ctx.clock()
    try:
        with anyio.fail_after(policy.total_timeout_seconds):
            final, body, redirects = await _follow(url, limit, budget, ctx)
    except TimeoutError:
        raise _refused(
            ctx, "timeout", f"no complete answer within {policy.total_timeout_seconds:g}s", url
        ) from None
    except Blocked as exc:
        raise _refused(ctx, exc.reason, exc.detail, url) from None
    except EgressExhausted as exc:
        ctx.telemetry.emit(
            "egress_budget_exhausted",
            tool="fetch",
            used_bytes=budget.used_bytes,
            max_bytes=budget.max_bytes,
            requests=budget.requests,
            max_requests=budget.max_requests,
        )
        raise _refused(ctx, exc.reason, exc.message, url) from None
    result = _result(url, final, body, redirects)
    ctx.telemetry.emit(
        "fetch",
        host=final.host,
        status=body.status,
        bytes=len(body.data),
        truncated=body.truncated,
        redirects=redirects,
        duration_ms=round((ctx.clock() - started) * 1000, 3),
    )
    return result


def render_fetch(result: Mapping[str, Any]) -> str:
    cut = " (truncated)" if result["truncated"] else ""
    head = (
        f"{result['status']} {result['final_url']} [{result['content_type']}, {result['bytes']} bytes{cut}]"
    )
    return f"{head}\n\n{result['text']}"


async def _follow(url: str, limit: int, budget: EgressBudget, ctx: ToolContext) -> tuple[Target, _Body, int]:
    policy = ctx.config.fetch
    target = guard_parse_url(url, allow_ports=policy.allow_ports)
    credentials = target.userinfo
    for redirects in range(policy.max_redirects + 1):
        address = await _vet(target, ctx)
        breaker = _breaker(ctx, target.host)
        await budget.take_request()
        location, body = await _exchange(
            target, address, credentials, min(limit, budget.bytes_left()), ctx, breaker
        )
        if location is None:
            await budget.add_bytes(len(body.data))
            return target, body, redirects
        following = guard_parse_url(urljoin(target.url(), location), allow_ports=policy.allow_ports)
        if origin_changed(target, following):
            credentials = None
        target = following
    raise Blocked("too_many_redirects", f"more than {policy.max_redirects} redirects")


async def _vet(target: Target, ctx: ToolContext) -> IPAddress:
    """Allowlist, then every address the host has must pass; connect to the first."""
    policy = ctx.config.fetch
    if not host_allowed(target.host, policy.allow_hosts):
        raise Blocked("host_not_allowed", f"{target.host} is not in fetch.allow_hosts")
    addresses = [target.ip] if target.ip is not None else await _resolve(target, ctx)
    allowed_private = _networks(policy.allow_private)
    for address in addresses:
        check_address(address, allow_private=allowed_private)
    return addresses[0]


async def _resolve(target: Target, ctx: ToolContext) -> list[IPAddress]:
    try:
        addresses = await ctx.resolver(target.host, target.port)
    except OSError as exc:
        raise Blocked("unresolvable_host", f"{target.host} does not resolve ({exc})") from None
    if not addresses:
        raise Blocked("unresolvable_host", f"{target.host} has no addresses")
    return addresses


def _breaker(ctx: ToolContext, host: str) -> CircuitBreaker:
    breaker = ctx.host_breaker(host)
    try:
        breaker.check()
    except BreakerOpen as exc:
        raise Blocked("breaker_open", exc.message) from None
    return breaker


async def _exchange(
    target: Target,
    address: IPAddress,
    credentials: tuple[str, str] | None,
    limit: int,
    ctx: ToolContext,
    breaker: CircuitBreaker,
) -> tuple[str | None, _Body]:
    """One HTTP GET to the vetted address. Returns (redirect location, body)."""
    request = _request(target, address, credentials, ctx)
    try:
        response = await ctx.http.send(request, stream=True)
        try:
            location = response.headers.get("location")
            if response.status_code in REDIRECT_STATUSES and location:
                breaker.record_success()
                return location, _Body(response.status_code, None, b"", False)
            try:
                content_type = _check_content(response)
                data, truncated = await _read_decoded(response, limit)
            except Blocked:
                breaker.record_success()  # the host answered; what it sent is what we refuse
                raise
        finally:
            await response.aclose()
    except TransportError as exc:
        breaker.record_failure()
        reason = "timeout" if exc.failure == "timeout" else "connection_error"
        raise Blocked(reason, f"{target.host}: {exc.failure.replace('_', ' ')}") from None
    breaker.record_success()
    return None, _Body(response.status_code, content_type, data, truncated)


def _request(
    target: Target, address: IPAddress, credentials: tuple[str, str] | None, ctx: ToolContext
) -> httpx.Request:
    policy = ctx.config.fetch
    headers = {
        "host": target.host_header(),
        "user-agent": USER_AGENT,
        "accept": ACCEPT,
        "accept-encoding": "identity, gzip",
    }
    extensions: dict[str, Any] = {}
    if target.scheme == "https":
        extensions["sni_hostname"] = target.host
    request = ctx.http.build_request(
        "GET",
        target.connect_url(address),
        headers=headers,
        extensions=extensions,
        timeout=httpx.Timeout(policy.read_timeout_seconds, connect=policy.connect_timeout_seconds),
    )
    if credentials is not None:
        token = base64.b64encode(":".join(credentials).encode("utf-8")).decode("ascii")
        request.headers["authorization"] = f"Basic {token}"
    return request


def _check_content(response: httpx.Response) -> str | None:
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("identity", "gzip", "x-gzip", ""):
        raise Blocked("unsupported_content_type", f"content-encoding {encoding!r} was not offered")
    content_type: str | None = response.headers.get("content-type")
    if content_type is None:
        return None
    media = content_type.split(";", 1)[0].strip().lower()
    if media.startswith(_TEXT_TYPES) or media.endswith(_TEXT_SUFFIXES):
        return content_type
    raise Blocked(
        "unsupported_content_type", f"{media} is not text; only text, HTML, JSON and XML are fetched"
    )


async def _read_decoded(response: httpx.Response, limit: int) -> tuple[bytes, bool]:
    """Up to `limit` decoded bytes; `truncated` when the body had more."""
    gzip = response.headers.get("content-encoding", "").strip().lower() in ("gzip", "x-gzip")
    decoded = bytearray()
    async for chunk in _decoded_chunks(response.aiter_raw(), gzip, limit + 1):
        decoded += chunk
        if len(decoded) > limit:
            return bytes(decoded[:limit]), True
    if response.headers.get("content-type") is None and b"\x00" in decoded[:4096]:
        raise Blocked("unsupported_content_type", "the body is binary and carries no content type")
    return bytes(decoded), False


async def _decoded_chunks(raw: AsyncIterator[bytes], gzip: bool, want: int) -> AsyncIterator[bytes]:
    """Decode incrementally, never inflating more than `want` bytes from what has arrived."""
    if not gzip:
        async for chunk in raw:
            yield chunk
        return
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    produced = 0
    async for chunk in raw:
        pending = chunk
        while pending and produced < want:
            try:
                out = inflater.decompress(pending, want - produced)
            except zlib.error as exc:
                raise Blocked("connection_error", f"corrupt gzip body ({exc})") from None
            produced += len(out)
            pending = inflater.unconsumed_tail
            if out:
                yield out
        if produced >= want or inflater.eof:
            return


def _result(url: str, final: Target, body: _Body, redirects: int) -> dict[str, Any]:
    return {
        "url": url,
        "final_url": final.url(),
        "status": body.status,
        "content_type": body.content_type,
        "bytes": len(body.data),
        "truncated": body.truncated,
        "sha256": hashlib.sha256(body.data).hexdigest(),
        "text": _as_text(body),
        "redirects": redirects,
    }


def _as_text(body: _Body) -> str:
    charset = "utf-8"
    media = ""
    if body.content_type:
        media = body.content_type.split(";", 1)[0].strip().lower()
        for param in body.content_type.split(";")[1:]:
            name, _, value = param.strip().partition("=")
            if name.lower() == "charset" and value:
                charset = value.strip("\"' ")
    try:
        text = body.data.decode(charset, errors="replace")
    except LookupError:
        text = body.data.decode("utf-8", errors="replace")
    return html_to_text(text) if media in ("text/html", "application/xhtml+xml") else text


def _refused(ctx: ToolContext, reason: str, detail: str, url: str) -> ToolRefused:
    ctx.telemetry.emit("fetch_blocked", reason=reason, detail=detail, host=_host_of(url))
    return ToolRefused(f"fetch refused ({reason}): {detail}", reason=reason, tool="fetch")


def _host_of(url: str) -> str | None:
    try:
        return httpx.URL(url).host or None
    except (httpx.InvalidURL, ValueError, TypeError):
        return None


@cache
def _networks(entries: tuple[str, ...]) -> tuple[Any, ...]:
    return parse_networks(entries)
