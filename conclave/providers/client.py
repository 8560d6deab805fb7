"""One provider, called resiliently: key check, breaker, deadline, retries, telemetry.

This is the only place transport failures and JSON exceptions become Conclave errors.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import orjson

from conclave.core.breaker import Clock
from conclave.core.errors import (
    DeadlineExceeded,
    MalformedResponse,
    MissingApiKey,
    PermanentProviderError,
    ProviderError,
    ProviderTimeout,
    ProviderUnreachable,
    TransientProviderError,
)
from conclave.core.messages import Completion, CompletionRequest, Delta, DeltaListener
from conclave.core.records import record
from conclave.net.http import Streamed, Transport, TransportError
from conclave.obs.telemetry import Telemetry
from conclave.providers.base import Adapter, Endpoint, Headers, ParsedCompletion, status_error
from conclave.providers.kinds import KINDS
from conclave.providers.pricing import cost_usd
from conclave.providers.streaming import Assembler, StreamFailed, events
from conclave.schema.config import ProviderConfig, RetryConfig
from conclave.state.base import Breaker, Slots

if TYPE_CHECKING:  # tenacity is imported by the first call that has to retry (_Attempts)
    from tenacity import RetryCallState

    from conclave.providers.retry import StopAtAttemptsOrDeadline

Sleep = Callable[[float], Awaitable[None]]

STARTED = Delta("start", "")  # opens each streamed model call (a listener begins its text again)


class CompletionClient(Protocol):
    """What the pool hands out for a provider: a `ProviderClient`, or with tracing on the
    `InstrumentedProviderClient` wrapped around it once, when the pool is built."""

    @property
    def name(self) -> str: ...

    @property
    def entry(self) -> ProviderConfig: ...

    @property
    def adapter(self) -> Adapter: ...

    @property
    def breaker(self) -> Breaker: ...

    async def complete(
        self, request: CompletionRequest, *, deadline: float, listener: DeltaListener | None = None
    ) -> Completion: ...


class ProviderClient:
    """`complete()` is the one method callers use; everything below it is the retry layer.

    Deadlines are `time.monotonic()` instants, the clock anyio's asyncio backend runs on, read
    directly rather than through `anyio.current_time()`'s backend lookup.
    """

    def __init__(
        self,
        entry: ProviderConfig,
        adapter: Adapter,
        *,
        transport: Transport,
        api_key: str | None,
        breaker: Breaker,
        retry: RetryConfig,
        telemetry: Telemetry,
        slots: Slots,
        clock: Clock = time.monotonic,
        sleep: Sleep = anyio.sleep,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.entry = entry
        self.adapter = adapter
        self.breaker = breaker
        self._transport = transport
        self._key = api_key
        self._endpoint = adapter.endpoint(entry, api_key)
        # Answers are streamed where the kind and the entry allow; a server that refuses a stream
        # is called plainly from then on, for as long as this client lives (the process).
        self._streams = KINDS[entry.kind].streaming and entry.stream
        self._stream_endpoint = adapter.stream_endpoint(entry, api_key) if self._streams else None
        self._retry = retry
        self._telemetry = telemetry
        self._slots = slots
        self._clock = clock
        self._sleep = sleep
        self._jitter = jitter

    @property
    def name(self) -> str:
        return self.entry.name

    async def complete(
        self, request: CompletionRequest, *, deadline: float, listener: DeltaListener | None = None
    ) -> Completion:
        """Ask the model once (with retries), by `deadline` (a `clock()` instant), streamed where
        the provider can (`listener` hears the answer's deltas as they come). No span here: with
        tracing on, the pool hands out this client wrapped in an `InstrumentedProviderClient`
        (instrumented.py), which opens the call's `chat {model}` span around this method."""
        started = self._clock()
        attempts = _Attempts(self, deadline, request, listener)
        try:
            self._require_key()
            await self.breaker.check()
            parsed = await attempts.run(self._outgoing(request))
        except ProviderError as exc:
            final = attempts.give_up(exc)
            final.provider = self.name
            await self._settle_breaker(final)
            self._emit_call(started, attempts.count, error=final)
            if final is exc:
                raise
            raise final from exc
        await self.breaker.record_success()
        completion = self._finish(parsed, started, attempts)
        self._emit_call(started, attempts.count, completion=completion)
        return completion

    def _outgoing(self, request: CompletionRequest) -> _Outgoing:
        if self._streams and self._stream_endpoint is not None:
            body = self.adapter.stream_body(request, self.entry)
            return _Outgoing.encode(self._stream_endpoint, body, streamed=True)
        return _Outgoing.encode(self._endpoint, self.adapter.body(request, self.entry))

    def _require_key(self) -> None:
        env = self.entry.api_key_env
        if env and not self._key:
            raise MissingApiKey(
                f"provider {self.name!r} needs an API key: set the environment variable {env} "
                "(or add it to .env)",
                provider=self.name,
            )

    async def _attempt(self, call: _Attempts, deadline: float) -> ParsedCompletion:
        """One HTTP exchange within the attempt's budget, the wait for a slot included."""
        remaining = deadline - self._clock()
        if remaining <= 0:
            raise DeadlineExceeded("deadline reached before the provider answered", provider=self.name)
        budget = min(remaining, self._retry.attempt_timeout_seconds)
        slot_asked = self._clock()
        try:
            await self._slots.acquire(budget)
            try:  # the wait for the slot came out of the budget
                return await self._exchange(call, slot_asked + budget)
            finally:
                self._slots.release()
        except TimeoutError:
            if budget < remaining:
                raise ProviderTimeout(f"no answer within {budget:.1f}s", provider=self.name) from None
            raise DeadlineExceeded(
                f"no answer within the call's deadline ({remaining:.1f}s left)", provider=self.name
            ) from None

    async def _exchange(self, call: _Attempts, end: float) -> ParsedCompletion:
        """The request by `end` (a `clock()` instant), streamed or plain; a server that refuses the
        stream is asked plainly at once, and never streamed to again."""
        if call.wire.streamed:
            with anyio.fail_after(end - self._clock()):
                parsed = await self._streamed(call, self._clock())
            if parsed is not None:
                return parsed
            self._streams = False
            self._telemetry.emit("provider_stream_refused", provider=self.name, kind=self.entry.kind)
            call.wire = self._outgoing(call.request)
        sent = self._clock()
        status, headers, body = await self._post(call.wire, end - sent)
        call.ttft_ms = (self._clock() - sent) * 1000.0  # a plain answer's first token comes with its last
        return self._read(status, headers, body)

    def _transport_failure(self, exc: TransportError) -> ProviderError:
        failure = exc.failure
        detail = self._scrub(str(exc)) or type(exc).__name__
        if failure == "timeout":
            return ProviderTimeout(f"timed out: {detail}", provider=self.name)
        what = "connection dropped" if failure == "connection_dropped" else "cannot connect"
        return ProviderUnreachable(f"{what}: {detail}", provider=self.name, code=failure)

    async def _post(self, wire: _Outgoing, seconds: float) -> tuple[int, Headers, bytes]:
        """Straight on the transport, with plain values: provider calls need none of an HTTP
        client's per-request machinery (auth flows, redirects, cookies, URL merging)."""
        if seconds <= 0:
            raise TimeoutError
        try:  # the transport's own timer bounds the whole exchange
            return await self._transport.exchange(
                "POST",
                wire.url,
                wire.headers,
                wire.content,
                total=seconds,
                connect=min(seconds, _CONNECT_TIMEOUT),
            )
        except TransportError as exc:
            raise self._transport_failure(exc) from exc

    async def _streamed(self, call: _Attempts, sent: float) -> ParsedCompletion | None:
        """Read a streamed answer, handing its deltas to the listener, and parse the body it
        rebuilds; None when the server refuses to stream. An answer that is not a stream (an
        error, or a server that ignored the flag) is read whole, as a plain one."""
        wire = call.wire
        try:
            async with self._transport.stream(
                "POST", wire.url, wire.headers, wire.content, connect=_CONNECT_TIMEOUT
            ) as streamed:
                status, headers = streamed.status, streamed.headers
                if status >= 400 or "text/event-stream" not in headers.get("content-type", ""):
                    raw = b"".join([chunk async for chunk in streamed.chunks()])
                    if status >= 400 and self._refuses_stream(status, headers, raw):
                        return None
                    call.ttft_ms = (self._clock() - sent) * 1000.0
                    return self._read(status, headers, raw)
                assembler = self.adapter.assembler(self.entry)
                if call.listener is not None:
                    call.listener(STARTED)
                await self._assemble(call, assembler, streamed, sent)
                if call.ttft_ms is None:  # nothing was said: the first token is the end
                    call.ttft_ms = (self._clock() - sent) * 1000.0
        except TransportError as exc:
            raise self._transport_failure(exc) from exc
        except StreamFailed as exc:
            raise self._error(exc.status, headers, exc.body, b"") from exc
        body = assembler.body()
        if not assembler.complete and KINDS[self.entry.kind].answer_field in body:
            # An answer begun and never finished: cut on the way, and worth asking again. (A
            # stream that never carried an answer at all is malformed, as its plain twin is.)
            raise ProviderUnreachable(
                "the stream ended before the answer was complete", provider=self.name, code="stream_cut"
            )
        return self._parsed(status, headers, body)

    async def _assemble(self, call: _Attempts, assembler: Assembler, streamed: Streamed, sent: float) -> None:
        listener = call.listener
        async for event in events(streamed):
            deltas = assembler.feed(event.event, event.data)
            if deltas:
                if call.ttft_ms is None:
                    call.ttft_ms = (self._clock() - sent) * 1000.0
                if listener is not None:
                    for delta in deltas:
                        listener(delta)

    def _refuses_stream(self, status: int, headers: Headers, raw: bytes) -> bool:
        body = _json_or_none(raw)
        details = self.adapter.error_details(body if body is not None else {}, headers)
        return self.adapter.refuses_stream(status, details)

    def _read(self, status: int, headers: Headers, raw: bytes) -> ParsedCompletion:
        body = _json_or_none(raw)
        if status >= 400:
            raise self._error(status, headers, body, raw)
        return self._parsed(status, headers, body, len(raw))

    def _error(self, status: int, headers: Headers, body: Any, raw: bytes) -> ProviderError:
        details = self.adapter.error_details(body if body is not None else {}, headers)
        message = details.message or raw[:300].decode("utf-8", "replace")
        details = replace(details, message=self._scrub(message))
        error = status_error(status, details, headers)
        error.provider = self.name
        return error

    def _parsed(self, status: int, headers: Headers, body: Any, size: int = 0) -> ParsedCompletion:
        """A successful answer's body, whole or rebuilt from a stream, as the adapter reads it."""
        if not isinstance(body, dict):
            raise MalformedResponse(
                f"HTTP {status} with a body that is not a JSON object ({size} bytes)",
                provider=self.name,
                status=status,
            )
        if body.get("error") is not None and KINDS[self.entry.kind].answer_field not in body:
            # An in-band error with a 200 status (OpenRouter does this). Not a null one: every
            # Responses API body has `"error": null`.
            details = self.adapter.error_details(body, headers)
            err_status = body["error"].get("code") if isinstance(body["error"], dict) else None
            code = err_status if isinstance(err_status, int) and err_status >= 400 else 502
            raise status_error(code, details, headers)
        try:
            return self.adapter.parse(body, headers, self.entry)
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise MalformedResponse(
                f"HTTP {status} response is missing expected fields ({type(exc).__name__}: {exc})",
                provider=self.name,
                status=status,
            ) from exc

    def _finish(self, parsed: ParsedCompletion, started: float, attempts: _Attempts) -> Completion:
        cost = cost_usd(parsed.usage, self.entry.price)
        return Completion(
            text=parsed.text,
            finish_reason=parsed.finish_reason,
            usage=parsed.usage.with_cost(cost),
            model=parsed.model,
            provider=self.name,
            request_id=parsed.request_id,
            latency_ms=(self._clock() - started) * 1000.0,
            ttft_ms=attempts.ttft_ms,
            attempts=attempts.count,
            warnings=("price_unknown",) if cost is None else (),
            tool_uses=parsed.tool_uses,
            echo=parsed.echo,
        )

    async def _settle_breaker(self, exc: ProviderError) -> None:
        """Only the provider's own failures count against it; a 400 or a missing key do not."""
        if isinstance(exc, TransientProviderError | MalformedResponse | DeadlineExceeded):
            await self.breaker.record_failure()
        elif isinstance(exc, PermanentProviderError):
            await self.breaker.release()

    def _emit_call(
        self,
        started: float,
        attempts: int,
        *,
        completion: Completion | None = None,
        error: ProviderError | None = None,
    ) -> None:
        fields: dict[str, Any] = {
            "provider": self.name,
            "kind": self.entry.kind,
            "model": self.entry.model,
            "attempts": attempts,
            "latency_ms": round((self._clock() - started) * 1000.0, 3),
        }
        if completion is not None:
            fields.update(
                status="ok",
                ttft_ms=round(completion.ttft_ms, 3) if completion.ttft_ms is not None else None,
                finish_reason=completion.finish_reason,
                text=completion.text,  # content: telemetry drops it unless include_content is on
                reported_model=completion.model,
                request_id=completion.request_id,
                usage=completion.usage.to_dict(),
                cost_usd=completion.usage.cost_usd,
            )
        elif error is not None:
            fields.update(
                status="breaker_open" if error.code == "breaker_open" else "error",
                code=error.code,
                http_status=error.status,
                error=error.message,
            )
        self._telemetry.emit("provider_call", **fields)

    def _scrub(self, text: str) -> str:
        return self._telemetry.redactor.text(text)


@record
class _Outgoing:
    """A request as sent: the body encoded once, for every attempt. Only this stays alive while
    the call waits, not the adapter's body dicts and lists (objects the collector would walk)."""

    url: str
    headers: Mapping[str, str]
    content: bytes
    streamed: bool = False

    @classmethod
    def encode(cls, endpoint: Endpoint, body: Mapping[str, Any], *, streamed: bool = False) -> _Outgoing:
        # orjson's result keeps its whole output buffer, and the body waits with the call: keep
        # an exact-size copy instead.
        return cls(endpoint.url, endpoint.headers, bytes(memoryview(orjson.dumps(body))), streamed)


class _Attempts:
    """One call's attempts. The first is made directly: most calls need no other, and running
    it through tenacity would cost a successful call ~2.7 times the instructions of its whole
    attempt layer (docs/performance.md, "Retries on tenacity"). A transient failure hands the
    call to tenacity's `AsyncRetrying` with Conclave's strategies (`retry.py`: which errors to
    retry, how long to wait, when to stop), with that failure replayed as tenacity's first
    attempt, so the strategies decide exactly as for any other. The stop strategy keeps why
    retrying stopped, and the final error explains it."""

    __slots__ = ("_client", "_deadline", "_stop", "count", "listener", "request", "ttft_ms", "wire")

    def __init__(
        self,
        client: ProviderClient,
        deadline: float,
        request: CompletionRequest,
        listener: DeltaListener | None,
    ) -> None:
        self._client = client
        self._deadline = deadline
        self._stop: StopAtAttemptsOrDeadline | None = None
        self.count = 0
        self.request = request
        self.listener = listener
        self.ttft_ms: float | None = None  # of the attempt that answered
        self.wire: _Outgoing

    async def run(self, wire: _Outgoing) -> ParsedCompletion:
        self.wire = wire
        try:
            return await self._attempt()
        except TransientProviderError as first:
            return await self._retry(first)

    async def _retry(self, first: TransientProviderError) -> ParsedCompletion:
        from tenacity import AsyncRetrying

        from conclave.providers.retry import RetryTransient, StopAtAttemptsOrDeadline, WaitForHintOrBackoff

        client = self._client
        self._stop = StopAtAttemptsOrDeadline(client._retry, self._deadline, client._clock)
        made = [first]  # the attempt already made, which tenacity is handed as its first

        async def attempt() -> ParsedCompletion:
            if made:
                raise made.pop()
            return await self._attempt()

        retrying = AsyncRetrying(
            sleep=client._sleep,  # the injected sleep: tests wait on a fake clock
            stop=self._stop,
            wait=WaitForHintOrBackoff(client._retry, client._jitter),
            retry=RetryTransient(),
            before_sleep=self._announce,
            reraise=True,  # the provider's own error, not tenacity's RetryError
        )
        parsed: ParsedCompletion = await retrying(attempt)
        return parsed

    async def _attempt(self) -> ParsedCompletion:
        self.count += 1
        self.ttft_ms = None
        return await self._client._attempt(self, self._deadline)

    def _announce(self, state: RetryCallState) -> None:
        """The `retry` span event and `provider_retry` log event, before the wait."""
        from conclave.providers.retry import failure

        client, exc, delay = self._client, failure(state), state.upcoming_sleep
        retry = {"error.type": exc.code, "conclave.attempt": self.count, "conclave.delay_seconds": delay}
        client._telemetry.tracer.event("retry", **retry)
        client._telemetry.emit(
            "provider_retry",
            provider=client.name,
            kind=client.entry.kind,
            attempt=self.count,
            delay_seconds=round(delay, 3),
            code=exc.code,
            http_status=exc.status,
        )

    def give_up(self, exc: ProviderError) -> ProviderError:
        """The error to surface: the provider's words plus why retrying stopped."""
        exc.provider = self._client.name
        reason = self._stop.reason if self._stop is not None else ""
        if not reason:  # failed before any attempt, or permanently: the error says it all
            return exc
        from conclave.providers.retry import DEADLINE, explain_give_up

        exc.message = explain_give_up(exc, reason, self.count)
        exc.args = (exc.message,)
        # Only a timeout becomes a deadline error: a 429 or 503 whose wait would pass the deadline
        # is still the provider's answer, and its retry hint is what the caller needs.
        if reason == DEADLINE and isinstance(exc, ProviderTimeout):
            return DeadlineExceeded(exc.message, provider=exc.provider, status=exc.status)
        return exc


# A host that has not accepted in 10 s is down: the next attempt may not be. (The attempt's own
# cancel scope ends it sooner when its budget is shorter.)
_CONNECT_TIMEOUT = 10.0


def _json_or_none(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
