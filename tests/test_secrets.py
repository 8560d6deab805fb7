"""A canary key set in the environment never reaches an error, a log line or the event log,
even when the provider echoes it back."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anyio
import httpx
import orjson
import pytest

from conclave.core.errors import ProviderError
from conclave.core.messages import CompletionRequest
from conclave.net.http import TransportError
from conclave.obs.redact import SENSITIVE_KEYS, Redactor, spellings
from conclave.schema.config import Config
from tests.support import ScriptedTransport, open_pool, provider_entry

pytestmark = pytest.mark.anyio

CANARY = "sk-canary-7f3a9c1e5b2d8f4a6c0e"
ENTRIES = {
    "openai": provider_entry("openai", "gpt-4o-mini", "https://api.openai.com/v1", api_key_env="CANARY_KEY"),
    "anthropic": provider_entry(
        "anthropic", "claude-haiku-4-5", "https://api.anthropic.com", api_key_env="CANARY_KEY"
    ),
    "gemini": provider_entry(
        "gemini", "gemini-2.5-flash", "https://generativelanguage.googleapis.com", api_key_env="CANARY_KEY"
    ),
}


def echo_key_back(request: httpx.Request) -> httpx.Response:
    """A hostile or careless provider that quotes the credential it was sent."""
    sent = (
        request.headers.get("authorization")
        or request.headers.get("x-api-key")
        or request.headers.get("x-goog-api-key")
    )
    return httpx.Response(
        401,
        json={"error": {"message": f"Incorrect API key provided: {sent}", "type": "authentication_error"}},
    )


def fail_with_key_in_message(request: httpx.Request) -> httpx.Response:
    raise TransportError(f"cannot connect to {request.url}?key={CANARY}", failure="connection_error")


@pytest.mark.parametrize("kind", ["openai", "anthropic", "gemini"])
@pytest.mark.parametrize("step", [echo_key_back, fail_with_key_in_message])
async def test_canary_key_never_reaches_errors_events_or_output(
    make_config: Callable[..., Config],
    events_path: Path,
    capfd: pytest.CaptureFixture[str],
    kind: str,
    step: Callable[[httpx.Request], httpx.Response],
) -> None:
    config = make_config({"p": ENTRIES[kind]}, env={"CANARY_KEY": CANARY}, retry={"max_attempts": 2})
    transport = ScriptedTransport(step)
    async with open_pool(config, transport) as pool:
        with pytest.raises(ProviderError) as info:
            await pool.get("p").complete(CompletionRequest.ask("q"), deadline=anyio.current_time() + 5)
    sent_headers = " ".join(str(v) for r in transport.requests for v in r.headers.values())
    assert CANARY in sent_headers, "the key must actually be sent, or this test proves nothing"
    error = info.value
    assert CANARY not in str(error)
    assert CANARY not in repr(error.to_dict())
    assert CANARY not in "".join(str(a) for a in error.args)
    log = events_path.read_text(encoding="utf-8")
    assert "provider_call" in log
    assert CANARY not in log
    out, err = capfd.readouterr()
    assert CANARY not in out + err


def test_redactor_masks_configured_values_and_credential_shapes() -> None:
    redactor = Redactor(["my-configured-secret-1"])
    text = redactor.text("a my-configured-secret-1 b Bearer abcdefghijkl AIza" + "x" * 35 + " ?key=zzz&x=1")
    assert "my-configured-secret-1" not in text
    assert "abcdefghijkl" not in text
    assert "AIza" not in text
    assert "zzz" not in text
    assert "x=1" in text


def test_redactor_masks_sensitive_fields_wherever_they_nest() -> None:
    value = Redactor().value(
        {
            "headers": {"Authorization": "Basic dXNlcjpwYXNz", "x-goog-api-key": "g"},
            "list": [{"x-api-key": "k"}],
            "fine": "hello",
        }
    )
    assert value == {
        "headers": {"Authorization": "[REDACTED]", "x-goog-api-key": "[REDACTED]"},
        "list": [{"x-api-key": "[REDACTED]"}],
        "fine": "hello",
    }


@pytest.mark.parametrize("name", sorted(SENSITIVE_KEYS))
def test_every_sensitive_field_in_serialized_json_is_masked_whatever_its_case(name: str) -> None:
    """json_bytes pre-checks a line for the names' endings before its regex runs: each name,
    in any case, must still be caught (and a field that only resembles one left alone)."""
    line = orjson.dumps({name.upper(): "s3cr3t-value", f"{name}_not": "visible", "note": "ok"})
    redacted = orjson.loads(Redactor().json_bytes(line))
    assert redacted[name.upper()] == "[REDACTED]"
    assert redacted[f"{name}_not"] == "visible"


@pytest.mark.parametrize("length", [8, 14, 15, 16, 22, 23, 24, 39, 40, 164])
def test_every_spelling_is_caught_at_every_offset_of_a_serialized_line(length: int) -> None:
    """json_bytes reads only every stride-th 8-byte word of a line to rule the keys out (one
    pass for all spellings, not one per spelling): a spelling must still be caught wherever it
    starts and whatever follows it, at every key length around the word and stride edges."""
    key = "".join("Ab3-x_9Qz"[(i * 7 + length) % 9] for i in range(length))
    other = "sk-" + "Zy8_" * 12  # a second, longer key: the shortest one sets the stride
    redactor = Redactor([key, other])
    for form in spellings(key) | spellings(other):
        for before in range(17):
            for after in (0, 1, 7, 9):
                line = orjson.dumps({"m": "." * before + form + "," * after, "n": 1})
                redacted = redactor.json_bytes(line)
                assert form.encode() not in redacted, (form, before, after)
                assert orjson.loads(redacted)["n"] == 1
