"""`fetch` against local HTTP servers the tests start, with a resolver the tests control."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import ipaddress
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from conclave.app.runtime import Runtime, open_runtime
from conclave.core.errors import InvalidArguments, ToolRefused
from conclave.net.http import MemoryTransport, Transport
from conclave.schema.config import Config
from conclave.schema.schemas import first_error
from tests.support import read_events

pytestmark = pytest.mark.anyio

IP = ipaddress.ip_address
PUBLIC = "93.184.216.34"

FAKE_DNS: dict[str, list[str]] = {
    "evil.example": ["127.0.0.1"],
    "metadata.example": ["169.254.169.254"],
    "azure.example": ["168.63.129.16"],
    "mixed.example": [PUBLIC, "10.0.0.7"],
    "v6.example": ["::1"],
    "mapped.example": ["::ffff:127.0.0.1"],
    "localhost": ["127.0.0.1", "::1"],
}


async def fake_resolver(host: str, port: int) -> list[Any]:
    if host not in FAKE_DNS:
        raise OSError(f"[Errno -2] Name or service not known: {host}")
    return [IP(a) for a in FAKE_DNS[host]]


class Site:
    """A local web server with the pages the tests need; counts every request it gets."""

    def __init__(self) -> None:
        self.hits: list[web.Request] = []
        self.port = 0
        self.app = web.Application()
        self.app.router.add_route("*", "/{tail:.*}", self.handle)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.hits.append(request)
        page = request.match_info["tail"]
        handler = getattr(self, f"page_{page.replace('-', '_')}", None)
        if handler is None:
            return web.Response(status=404, text="no such page")
        result: web.StreamResponse = await handler(request)
        return result

    HTML = (
        "<html><head><title>Evidence</title><style>p{color:red}</style>"
        "<script>var secret = 1;</script></head><body><h1>Findings</h1>"
        "<p>The answer is <b>42</b> &amp; rising.</p><noscript>enable js</noscript></body></html>"
    )

    async def page_html(self, _r: web.Request) -> web.Response:
        return web.Response(text=self.HTML, content_type="text/html")

    async def page_json(self, _r: web.Request) -> web.Response:
        return web.json_response({"answer": 42})

    async def page_text(self, _r: web.Request) -> web.Response:
        return web.Response(text="plain words", content_type="text/plain", charset="utf-8")

    async def page_latin1(self, _r: web.Request) -> web.Response:
        return web.Response(
            body="café".encode("latin-1"), headers={"content-type": "text/plain; charset=iso-8859-1"}
        )

    async def page_status_500(self, _r: web.Request) -> web.Response:
        return web.Response(status=500, text="broken")

    async def page_png(self, _r: web.Request) -> web.Response:
        return web.Response(body=b"\x89PNG\r\n\x1a\n" + bytes(100), content_type="image/png")

    async def page_brotli(self, _r: web.Request) -> web.Response:
        return web.Response(body=b"xx", headers={"content-type": "text/plain", "content-encoding": "br"})

    async def page_gzip_bomb(self, _r: web.Request) -> web.Response:
        bomb = gzip.compress(b"\0" * (20 * 1024 * 1024), compresslevel=9)
        return web.Response(body=bomb, headers={"content-type": "text/plain", "content-encoding": "gzip"})

    async def page_gzip_small(self, _r: web.Request) -> web.Response:
        return web.Response(
            body=gzip.compress(b"zipped text"),
            headers={"content-type": "text/plain", "content-encoding": "gzip"},
        )

    async def page_endless(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/plain"})
        await response.prepare(request)
        try:
            for _ in range(100_000):  # bounded: stops by itself after ~6 MB if nobody hangs up
                await response.write(b"x" * 64)
        except (ConnectionResetError, RuntimeError):
            pass
        return response

    async def page_slow(self, _r: web.Request) -> web.Response:
        await asyncio.sleep(1.5)
        return web.Response(text="late")

    async def page_redirect(self, request: web.Request) -> web.Response:
        raise web.HTTPFound(request.query["to"])

    async def page_loop(self, _r: web.Request) -> web.Response:
        raise web.HTTPFound("/loop")

    async def page_echo_auth(self, request: web.Request) -> web.Response:
        return web.Response(
            text=f"auth={request.headers.get('authorization', 'none')} host={request.headers.get('host')}",
            content_type="text/plain",
        )


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    server = Site()
    runner = web.AppRunner(server.app, access_log=None)
    await runner.setup()
    tcp = web.TCPSite(runner, "127.0.0.1", 0)
    await tcp.start()
    server.port = tcp._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield server
    finally:
        await runner.cleanup()


@pytest.fixture
def runtime_for(make_config: Callable[..., Config], site: Site) -> Callable[..., Any]:
    """Open a Runtime whose fetch policy allows the local site's port (and, if asked, 127.0.0.1)."""

    def open_for(
        *,
        private: bool = True,
        transport: Transport | None = None,
        resolver: Any = fake_resolver,
        **fetch: Any,
    ) -> Any:
        policy = {
            "allow_ports": [80, 443, site.port],
            "allow_private": ["127.0.0.1/32"] if private else [],
            "read_timeout_seconds": 1,
            "total_timeout_seconds": 5,
            **fetch,
        }
        config = make_config(
            {"p": {"kind": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1"}},
            fetch=policy,
            breakers={"failure_threshold": 2},
        )
        return open_runtime(config, transport=transport, resolver=resolver)

    return open_for


async def fetch(runtime: Runtime, url: str, **args: Any) -> dict[str, Any]:
    result = await runtime.call_tool("fetch", {"url": url, **args})
    assert first_error("fetch.output.json", result) is None
    return result


async def refused(runtime: Runtime, url: str, **args: Any) -> ToolRefused:
    with pytest.raises(ToolRefused) as info:
        await runtime.call_tool("fetch", {"url": url, **args})
    return info.value


# -- the happy paths ---------------------------------------------------------------------------


async def test_html_is_reduced_to_readable_text(site: Site, runtime_for: Callable[..., Any]) -> None:
    async with runtime_for() as rt:
        result = await fetch(rt, f"http://127.0.0.1:{site.port}/html")
    assert result["status"] == 200
    assert result["content_type"].startswith("text/html")
    assert "Findings" in result["text"] and "The answer is 42 & rising." in result["text"]
    assert "Evidence" in result["text"]
    assert (
        "secret" not in result["text"]
        and "color:red" not in result["text"]
        and "enable js" not in result["text"]
    )
    assert result["truncated"] is False
    body = site.hits[0]
    assert body.headers["accept-encoding"] == "identity, gzip"
    assert result["sha256"] == hashlib.sha256(Site.HTML.encode()).hexdigest()


async def test_json_and_plain_text_pass_through(site: Site, runtime_for: Callable[..., Any]) -> None:
    async with runtime_for() as rt:
        assert (await fetch(rt, f"http://127.0.0.1:{site.port}/json"))["text"] == '{"answer": 42}'
        text = await fetch(rt, f"http://127.0.0.1:{site.port}/text")
    assert text["text"] == "plain words"
    assert text["sha256"] == hashlib.sha256(b"plain words").hexdigest()
    assert text["bytes"] == len("plain words")


async def test_declared_charset_is_honoured(site: Site, runtime_for: Callable[..., Any]) -> None:
    async with runtime_for() as rt:
        assert (await fetch(rt, f"http://127.0.0.1:{site.port}/latin1"))["text"] == "café"


async def test_gzip_bodies_are_decoded(site: Site, runtime_for: Callable[..., Any]) -> None:
    async with runtime_for() as rt:
        assert (await fetch(rt, f"http://127.0.0.1:{site.port}/gzip-small"))["text"] == "zipped text"


async def test_an_http_error_status_is_a_result_not_a_refusal(
    site: Site, runtime_for: Callable[..., Any]
) -> None:
    async with runtime_for() as rt:
        result = await fetch(rt, f"http://127.0.0.1:{site.port}/status-500")
    assert (result["status"], result["text"]) == (500, "broken")


async def test_a_completed_fetch_leaves_an_event_without_the_body(
    site: Site, runtime_for: Callable[..., Any], events_path: Path
) -> None:
    async with runtime_for() as rt:
        await fetch(rt, f"http://127.0.0.1:{site.port}/text", session_id="s-1")
    event = next(e for e in read_events(events_path) if e["event"] == "fetch")
    assert (event["host"], event["status"], event["bytes"], event["session_id"]) == (
        "127.0.0.1",
        200,
        11,
        "s-1",
    )
    assert "plain words" not in events_path.read_text()


# -- the SSRF corpus: every one refused with its reason, and the local server never hit -------


def corpus(port: int) -> list[tuple[str, str]]:
    p = port
    return [
        (f"http://127.0.0.1:{p}/json", "private_address"),
        (f"http://localhost:{p}/json", "private_address"),
        (f"http://localhost.:{p}/json", "private_address"),
        (f"http://LOCALHOST:{p}/json", "private_address"),
        (f"http://[::1]:{p}/json", "private_address"),
        (f"http://0.0.0.0:{p}/json", "private_address"),
        (f"http://[::]:{p}/json", "private_address"),
        (f"http://2130706433:{p}/json", "private_address"),
        (f"http://0x7f000001:{p}/json", "private_address"),
        (f"http://0177.0.0.1:{p}/json", "private_address"),
        (f"http://127.1:{p}/json", "private_address"),
        (f"http://0x7f.1:{p}/json", "private_address"),
        (f"http://017700000001:{p}/json", "private_address"),
        (f"http://127.0.0.1.:{p}/json", "private_address"),
        (f"http://[::ffff:127.0.0.1]:{p}/json", "private_address"),
        (f"http://[::ffff:7f00:1]:{p}/json", "private_address"),
        (f"http://[2002:7f00:1::]:{p}/json", "private_address"),
        (f"http://[64:ff9b::7f00:1]:{p}/json", "private_address"),
        (f"http://evil.example:{p}/json", "private_address"),
        (f"http://v6.example:{p}/json", "private_address"),
        (f"http://mapped.example:{p}/json", "private_address"),
        (f"http://mixed.example:{p}/json", "private_address"),
        (f"http://allowed.example@127.0.0.1:{p}/json", "private_address"),
        (f"http://10.0.0.1:{p}/", "private_address"),
        (f"http://192.168.1.1:{p}/", "private_address"),
        (f"http://172.16.0.1:{p}/", "private_address"),
        (f"http://100.64.0.1:{p}/", "private_address"),
        (f"http://[fe80::1]:{p}/", "private_address"),
        (f"http://[fc00::1]:{p}/", "private_address"),
        (f"http://198.18.0.1:{p}/", "private_address"),
        (f"http://192.0.2.10:{p}/", "private_address"),
        (f"http://224.0.0.1:{p}/", "private_address"),
        (f"http://169.254.169.254:{p}/latest/meta-data/", "metadata_address"),
        (f"http://2852039166:{p}/latest/meta-data/", "metadata_address"),
        (f"http://0xa9fea9fe:{p}/", "metadata_address"),
        (f"http://[::ffff:169.254.169.254]:{p}/", "metadata_address"),
        (f"http://168.63.129.16:{p}/", "metadata_address"),
        (f"http://100.100.100.200:{p}/", "metadata_address"),
        (f"http://[fd00:ec2::254]:{p}/", "metadata_address"),
        (f"http://metadata.example:{p}/", "metadata_address"),
        (f"http://azure.example:{p}/", "metadata_address"),
        ("file:///etc/passwd", "scheme_not_allowed"),
        ("gopher://127.0.0.1:70/_x", "scheme_not_allowed"),
        ("ftp://example.org/", "scheme_not_allowed"),
        ("data:text/plain,hello", "scheme_not_allowed"),
        (f"//127.0.0.1:{p}/", "scheme_not_allowed"),
        (f"http://{PUBLIC}:22/", "port_not_allowed"),
        (f"http://nx.example:{p}/", "unresolvable_host"),
    ]


async def test_ssrf_corpus_is_refused_with_the_right_reason_before_any_byte_is_sent(
    site: Site, runtime_for: Callable[..., Any], events_path: Path
) -> None:
    cases = corpus(site.port)
    assert len(cases) >= 40
    outcomes = {}
    async with runtime_for(private=False) as rt:
        for url, _reason in cases:
            try:
                await rt.call_tool("fetch", {"url": url})
                outcomes[url] = "FETCHED"
            except ToolRefused as exc:
                outcomes[url] = exc.reason
    wrong = {
        url: (got, want) for (url, want), got in zip(cases, outcomes.values(), strict=True) if got != want
    }
    assert wrong == {}
    assert site.hits == [], "a refused fetch must not reach the server"
    blocked = [e for e in read_events(events_path) if e["event"] == "fetch_blocked"]
    assert len(blocked) == len(cases)


async def test_allow_private_opens_only_the_listed_range_and_never_metadata(
    site: Site, runtime_for: Callable[..., Any]
) -> None:
    async with runtime_for(allow_private=["127.0.0.1/32", "169.254.0.0/16", "0.0.0.0/0"]) as rt:
        assert (await fetch(rt, f"http://127.0.0.1:{site.port}/json"))["status"] == 200
        assert (await refused(rt, f"http://169.254.169.254:{site.port}/")).reason == "metadata_address"
        assert (await refused(rt, f"http://168.63.129.16:{site.port}/")).reason == "metadata_address"
    async with runtime_for() as rt:
        assert (await refused(rt, f"http://127.0.0.2:{site.port}/json")).reason == "private_address"


async def test_host_allowlist_globs_apply(site: Site, runtime_for: Callable[..., Any]) -> None:
    async with runtime_for(allow_hosts=["*.example.org"]) as rt:
        assert (await refused(rt, f"http://127.0.0.1:{site.port}/json")).reason == "host_not_allowed"
        assert (await refused(rt, "http://example.org/")).reason == "host_not_allowed"
    assert site.hits == []


# -- redirects ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("http://169.254.169.254/latest/meta-data/", "metadata_address"),
        ("http://[::ffff:a9fe:a9fe]/", "metadata_address"),
        ("http://10.1.2.3/", "private_address"),
        ("http://mixed.example/", "private_address"),
        ("file:///etc/passwd", "scheme_not_allowed"),
        ("http://127.0.0.1:22/", "port_not_allowed"),
    ],
)
async def test_every_redirect_hop_is_checked_again(
    site: Site, runtime_for: Callable[..., Any], target: str, reason: str
) -> None:
    async with runtime_for() as rt:
        error = await refused(rt, f"http://127.0.0.1:{site.port}/redirect?to={target}")
    assert error.reason == reason
    assert len(site.hits) == 1


async def test_a_redirect_loop_stops_at_five(site: Site, runtime_for: Callable[..., Any]) -> None:
    async with runtime_for() as rt:
        assert (await refused(rt, f"http://127.0.0.1:{site.port}/loop")).reason == "too_many_redirects"
    assert len(site.hits) == 6


async def test_an_allowed_redirect_is_followed_and_counted(
    site: Site, runtime_for: Callable[..., Any]
) -> None:
    async with runtime_for() as rt:
        result = await fetch(rt, f"http://127.0.0.1:{site.port}/redirect?to=/text")
    assert (result["text"], result["redirects"]) == ("plain words", 1)
    assert result["final_url"] == f"http://127.0.0.1:{site.port}/text"


async def test_credentials_go_to_the_same_origin_and_are_dropped_when_it_changes(
    site: Site, runtime_for: Callable[..., Any]
) -> None:
    p = site.port
    async with runtime_for(allow_private=["127.0.0.1/32", "::1/128"]) as rt:
        same = await fetch(rt, f"http://user:pw@127.0.0.1:{p}/redirect?to=/echo-auth")
        other = await fetch(rt, f"http://user:pw@127.0.0.1:{p}/redirect?to=http://localhost:{p}/echo-auth")
    assert same["text"].startswith("auth=Basic dXNlcjpwdw==")
    assert other["text"] == f"auth=none host=localhost:{p}"
    assert "pw@" not in same["final_url"]


# -- rebinding: the connection goes to the address that was checked ---------------------------


async def test_dns_rebinding_never_gets_a_connection_to_the_rebound_address(
    runtime_for: Callable[..., Any],
) -> None:
    answers = iter([[IP(PUBLIC)], [IP("127.0.0.1")], [IP("127.0.0.1")]])

    async def rebinding(host: str, port: int) -> list[Any]:
        return next(answers)

    seen: list[httpx.Request] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, text="public page", headers={"content-type": "text/plain"})

    async with runtime_for(private=False, transport=MemoryTransport(upstream), resolver=rebinding) as rt:
        result = await fetch(rt, "https://rebind.example/page")
    assert [r.url.host for r in seen] == [PUBLIC]
    assert seen[0].headers["host"] == "rebind.example"
    assert seen[0].extensions["sni_hostname"] == "rebind.example"
    assert result["final_url"] == "https://rebind.example/page"


async def test_proxy_variables_in_the_environment_are_ignored(
    site: Site, runtime_for: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://10.9.9.9:3128")
    monkeypatch.setenv("ALL_PROXY", "http://10.9.9.9:3128")
    async with runtime_for() as rt:
        assert (await fetch(rt, f"http://127.0.0.1:{site.port}/text"))["text"] == "plain words"


# -- size, time and budget caps ----------------------------------------------------------------


async def test_a_gzip_bomb_stops_at_max_bytes(site: Site, runtime_for: Callable[..., Any]) -> None:
    async with runtime_for() as rt:
        result = await fetch(rt, f"http://127.0.0.1:{site.port}/gzip-bomb", max_bytes=5000)
    assert (result["bytes"], result["truncated"]) == (5000, True)


async def test_an_endless_body_stops_at_max_bytes(site: Site, runtime_for: Callable[..., Any]) -> None:
    async with runtime_for() as rt:
        result = await fetch(rt, f"http://127.0.0.1:{site.port}/endless", max_bytes=10_000)
    assert (result["bytes"], result["truncated"]) == (10_000, True)
    assert result["text"] == "x" * 10_000


async def test_max_bytes_cannot_exceed_the_configured_cap(
    site: Site, runtime_for: Callable[..., Any]
) -> None:
    async with runtime_for(max_bytes=1000) as rt:
        result = await fetch(rt, f"http://127.0.0.1:{site.port}/endless", max_bytes=50_000)
    assert result["bytes"] == 1000


async def test_a_slow_server_hits_the_read_timeout(site: Site, runtime_for: Callable[..., Any]) -> None:
    async with runtime_for(read_timeout_seconds=0.2) as rt:
        assert (await refused(rt, f"http://127.0.0.1:{site.port}/slow")).reason == "timeout"


async def test_a_slow_server_hits_the_total_timeout(site: Site, runtime_for: Callable[..., Any]) -> None:
    async with runtime_for(read_timeout_seconds=10, total_timeout_seconds=0.3) as rt:
        assert (await refused(rt, f"http://127.0.0.1:{site.port}/slow")).reason == "timeout"


async def test_the_egress_budget_refuses_the_request_that_would_exceed_it(
    site: Site, runtime_for: Callable[..., Any], events_path: Path
) -> None:
    async with runtime_for(session_max_requests=2) as rt:
        await fetch(rt, f"http://127.0.0.1:{site.port}/text", session_id="s")
        await fetch(rt, f"http://127.0.0.1:{site.port}/text", session_id="s")
        error = await refused(rt, f"http://127.0.0.1:{site.port}/text", session_id="s")
        await fetch(rt, f"http://127.0.0.1:{site.port}/text", session_id="other")
    assert error.reason == "egress_budget_exhausted"
    assert len(site.hits) == 3
    exhausted = [e for e in read_events(events_path) if e["event"] == "egress_budget_exhausted"]
    assert [(e["session_id"], e["requests"]) for e in exhausted] == [("s", 2)]


async def test_the_byte_budget_cuts_then_refuses(site: Site, runtime_for: Callable[..., Any]) -> None:
    async with runtime_for(session_max_bytes=15_000) as rt:
        first = await fetch(rt, f"http://127.0.0.1:{site.port}/endless", session_id="s", max_bytes=10_000)
        second = await fetch(rt, f"http://127.0.0.1:{site.port}/endless", session_id="s", max_bytes=10_000)
        error = await refused(rt, f"http://127.0.0.1:{site.port}/text", session_id="s")
    assert (first["bytes"], second["bytes"], second["truncated"]) == (10_000, 5_000, True)
    assert error.reason == "egress_budget_exhausted"


async def test_a_dead_host_trips_its_breaker(runtime_for: Callable[..., Any]) -> None:
    async with runtime_for(allow_ports=[80, 443, 9]) as rt:
        reasons = [(await refused(rt, "http://127.0.0.1:9/")).reason for _ in range(3)]
    assert reasons == ["connection_error", "connection_error", "breaker_open"]


# -- content ----------------------------------------------------------------------------------


async def test_binary_content_is_refused_with_a_reason(site: Site, runtime_for: Callable[..., Any]) -> None:
    async with runtime_for() as rt:
        error = await refused(rt, f"http://127.0.0.1:{site.port}/png")
    assert error.reason == "unsupported_content_type"
    assert "image/png" in error.message


async def test_an_encoding_that_was_not_offered_is_refused(
    site: Site, runtime_for: Callable[..., Any]
) -> None:
    async with runtime_for() as rt:
        assert (
            await refused(rt, f"http://127.0.0.1:{site.port}/brotli")
        ).reason == "unsupported_content_type"


# -- arguments -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "path"),
    [
        ({}, "$"),
        ({"url": 5}, "$.url"),
        ({"url": "http://x/", "max_bytes": 0}, "$.max_bytes"),
        ({"url": "http://x/", "headers": {}}, "$"),
    ],
)
async def test_invalid_arguments_name_the_failing_path(
    runtime_for: Callable[..., Any], args: dict[str, Any], path: str
) -> None:
    async with runtime_for() as rt:
        with pytest.raises(InvalidArguments) as info:
            await rt.call_tool("fetch", args)
    assert info.value.path == path
