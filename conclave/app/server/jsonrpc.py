"""JSON-RPC 2.0 messages: decoding one wire message, validating its envelope, and the one
function that turns any exception into a JSON-RPC error."""

from __future__ import annotations

import traceback
import uuid
from typing import Any

import orjson

from conclave.core.errors import CallerError, InvalidArguments, ToolError, UnknownTool
from conclave.core.records import record
from conclave.obs.telemetry import Telemetry

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
TOOL_FAILED = -32000  # a tool's failure when called as a plain method (docs/server.md#plain-json-rpc)

RequestId = str | int | None
_NO_ID = object()


class RpcError(Exception):
    """An error to send as-is: code, message and optional data."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


class Parsed:
    """Marker base for the result of `decode`."""


@record
class Request(Parsed):
    method: str
    params: Any
    id: RequestId
    is_notification: bool


@record
class Invalid(Parsed):
    error: RpcError
    id: RequestId


def decode(line: bytes) -> Any:
    """Strict JSON (UTF-8, no NaN, bounded depth by orjson); RpcError(-32700) otherwise."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise RpcError(PARSE_ERROR, f"Parse error: {exc}") from None


def classify(message: Any) -> Request | Invalid | None:
    """Check one message's envelope. Responses sent to us (we make no requests) are ignored: None."""
    if not isinstance(message, dict):
        return Invalid(RpcError(INVALID_REQUEST, "Invalid Request: a message must be a JSON object"), None)
    raw_id = message.get("id", _NO_ID)
    request_id = raw_id if _valid_id(raw_id) else None
    if message.get("jsonrpc") != "2.0":
        return Invalid(RpcError(INVALID_REQUEST, 'Invalid Request: "jsonrpc" must be "2.0"'), request_id)
    if "method" not in message and ("result" in message or "error" in message):
        return None
    method = message.get("method")
    if not isinstance(method, str):
        return Invalid(RpcError(INVALID_REQUEST, 'Invalid Request: "method" must be a string'), request_id)
    if raw_id is not _NO_ID and not _valid_id(raw_id):
        return Invalid(
            RpcError(INVALID_REQUEST, 'Invalid Request: "id" must be a string, an integer or null'), None
        )
    params = message.get("params")
    if params is not None and not isinstance(params, dict | list):
        return Invalid(
            RpcError(INVALID_REQUEST, 'Invalid Request: "params" must be an object or an array'), request_id
        )
    return Request(method, params, request_id, raw_id is _NO_ID)


def _valid_id(value: Any) -> bool:
    return value is None or isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def request_id_of(message: Any) -> RequestId:
    """The id to answer `message` with when it cannot be handled: its own, if it has a valid one."""
    found = message.get("id") if isinstance(message, dict) else None
    return found if _valid_id(found) else None


def response(request_id: RequestId, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def error_response(request_id: RequestId, error: RpcError) -> dict[str, Any]:
    body: dict[str, Any] = {"code": error.code, "message": error.message}
    if error.data is not None:
        body["data"] = error.data
    return {"jsonrpc": "2.0", "id": request_id, "error": body}


def to_rpc_error(exc: BaseException, *, method: str, telemetry: Telemetry) -> RpcError:
    """The one place an exception becomes a JSON-RPC error. Unknown failures get an id that
    finds their traceback in the event log; their details never reach the caller."""
    if isinstance(exc, RpcError):
        error = exc
    elif isinstance(exc, InvalidArguments):
        error = RpcError(
            INVALID_PARAMS,
            f"Invalid params: {exc.path}: {exc.message}",
            {"path": exc.path, "message": exc.message},
        )
    elif isinstance(exc, UnknownTool):
        error = RpcError(INVALID_PARAMS, str(exc))
    elif isinstance(exc, ToolError):
        error = RpcError(TOOL_FAILED, exc.message, exc.to_dict())  # {reason, message, ...}
    elif isinstance(exc, CallerError):
        error = RpcError(INVALID_PARAMS, str(exc), {"reason": exc.code})
    else:
        error_id = uuid.uuid4().hex[:16]
        trace = "".join(traceback.format_exception(exc))
        telemetry.emit(
            "rpc_error",
            method=method,
            code=INTERNAL_ERROR,
            message=f"{type(exc).__name__}: {exc}",
            error_id=error_id,
            traceback=trace,
        )
        return RpcError(INTERNAL_ERROR, "Internal error", {"error_id": error_id})
    telemetry.emit("rpc_error", method=method, code=error.code, message=error.message)
    return error
