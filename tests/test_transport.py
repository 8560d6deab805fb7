"""The transport seam (conclave/net/http.py): what `AiohttpTransport` reports for each way a request
can fail to get an answer, over real loopback sockets that misbehave on purpose; streamed bodies
arriving as they are sent; the shared httpx client over the seam; and `MemoryTransport` keeping
the same contract, so the tests that use it drive the production path above the seam."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
import httpx
import pytest

from conclave.net.http import AiohttpTransport, MemoryTransport, TransportError, make_http_client

pytestmark = pytest.mark.anyio

Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the raw servers below are asyncio's


async def serve(answer: Answer) -> tuple[asyncio.Server, str]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        try:
            await answer(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/"


@pytest.fixture
async def transport() -> AsyncIterator[AiohttpTransport]:
    transport = AiohttpTransport()
    try:
        yield transport
    finally:
        await transport.aclose()


async def test_a_refused_connection_is_a_connection_error_naming_the_address(
    transport: AiohttpTransport,
) -> None:
    server, url = await serve(lambda _r, _w: asyncio.sleep(0))
    server.close()
    await server.wait_closed()  # nothing listens on that port any more
    with pytest.raises(TransportError) as info:
        await transport.exchange("GET", url, [], b"")
    assert info.value.failure == "connection_error"
    port = url.rsplit(":", 1)[1].strip("/")
    assert str(info.value) == f"127.0.0.1:{port}: connection refused"


async def cut_short(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")
    await writer.drain()


async def read_into(received: list[bytes], transport: AiohttpTransport, url: str) -> None:
    async with transport.stream("GET", url, [], b"") as response:
        assert response.status == 200
        async for chunk in response.chunks():
            received.append(chunk)


async def test_a_body_cut_short_is_a_dropped_connection(transport: AiohttpTransport) -> None:
    server, url = await serve(cut_short)
    async with server:
        with pytest.raises(TransportError) as info:
            await transport.exchange("GET", url, [], b"")
        assert info.value.failure == "connection_dropped"

        received: list[bytes] = []
        with pytest.raises(TransportError) as streamed:
            await read_into(received, transport, url)
        assert streamed.value.failure == "connection_dropped"
        assert received == [b"only this"]  # what came is handed over before the failure


async def silent(_reader: asyncio.StreamReader, _writer: asyncio.StreamWriter) -> None:
    await asyncio.sleep(30)


async def test_the_read_timer_is_a_timeout_and_the_total_timer_a_builtin_timeout(
    transport: AiohttpTransport,
) -> None:
    server, url = await serve(silent)
    async with server:
        with pytest.raises(TransportError) as info:
            await transport.exchange("GET", url, [], b"", read=0.2)
        assert info.value.failure == "timeout"
        # the whole exchange's budget is the caller's: it learns that its own time ran out
        with pytest.raises(TimeoutError) as total:
            await transport.exchange("GET", url, [], b"", total=0.2)
        assert not isinstance(total.value, TransportError)


async def test_a_streamed_body_arrives_as_it_is_sent(transport: AiohttpTransport) -> None:
    first_read = asyncio.Event()

    async def in_two_parts(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        await first_read.wait()  # the second part is only sent once the first was read
        writer.write(b"6\r\nsecond\r\n0\r\n\r\n")
        await writer.drain()

    server, url = await serve(in_two_parts)
    async with server:
        parts = []
        with anyio.fail_after(5):
            async with transport.stream("GET", url, [], b"") as response:
                async for chunk in response.chunks():
                    parts.append(chunk)
                    first_read.set()
    assert b"".join(parts) == b"firstsecond"
    assert parts[0] == b"first"


async def test_leaving_a_stream_early_closes_its_connection(transport: AiohttpTransport) -> None:
    closed = asyncio.Event()

    async def endless(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        try:
            while True:
                writer.write(b"400\r\n" + b"x" * 1024 + b"\r\n")
                await writer.drain()
                await asyncio.sleep(0.01)
        except ConnectionError:
            closed.set()

    server, url = await serve(endless)
    async with server:
        async with transport.stream("GET", url, [], b"") as response:
            async for _chunk in response.chunks():
                break
        with anyio.fail_after(5):
            await closed.wait()


async def test_the_shared_client_hands_httpx_the_header_bytes_received(transport: AiohttpTransport) -> None:
    """aiohttp decodes header bytes that are not UTF-8 with surrogateescape; httpx gets them back."""

    async def odd_header(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nX-Trace: caf\xe9\xff\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()

    server, url = await serve(odd_header)
    async with server, make_http_client(transport) as client:
        response = await client.get(url)
    assert response.status_code == 200 and response.content == b"ok"
    assert (b"X-Trace", b"caf\xe9\xff") in response.headers.raw
    assert response.headers["x-trace"] == "caf\xe9\xff"  # httpx reads non-UTF-8 as latin-1


async def test_a_transport_failure_passes_through_the_shared_client(transport: AiohttpTransport) -> None:
    server, url = await serve(cut_short)
    async with server, make_http_client(transport) as client:
        with pytest.raises(TransportError) as info:
            await client.get(url)
    assert info.value.failure == "connection_dropped"


async def test_the_memory_transport_keeps_the_contract() -> None:
    seen: list[httpx.Request] = []
    packed = gzip.compress(b"hello")

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/down":
            raise TransportError("refused", failure="connection_error")
        if request.url.path == "/slow":
            await anyio.sleep(30)
        return httpx.Response(200, headers={"content-encoding": "gzip"}, content=packed)

    memory = MemoryTransport(handler)
    status, headers, body = await memory.exchange(
        "POST", "https://93.184.215.14/ok", [("host", "example.com")], b"{}", server_hostname="example.com"
    )
    assert (status, headers["content-encoding"], body) == (200, "gzip", packed)  # never decoded
    assert seen[0].extensions["sni_hostname"] == "example.com"
    assert seen[0].headers["host"] == "example.com" and seen[0].content == b"{}"

    with pytest.raises(TransportError):
        await memory.exchange("GET", "http://h/down", [], b"")
    with pytest.raises(TimeoutError):
        await memory.exchange("GET", "http://h/slow", [], b"", total=0.05)
    async with memory.stream("GET", "http://h/ok", [], b"") as response:
        assert b"".join([c async for c in response.chunks()]) == packed
