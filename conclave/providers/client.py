"""One provider, called resiliently: key check, breaker, deadline, retries, telemetry.

This is the only place httpx / aiohttp / JSON exceptions become Conclave errors.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import orjson

from conclave.breaker import CircuitBreaker
from conclave.config import ProviderConfig, RetryConfig
from conclave.errors import (
    DeadlineExceeded,
    MalformedResponse,
    MissingApiKey,
    PermanentProviderError,
    ProviderError,
    ProviderTimeout,
    ProviderUnreachable,
    TransientProviderError,
)
from conclave.http import ProviderTransport, classify_transport_error
from conclave.messages import Completion, CompletionRequest
from conclave.providers.base import Adapter, Headers, ParsedCompletion, Target, status_error
from conclave.providers.pricing import cost_usd
from conclave.providers.retry import RetryDecision, decide, explain_give_up
from conclave.records import record
from conclave.telemetry import Telemetry

if TYPE_CHECKING:
    from tenacity import RetryCallState

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


class ProviderClient:
    """`complete()` is the one method callers use; everything below it is the retry layer.

    Deadlines are `time.monotonic()` instants, the clock anyio's asyncio backend runs on
    (`anyio.current_time()` looks the backend up on every call: measurable on this path).
    """

    def __init__(
        self,
        entry: ProviderConfig,
        adapter: Adapter,
        *,
        transport: httpx.AsyncBaseTransport,
        api_key: str | None,
        breaker: CircuitBreaker,
        retry: RetryConfig,
        telemetry: Telemetry,
        limiter: anyio.Semaphore,
        clock: Clock = time.monotonic,
        sleep: Sleep = anyio.sleep,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.entry = entry
        self.adapter = adapter
        self.breaker = breaker
        self._transport = transport
        # The production transport takes requests as plain values (no httpx objects) and times
        # them itself; any other transport (tests' MockTransport) gets an `httpx.Request`.
        self._direct = transport if isinstance(transport, ProviderTransport) else None
        self._key = api_key
        self._target = adapter.target(entry, api_key)
        self._retry = retry
        self._telemetry = telemetry
        self._limiter = limiter
        self._clock = clock
        self._sleep = sleep
        self._jitter = jitter

    @property
    def name(self) -> str:
        return self.entry.name

    async def complete(self, request: CompletionRequest, *, deadline: float) -> Completion:
        """Ask the model once (with retries), by `deadline` (a `clock()` instant)."""
        started = self._clock()
        policy: _CallRetryPolicy | None = None  # made on a first failure: most calls need none
        try:
            self._require_key()
            self.breaker.check()
            wire = _Outgoing.encode(self._target, self.adapter.body(request, self.entry))
            try:
                parsed = await self._attempt(wire, deadline)
            except ProviderError as exc:
                policy = _CallRetryPolicy(self, deadline)
                parsed = await self._retries(wire, deadline, policy, exc)
        except ProviderError as exc:
            final, attempts = (policy.give_up(exc), policy.attempts) if policy else (exc, 0)
            final.provider = self.name
            self._settle_breaker(final)
            self._emit_call(started, attempts, error=final)
            if final is exc:
                raise
            raise final from exc
        self.breaker.record_success()
        attempts = policy.attempts if policy else 1
        completion = self._finish(parsed, started, attempts)
        self._emit_call(started, attempts, completion=completion)
        return completion

    async def _retries(
        self, wire: _Outgoing, deadline: float, policy: _CallRetryPolicy, first: ProviderError
    ) -> ParsedCompletion:
        """After a failed first attempt: tenacity drives the retries `decide` allows."""
        # Imported here: most processes never retry, and the module is ~0.5 MB resident.
        from tenacity import AsyncRetrying, stop_never

        if not policy.judge(first, attempt=1):
            raise first
        policy.report(first, attempt=1)
        await self._sleep(policy.delay)
        retrying = AsyncRetrying(
            retry=policy.should_retry,
            wait=policy.wait,
            stop=stop_never,
            sleep=self._sleep,
            before_sleep=policy.announce,
            reraise=True,
        )
        parsed: ParsedCompletion = await retrying(self._attempt, wire, deadline)
        return parsed

    def _require_key(self) -> None:
        env = self.entry.api_key_env
        if env and not self._key:
            raise MissingApiKey(
                f"provider {self.name!r} needs an API key: set the environment variable {env} "
                "(or add it to .env)",
                provider=self.name,
            )

    async def _attempt(self, wire: _Outgoing, deadline: float) -> ParsedCompletion:
        """One HTTP exchange within the attempt's budget, slot wait included.

        The common case, a free slot on the direct transport, runs without a cancel scope: the
        transport's own timer bounds the exchange. (A scope per call, and each coroutine layer
        a call stays suspended in, were measurable costs on this path in the F6 profile.)
        """
        remaining = deadline - self._clock()
        if remaining <= 0:
            raise DeadlineExceeded("deadline reached before the provider answered", provider=self.name)
        budget = min(remaining, self._retry.attempt_timeout_seconds)
        try:
            if self._direct is not None and self._slot_free():
                try:
                    status, headers, body = await self._post(wire, budget)
                finally:
                    self._limiter.release()
            else:
                with anyio.fail_after(budget):
                    await self._limiter.acquire()
                    try:
                        status, headers, body = await self._post(wire, budget)
                    finally:
                        self._limiter.release()
        except TimeoutError as exc:
            if budget < remaining:
                raise ProviderTimeout(f"no answer within {budget:.1f}s", provider=self.name) from exc
            raise DeadlineExceeded(
                f"no answer within the call's deadline ({remaining:.1f}s left)", provider=self.name
            ) from exc
        except httpx.HTTPError as exc:
            raise self._transport_failure(exc) from exc
        return self._read(status, headers, body)

    def _slot_free(self) -> bool:
        try:
            self._limiter.acquire_nowait()
        except anyio.WouldBlock:
            return False
        return True

    def _transport_failure(self, exc: httpx.HTTPError) -> ProviderError:
        failure = classify_transport_error(exc)
        detail = self._scrub(str(exc)) or type(exc).__name__
        if failure == "timeout":
            return ProviderTimeout(f"timed out: {detail}", provider=self.name)
        what = "connection dropped" if failure == "connection_dropped" else "cannot connect"
        return ProviderUnreachable(f"{what}: {detail}", provider=self.name, code=failure)

    def _post(self, wire: _Outgoing, seconds: float) -> Awaitable[tuple[int, Headers, bytes]]:
        """The exchange to await. A plain function, so no coroutine layer of its own stays
        suspended for the whole round trip."""
        if self._direct is not None:
            return self._direct.exchange("POST", wire.url, wire.headers, wire.content, total=seconds)
        return self._post_httpx(wire, seconds)

    async def _post_httpx(self, wire: _Outgoing, seconds: float) -> tuple[int, Headers, bytes]:
        """Through httpx's transport seam, straight on the transport: provider calls need none
        of the client's per-request machinery (auth flows, redirects, cookies, URL merging)."""
        request = httpx.Request(
            "POST",
            _parsed_url(wire.url),
            headers=wire.headers,
            content=wire.content,
            extensions={
                "timeout": {"connect": min(seconds, 10.0), "read": seconds, "write": seconds, "pool": seconds}
            },
        )
        response = await self._transport.handle_async_request(request)
        try:
            raw = await response.aread()
        finally:
            await response.aclose()
        return response.status_code, response.headers, raw

    def _read(self, status: int, headers: Headers, raw: bytes) -> ParsedCompletion:
        body = _json_or_none(raw)
        if status >= 400:
            details = self.adapter.error_details(body if body is not None else {}, headers)
            message = details.message or raw[:300].decode("utf-8", "replace")
            details = replace(details, message=self._scrub(message))
            error = status_error(status, details, headers)
            error.provider = self.name
            raise error
        if not isinstance(body, dict):
            raise MalformedResponse(
                f"HTTP {status} with a body that is not a JSON object ({len(raw)} bytes)",
                provider=self.name,
                status=status,
            )
        if "error" in body and not any(k in body for k in ("choices", "content", "candidates")):
            # An in-band error with a 200 status (OpenRouter does this).
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

    def _finish(self, parsed: ParsedCompletion, started: float, attempts: int) -> Completion:
        cost = cost_usd(parsed.usage, self.entry.price)
        return Completion(
            text=parsed.text,
            finish_reason=parsed.finish_reason,
            usage=parsed.usage.with_cost(cost),
            model=parsed.model,
            provider=self.name,
            request_id=parsed.request_id,
            latency_ms=(self._clock() - started) * 1000.0,
            attempts=attempts,
            warnings=("price_unknown",) if cost is None else (),
        )

    def _settle_breaker(self, exc: ProviderError) -> None:
        """Only the provider's own failures count against it; a 400 or a missing key do not."""
        if isinstance(exc, TransientProviderError | MalformedResponse | DeadlineExceeded):
            self.breaker.record_failure()
        elif isinstance(exc, PermanentProviderError):
            self.breaker.release()

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
                finish_reason=completion.finish_reason,
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

    @classmethod
    def encode(cls, target: Target, body: Mapping[str, Any]) -> _Outgoing:
        # orjson returns its whole output buffer (about 4 KiB for a 200-byte body) and the body
        # waits with the call: an exact-size copy is ~9 MB less with 2,500 calls in flight.
        return cls(target.url, target.headers, bytes(memoryview(orjson.dumps(body))))


class _CallRetryPolicy:
    """tenacity's hooks for one call: `decide` judges each failure against the deadline,
    and the last verdict explains why Conclave stopped asking."""

    __slots__ = ("_client", "_deadline", "attempts", "decision")

    def __init__(self, client: ProviderClient, deadline: float) -> None:
        self._client = client
        self._deadline = deadline
        self.attempts = 1  # made when the first attempt has failed
        self.decision: RetryDecision | None = None

    FIRST_ATTEMPTS_OUTSIDE = 1  # attempts made before tenacity took over

    def judge(self, exc: BaseException, *, attempt: int) -> bool:
        client = self._client
        self.attempts = attempt
        self.decision = decide(
            exc,
            attempt=attempt,
            policy=client._retry,
            remaining=self._deadline - client._clock(),
            jitter=client._jitter,
        )
        return self.decision.retry

    @property
    def delay(self) -> float:
        return self.decision.delay if self.decision is not None else 0.0

    def should_retry(self, state: RetryCallState) -> bool:
        attempt = state.attempt_number + self.FIRST_ATTEMPTS_OUTSIDE
        self.attempts = attempt
        outcome = state.outcome
        exc = outcome.exception() if outcome is not None else None
        return exc is not None and self.judge(exc, attempt=attempt)

    def wait(self, _state: RetryCallState) -> float:
        return self.delay

    def announce(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        self.report(exc, attempt=state.attempt_number + self.FIRST_ATTEMPTS_OUTSIDE)

    def report(self, exc: BaseException | None, *, attempt: int) -> None:
        client = self._client
        client._telemetry.emit(
            "provider_retry",
            provider=client.name,
            kind=client.entry.kind,
            attempt=attempt,
            delay_seconds=round(self.delay, 3),
            code=getattr(exc, "code", "error"),
            http_status=getattr(exc, "status", None),
        )

    def give_up(self, exc: ProviderError) -> ProviderError:
        """The error to surface: the provider's words plus why retrying stopped."""
        exc.provider = self._client.name
        if self.decision is None or self.decision.retry:
            return exc
        exc.message = explain_give_up(exc, self.decision, self.attempts)
        exc.args = (exc.message,)
        # Only a timeout becomes a deadline error: a 429 or 503 whose wait would pass the deadline
        # is still the provider's answer, and its retry hint is what the caller needs.
        if self.decision.reason == "deadline" and isinstance(exc, ProviderTimeout):
            return DeadlineExceeded(exc.message, provider=exc.provider, status=exc.status)
        return exc


@lru_cache(maxsize=1024)
def _parsed_url(url: str) -> httpx.URL:
    return httpx.URL(url)  # immutable, so one parse serves every call to the same endpoint


def _json_or_none(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
