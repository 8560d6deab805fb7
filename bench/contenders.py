"""The contenders: one operation of an operating point (a confer, a coordinate, a confer with a
verify hop) done five ways.

- `conclave-api`: `confer` / `coordinate` on one `conclave.Conclave` client opened before the
  timed region;
- `conclave-stdio`: `conclave serve` as a subprocess, `tools/call` over its stdin/stdout;
- `conclave-http`: `conclave serve --http 127.0.0.1:0`, plain JSON-RPC on `POST /rpc`;
- `raw-aiohttp`: the same provider calls written directly with aiohttp and orjson, on one
  shared session with a large connector limit: the practical limit of this machine;
- `litellm`: the same calls through `litellm.acompletion`, what a user would pick instead.

The hand-written fan-outs (`raw-aiohttp`, `litellm`) do the same provider calls in the same
order as Conclave (K at once for confer; proposer, then both critics at once, then the
synthesizer for coordinate; call, run the check, call again for the verify hop) and check
the answers, but add nothing else: no validation, no event log, no transcripts.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import orjson

from bench.common import (
    CRITICS,
    MAX_TOKENS,
    PROPOSER,
    QUESTION,
    SYNTHESIZER,
    TASK,
    VERIFY_FINAL,
    Point,
    bench_env,
    op_arguments,
    op_method,
)

Message = dict[str, str]
STREAM_LIMIT = 64 * 1024 * 1024


class Contender(Protocol):
    name: str

    async def start(self) -> None: ...

    async def op(self) -> None:
        """One operation of the point; raises when the result is not a complete success."""

    async def close(self) -> None: ...

    def cpu_seconds(self) -> float:
        """CPU time (user + system) of the process doing the contender's work, so far."""

    def peak_rss_bytes(self) -> int:
        """Peak resident set of the process doing the contender's work."""

    def server_pid(self) -> int | None:
        """The serving subprocess, when the work happens in one."""


def make_contender(
    name: str, point: Point, urls: Mapping[str, str], config: Path, log: Path, *, serving_gc: bool = False
) -> Contender:
    """`serving_gc`: the Python API's host calls `conclave.serving_gc()` once started, as `conclave
    serve` does for itself; the other contenders' processes keep the default collector."""
    if name == "conclave-api":
        return ConclaveApi(point, config, serving_gc=serving_gc)
    if name == "conclave-stdio":
        return ServeStdio(point, config, log)
    if name == "conclave-http":
        return ServeHttp(point, config, log)
    if name == "conclave-http-w2":  # `serve --http --workers 2`: a process per core (bench.scaleout)
        return ServeHttp(point, config, log, "--workers", "2")
    if name == "raw-aiohttp":
        return RawAiohttp(point, urls["openai"])
    if name == "litellm":
        return Litellm(point, urls["openai"])
    raise ValueError(f"unknown contender {name!r}")


def check_result(point: Point, result: Mapping[str, Any]) -> None:
    """A Conclave result counts only when complete (and, for the verify point, with its hop)."""
    if result.get("degraded"):
        raise RuntimeError(f"degraded result: {result.get('degraded_reasons')}")
    if point.kind == "verify":
        for answer in result["answers"]:
            if answer.get("hops") != 2 or VERIFY_FINAL not in (answer.get("text") or ""):
                raise RuntimeError(f"the verify hop did not happen as scripted: {answer}")


# --------------------------------------------------------------------------- own process


def own_cpu_seconds() -> float:
    """Every thread of this process, at nanosecond resolution (os.times() ticks at 10 ms)."""
    return time.process_time()


def own_peak_rss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def process_peak_rss_bytes(pid: int) -> int:
    """VmHWM of another process (Linux), else its current RSS."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import psutil

    return int(psutil.Process(pid).memory_info().rss)


def process_cpu_seconds(pid: int) -> float:
    """The process's CPU time and its children's, running (`serve --workers`) or ended."""
    import psutil

    process = psutil.Process(pid)
    total = 0.0
    for member in [process, *process.children(recursive=True)]:
        try:
            times = member.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


# --------------------------------------------------------------------------- Conclave, in process


class ConclaveApi:
    name = "conclave-api"

    def __init__(self, point: Point, config: Path, *, serving_gc: bool = False) -> None:
        self.point = point
        self.config_path = config
        self.serving_gc = serving_gc
        self.args = op_arguments(point)
        self._stack = contextlib.AsyncExitStack()
        self._call: Callable[..., Awaitable[Any]] | None = None

    async def start(self) -> None:
        from conclave import Conclave
        from conclave.schema.config import load_config

        config = load_config(str(self.config_path), env=bench_env(), dotenv=None)
        client = await self._stack.enter_async_context(Conclave(config))
        self._call = client.coordinate if self.point.kind == "coordinate" else client.confer
        if self.serving_gc:
            import conclave

            conclave.serving_gc()

    async def op(self) -> None:
        assert self._call is not None
        result = await self._call(**self.args)
        if result.degraded or self.point.kind == "verify":  # the rare case: checked as the served ones are
            check_result(self.point, result.to_dict())

    async def close(self) -> None:
        await self._stack.aclose()

    def cpu_seconds(self) -> float:
        return own_cpu_seconds()

    def peak_rss_bytes(self) -> int:
        return own_peak_rss_bytes()

    def server_pid(self) -> int | None:
        return None


# --------------------------------------------------------------------------- Conclave, served


def serve_command(config: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "conclave", "serve", "--config", str(config), *extra]


class _Served:
    """What both served contenders share: the subprocess, its CPU and memory."""

    name = "conclave-served"

    def __init__(self, point: Point, config: Path, log: Path) -> None:
        self.point = point
        self.config_path = config
        self.log_path = log
        self.method = op_method(point)
        self.args = op_arguments(point)
        self.proc: asyncio.subprocess.Process | None = None
        self._ids = itertools.count(1)

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        return process_cpu_seconds(self.proc.pid)

    def peak_rss_bytes(self) -> int:
        assert self.proc is not None
        return process_peak_rss_bytes(self.proc.pid)

    def server_pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def _open_log(self) -> BinaryIO:
        """The server's stderr goes here (appended; small, opened once)."""
        return open(self.log_path, "ab")

    async def _stop(self) -> None:
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()


class ServeStdio(_Served):
    """MCP over stdio: initialize once, then `tools/call` requests, concurrent for N > 1."""

    name = "conclave-stdio"

    def __init__(self, point: Point, config: Path, log: Path) -> None:
        super().__init__(point, config, log)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._write_lock = asyncio.Lock()

    async def start(self) -> None:
        with self._open_log() as log:
            self.proc = await asyncio.create_subprocess_exec(
                *serve_command(self.config_path),
                env=bench_env(os.environ),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                limit=STREAM_LIMIT,
            )
        self._reader = asyncio.create_task(self._read())
        await self._request(
            "initialize",
            {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "conclave-bench", "version": "1"},
            },
        )
        await self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    async def op(self) -> None:
        reply = await self._request("tools/call", {"name": self.method, "arguments": self.args})
        if "error" in reply:
            raise RuntimeError(f"JSON-RPC error: {reply['error']}")
        result = reply["result"]
        if result.get("isError"):
            raise RuntimeError(f"tool error: {result['content'][0]['text']}")
        check_result(self.point, result["structuredContent"])

    async def close(self) -> None:
        if self.proc is not None and self.proc.stdin is not None:
            self.proc.stdin.close()  # EOF: the server finishes what it has and exits
        await self._stop()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader

    async def _request(self, method: str, params: dict[str, Any]) -> Any:
        request_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        await self._send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        return await future

    async def _send(self, message: Any) -> None:
        assert self.proc is not None
        assert self.proc.stdin is not None
        async with self._write_lock:
            self.proc.stdin.write(orjson.dumps(message) + b"\n")
            await self.proc.stdin.drain()

    async def _read(self) -> None:
        assert self.proc is not None
        assert self.proc.stdout is not None
        stdout = self.proc.stdout
        while line := await stdout.readline():
            message = orjson.loads(line)
            request_id = message.get("id") if isinstance(message, dict) else None
            future = self._pending.pop(request_id, None) if isinstance(request_id, int) else None
            if future is not None and not future.done():
                future.set_result(message)
        failure = RuntimeError(f"conclave serve closed its stdout (see {self.log_path})")
        for future in self._pending.values():
            if not future.done():
                future.set_exception(failure)


class ServeHttp(_Served):
    """`conclave serve --http 127.0.0.1:0`: plain JSON-RPC on POST /rpc, one aiohttp session."""

    name = "conclave-http"
    BOUND = re.compile(r"serving MCP on (http://\S+)/mcp")

    def __init__(self, point: Point, config: Path, log: Path, *serve_args: str) -> None:
        super().__init__(point, config, log)
        self.serve_args = serve_args
        self.url = ""
        self.session: Any = None
        self._drain: asyncio.Task[None] | None = None

    async def start(self) -> None:
        import aiohttp

        self.proc = await asyncio.create_subprocess_exec(
            *serve_command(self.config_path, "--http", "127.0.0.1:0", *self.serve_args),
            env=bench_env(os.environ),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        assert self.proc.stderr is not None
        seen: list[bytes] = []
        while not self.url:
            line = await asyncio.wait_for(self.proc.stderr.readline(), 60)
            if not line:
                raise RuntimeError(f"conclave serve --http exited: {b''.join(seen).decode(errors='replace')}")
            seen.append(line)
            if found := self.BOUND.search(line.decode(errors="replace")):
                self.url = found.group(1) + "/rpc"
        self._drain = asyncio.create_task(self._copy_stderr())
        connector = aiohttp.TCPConnector(limit=10_000, limit_per_host=10_000)
        self.session = aiohttp.ClientSession(connector=connector)

    async def op(self) -> None:
        body = {"jsonrpc": "2.0", "id": next(self._ids), "method": self.method, "params": self.args}
        async with self.session.post(
            self.url, data=orjson.dumps(body), headers={"content-type": "application/json"}
        ) as response:
            reply = orjson.loads(await response.read())
        if "error" in reply:
            raise RuntimeError(f"JSON-RPC error: {reply['error']}")
        check_result(self.point, reply["result"])

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
        await self._stop()
        if self._drain is not None:
            self._drain.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._drain

    async def _copy_stderr(self) -> None:
        assert self.proc is not None
        assert self.proc.stderr is not None
        with self._open_log() as log:
            while chunk := await self.proc.stderr.read(65536):
                log.write(chunk)


# --------------------------------------------------------------------------- hand-written fan-outs


class _FanOut:
    """The same provider calls as Conclave makes, with nothing around them."""

    name = "fan-out"

    def __init__(self, point: Point) -> None:
        self.point = point
        self.models = point.models()

    async def chat(self, model: str, messages: list[Message]) -> str:
        raise NotImplementedError

    async def op(self) -> None:
        if self.point.kind == "coordinate":
            await self._coordinate()
            return
        member = self._verify_member if self.point.kind == "verify" else self._plain_member
        await asyncio.gather(*(member(model) for model in self.models))

    async def _plain_member(self, model: str) -> None:
        if not await self.chat(model, [{"role": "user", "content": QUESTION}]):
            raise RuntimeError(f"{model}: empty answer")

    async def _verify_member(self, model: str) -> None:
        messages = [{"role": "user", "content": QUESTION}]
        first = await self.chat(model, messages)
        result = run_verify_tag(first)
        messages += [
            {"role": "assistant", "content": first},
            {"role": "user", "content": f'<tool_result name="verify">{result}</tool_result>'},
        ]
        final = await self.chat(model, messages)
        if VERIFY_FINAL not in final:
            raise RuntimeError(f"{model}: unexpected final answer {final!r}")

    async def _coordinate(self) -> None:
        proposal = envelope(
            await self.chat(PROPOSER, _role("proposer", f"Task:\n{TASK}")), required=("proposal",)
        )
        review = f"Task:\n{TASK}\n\nProposal:\n{orjson.dumps(proposal).decode()}"
        critiques = await asyncio.gather(*(self.chat(critic, _role("critic", review)) for critic in CRITICS))
        reviews = [envelope(text, required=("verdict",)) for text in critiques]
        final = f"{review}\n\nCritiques:\n{orjson.dumps(reviews).decode()}"
        envelope(await self.chat(SYNTHESIZER, _role("synthesizer", final)), required=("answer",))

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    def cpu_seconds(self) -> float:
        return own_cpu_seconds()

    def peak_rss_bytes(self) -> int:
        return own_peak_rss_bytes()

    def server_pid(self) -> int | None:
        return None


def _role(role: str, user: str) -> list[Message]:
    system = f"You are the {role}. Answer with one JSON object only."
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def envelope(text: str, *, required: tuple[str, ...]) -> dict[str, Any]:
    value = orjson.loads(text)
    if not isinstance(value, dict) or any(key not in value for key in required):
        raise RuntimeError(f"not a role envelope: {text[:200]!r}")
    return value


def run_verify_tag(text: str) -> str:
    """Parse the scripted `<tool_call>` and run its `1+1 == 2` math checks (the only kind scripted)."""
    start, end = text.find("<tool_call>"), text.find("</tool_call>")
    if start < 0 or end < 0:
        raise RuntimeError(f"no tool call in {text[:200]!r}")
    call = orjson.loads(text[start + len("<tool_call>") : end])
    results = []
    for index, check in enumerate(call["args"]["checks"]):
        left, _, right = check["expression"].partition("+")
        passed = int(left) + int(right) == check["expected"]
        results.append({"index": index, "type": "math", "passed": passed, "detail": ""})
    return orjson.dumps({"passed": all(r["passed"] for r in results), "results": results}).decode()


class RawAiohttp(_FanOut):
    name = "raw-aiohttp"

    def __init__(self, point: Point, openai_url: str) -> None:
        super().__init__(point)
        self.url = openai_url.rstrip("/") + "/chat/completions"
        self.headers = {"content-type": "application/json", "authorization": "Bearer bench-dummy"}
        self.session: Any = None

    async def start(self) -> None:
        import aiohttp

        connector = aiohttp.TCPConnector(limit=10_000, limit_per_host=10_000)
        self.session = aiohttp.ClientSession(connector=connector)

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def chat(self, model: str, messages: list[Message]) -> str:
        # An exact-size copy, as Conclave keeps: orjson's own result holds ~4 KiB while the call
        # waits, ~9 MB at 2,500 calls in flight (the limit should not carry what is easy to drop).
        encoded = orjson.dumps({"model": model, "messages": messages, "max_tokens": MAX_TOKENS})
        body = bytes(memoryview(encoded))
        async with self.session.post(self.url, data=body, headers=self.headers) as response:
            data = await response.read()
            if response.status != 200:
                raise RuntimeError(f"{model}: HTTP {response.status}: {data[:200]!r}")
        text: str = orjson.loads(data)["choices"][0]["message"]["content"]
        return text


class Litellm(_FanOut):
    name = "litellm"

    def __init__(self, point: Point, openai_url: str) -> None:
        super().__init__(point)
        self.api_base = openai_url
        self.acompletion: Any = None

    async def start(self) -> None:
        os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # no network: the bundled price map
        import litellm

        litellm.suppress_debug_info = True
        self.acompletion = litellm.acompletion

    async def chat(self, model: str, messages: list[Message]) -> str:
        response = await self.acompletion(
            model=f"openai/{model}",
            api_base=self.api_base,
            api_key="bench-dummy",
            messages=messages,
            max_tokens=MAX_TOKENS,
        )
        text: str = response.choices[0].message.content or ""
        return text


def litellm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("litellm") is not None
