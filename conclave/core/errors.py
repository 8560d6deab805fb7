"""Conclave's exception tree, branched by who must act on the failure.

    ConclaveError
    ├── ConfigError                  the operator: fix config.yaml, the environment or a flag
    ├── ProviderError                one provider call failed; carries `code`, `provider`, `status`
    │   ├── TransientProviderError   the retry layer: 408/409/429/5xx/529, timeouts, dropped links
    │   │   ├── RateLimited
    │   │   ├── ProviderTimeout
    │   │   └── ProviderUnreachable
    │   ├── PermanentProviderError   nobody can retry it away: 4xx, exhausted quota, bad bodies
    │   │   ├── MalformedResponse
    │   │   └── MissingApiKey        the operator: set the named environment variable
    │   ├── BreakerOpen              the provider is failing: fail fast until the cooldown ends
    │   └── DeadlineExceeded         the call's deadline ran out before an answer
    ├── ToolError                    the model: fed back to it as a refusal or error result
    │   ├── ToolRefused              a policy said no (fetch_blocked, egress budget, ...)
    │   └── PartialResult            a confer with on_partial "error" came back short of its members
    └── CallerError                  the caller: invalid params, budgets exceeded
        ├── InvalidArguments         failed its input schema; carries the failing JSON path
        ├── UnknownTool
        └── SessionInFlight          the session id is a call's still running

aiohttp's exceptions become a `TransportError` in exactly one place, the transport
(`conclave.net.http`); the provider layer (`conclave.providers.client`) turns that, an HTTP
status and undecodable JSON into this tree, always `raise ... from exc`; the fetch tool
turns it into a refusal.
Every message here is redacted of secrets before it is built.
"""

from __future__ import annotations

from typing import Any


class ConclaveError(Exception):
    """Base of every error Conclave raises on purpose."""

    code: str = "error"

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": str(self)}


class ConfigError(ConclaveError):
    """A configuration problem; the message is one line naming the key path and the fix."""

    code = "config_error"


class ProviderError(ConclaveError):
    """A provider call failed. `message` is the provider's own text, redacted."""

    code = "provider_error"

    def __init__(
        self,
        message: str,
        *,
        provider: str = "",
        status: int | None = None,
        code: str | None = None,
        retry_after: float | None = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.provider = provider
        self.status = status
        if code is not None:
            self.code = code
        self.retry_after = retry_after
        self.request_id = request_id

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.status is not None:
            out["status"] = self.status
        if self.retry_after is not None:
            out["retry_after_seconds"] = self.retry_after
        if self.request_id:
            out["request_id"] = self.request_id
        return out


class TransientProviderError(ProviderError):
    """Worth retrying: the provider may answer if asked again."""

    code = "server_error"


class RateLimited(TransientProviderError):
    code = "rate_limited"


class ProviderTimeout(TransientProviderError):
    code = "timeout"


class ProviderUnreachable(TransientProviderError):
    code = "connection_error"


class PermanentProviderError(ProviderError):
    """Not worth retrying: the same request would fail the same way."""

    code = "bad_request"


class MalformedResponse(PermanentProviderError):
    code = "malformed_response"


class MissingApiKey(PermanentProviderError):
    code = "missing_api_key"


class BreakerOpen(ProviderError):
    code = "breaker_open"


class DeadlineExceeded(ProviderError):
    code = "deadline_exceeded"


class ToolError(ConclaveError):
    """A tool failed in a way the calling model should see and can react to.

    `reason` is machine-readable (a reason of docs/tools.md#fetch or
    docs/worker-loop.md#refusal-reasons, e.g. `private_address`); the message is for people
    and models.
    """

    code = "tool_error"

    def __init__(self, message: str, *, reason: str = "tool_error", tool: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.tool = tool

    def to_dict(self) -> dict[str, Any]:
        return {"reason": self.reason, "message": self.message}


class ToolRefused(ToolError):
    """A policy refused the call before (or instead of) doing anything."""

    code = "tool_refused"


class PartialResult(ToolError):
    """A `confer` asked with `on_partial: "error"` got fewer answers than it needs (every member,
    or its quorum). `answers` are the partial result's answers as JSON (schemas/defs/answer.json);
    `result` is the partial result itself (a `ConferResult`), for the Python API's callers."""

    code = "partial"

    def __init__(
        self, message: str, *, answers: list[dict[str, Any]], result: object = None, tool: str = "confer"
    ) -> None:
        super().__init__(message, reason="partial", tool=tool)
        self.answers = answers
        self.result = result

    def to_dict(self) -> dict[str, Any]:
        return {"reason": self.reason, "message": self.message, "answers": self.answers}


class CallerError(ConclaveError):
    """The caller asked for something invalid or over budget."""

    code = "invalid_params"


class InvalidArguments(CallerError):
    """Arguments failed their input schema: the validator's message and the failing path."""

    def __init__(self, message: str, *, path: str, tool: str = "") -> None:
        super().__init__(f"{path}: {message}" if path != "$" else message)
        self.message = message
        self.path = path
        self.tool = tool

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "path": self.path}


class UnknownTool(CallerError):
    code = "unknown_tool"


class SessionInFlight(CallerError):
    """A call named a session id that a call still running (on any replica) has."""

    code = "session_in_flight"
