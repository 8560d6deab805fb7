"""Load and soak driver (issue F7 item 5): many concurrent `confer` calls against a real
`conclave serve` process (stdio or HTTP), with the simulated panel in a process of its own.

Every call is planned in advance (`CallPlan`): its question carries a unique nonce and, for each
panel member, a token such as `[beta=503@120]` that the panel's per-model rules turn into a reply
after that latency (`ok`, HTTP 500/503/429, a dropped connection or a malformed body). The driver
therefore knows what each answer must be, and checks it:

- every request id is answered exactly once, by a JSON-RPC result valid against
  `schemas/confer.output.json`, whose answers have the planned statuses and whose ok texts quote
  the call's own nonce (so replies cannot be crossed between calls);
- `transcripts.dir` holds exactly one transcript per call, each parses, and its `session_id` and
  `result` match the reply (after the redaction the transcript writer applies);
- every line of the event log is valid against `schemas/events/<event>.json`, and each session
  has one `session_start`, one `session_end` and one `provider_call` per member;
- the server's RSS after the measured run is within 10 % of its RSS after a warm-up run of the
  same size; the server writes no traceback to stderr.

Half the calls are plain JSON-RPC `confer`, half MCP `tools/call`. `run_load` and `run_soak` return
reports; `tests/hardening/test_load.py` asserts on them and records the figures.

    .venv/bin/python -m tests.hardening.load load --transport stdio -n 1000
    .venv/bin/python -m tests.hardening.load soak --transport http --rate 20 --seconds 600
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import re
import signal
import statistics
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import anyio
import httpx
import orjson
import yaml
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream
from httpx_aiohttp import AiohttpTransport

from conclave.obs.redact import Redactor
from conclave.schema.schemas import first_error

Transport = Literal["stdio", "http"]
TRANSPORTS: tuple[Transport, ...] = ("stdio", "http")

MEMBERS: tuple[tuple[str, str, str], ...] = (
    ("alpha", "openai", "m-alpha"),
    ("beta", "anthropic", "m-beta"),
    ("gamma", "gemini", "m-gamma"),
)
LATENCIES_MS: tuple[int, ...] = (50, 120, 250, 400)
FAULTS: Mapping[str, dict[str, Any]] = {
    "500": {"status": 500},
    "503": {"status": 503},
    "429": {"status": 429, "headers": {"retry-after": "1"}},
    "drop": {"fault": "drop"},
    "malformed": {"fault": "malformed"},
}
# Text that is awkward to carry through JSON, redaction and the three wire formats: quotes,
# backslashes, escapes, non-ASCII, control characters, markup, and a URL with a key-like query.
SNIPPETS: tuple[str, ...] = (
    "Which message queue fits a three-person team?",
    'She said "use Postgres" and left.',
    "A path C:\\temp\\new and a literal \\n and \\u0041.",
    "Unicode: café, 東京, Ωmega, emoji 🚀, RTL שלום.",
    "Lines\nand\ttabs\r\nand a bell \x07 in text.",
    '<tool_result name=\'fetch\'>not a real result</tool_result> {"json": [1, 2, {"x": null}]}',
    'Docs at https://docs.example.test/api?key=abc123&page=2 say "see above".',
    'A key-like link https://api.example.test/v1?key=abc123"quoted" in prose.',
    "Ends with a backslash \\",
)
PRICE = {"input_per_mtok": 1.0, "output_per_mtok": 4.0}
ANSWER_PREFIX = "[simulated {model}] load answer to: "
MCP_VERSION = "2025-11-25"
_TRANSCRIPT_NAME = re.compile(r"^(.+)-(?:confer|coordinate)-\d+(?:-\d+)?\.json$")
ADDRESS_LINE = re.compile(rb"serving MCP on http://([^/\s]+):(\d+)/mcp")


# ----------------------------------------------------------------------------- plans


@dataclass(frozen=True)
class CallPlan:
    """One confer call: its nonce, what each member will do, and the door it goes through."""

    index: int
    nonce: str
    outcomes: Mapping[str, str]  # member -> "ok" or a FAULTS key
    latencies: Mapping[str, int]
    snippet: str

    @property
    def mode(self) -> Literal["plain", "mcp"]:
        return "mcp" if self.index % 2 else "plain"

    @property
    def request_id(self) -> int | str:
        return f"m-{self.index}" if self.mode == "mcp" else self.index

    @property
    def progress_token(self) -> str | None:
        """Every fourth call asks for progress (MCP only): over HTTP its reply is an SSE stream."""
        return f"p-{self.index}" if self.index % 4 == 3 else None

    @property
    def faulted(self) -> tuple[str, ...]:
        return tuple(m for m, o in self.outcomes.items() if o != "ok")

    def question(self) -> str:
        tokens = " ".join(f"[{m}={self.outcomes[m]}@{self.latencies[m]}]" for m in self.outcomes)
        return f"load {self.nonce} {tokens} {self.snippet}"

    def arguments(self) -> dict[str, Any]:
        return {"question": self.question()}

    def message(self) -> dict[str, Any]:
        if self.mode == "mcp":
            params: dict[str, Any] = {"name": "confer", "arguments": self.arguments()}
            if self.progress_token is not None:
                params["_meta"] = {"progressToken": self.progress_token}
            return {"jsonrpc": "2.0", "id": self.request_id, "method": "tools/call", "params": params}
        return {"jsonrpc": "2.0", "id": self.request_id, "method": "confer", "params": self.arguments()}


def make_plans(count: int, *, start: int = 0, seed: int = 7, fault_rate: float = 0.05) -> list[CallPlan]:
    """`count` calls numbered from `start`; each member's reply faults with `fault_rate`."""
    rng = random.Random(f"{seed}:{start}:{count}")
    plans = []
    for index in range(start, start + count):
        outcomes = {
            m: (rng.choice(sorted(FAULTS)) if rng.random() < fault_rate else "ok") for m, _, _ in MEMBERS
        }
        latencies = {m: rng.choice(LATENCIES_MS) for m, _, _ in MEMBERS}
        nonce = f"c{index:06d}x{rng.getrandbits(32):08x}"
        plans.append(CallPlan(index, nonce, outcomes, latencies, SNIPPETS[index % len(SNIPPETS)]))
    return plans


def scenarios() -> dict[str, dict[str, Any]]:
    """Per model: one rule per (outcome, latency) token; anything unmatched is a loud wrong answer."""
    out: dict[str, dict[str, Any]] = {}
    for member, _kind, model in MEMBERS:
        rules = []
        for latency in LATENCIES_MS:
            ok_reply = {"text": ANSWER_PREFIX + "{last}", "latency_ms": latency}
            rules.append({"contains": f"[{member}=ok@{latency}]", "reply": ok_reply})
            for fault, reply in FAULTS.items():
                rules.append(
                    {"contains": f"[{member}={fault}@{latency}]", "reply": {**reply, "latency_ms": latency}}
                )
        out[model] = {"rules": rules, "replies": [{"text": "UNPLANNED CALL: {last}"}]}
    return out


# ----------------------------------------------------------------------------- checks


def reply_result(message: Any) -> tuple[dict[str, Any] | None, str | None]:
    """The confer result carried by a reply (plain `result` or MCP `structuredContent`)."""
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        return None, f"not a JSON-RPC 2.0 reply: {str(message)[:200]}"
    if "error" in message:
        return None, f"JSON-RPC error: {message['error']}"
    result = message.get("result")
    if isinstance(result, dict) and "structuredContent" in result:
        if result.get("isError") is not False:
            return None, f"MCP tool error: {str(result)[:300]}"
        result = result["structuredContent"]
    if not isinstance(result, dict):
        return None, f"no result object: {str(message)[:200]}"
    return result, None


def check_reply(
    plan: CallPlan, message: Any, progress: Sequence[Any] = ()
) -> tuple[dict[str, Any] | None, list[str]]:
    """The result and every way it differs from the plan (empty when it is right). `progress`: the
    `notifications/progress` params that arrived for the call's token before its reply."""
    result, problem = reply_result(message)
    if result is None:
        return None, [problem or "no result"]
    problems = []
    if plan.progress_token is not None:
        steps = [p.get("progress") for p in progress if isinstance(p, dict)]
        # One whole step per answer; between them, streamed token counts and heartbeats add
        # thousandths, and progress only grows.
        answered = [step for step in steps if isinstance(step, int)]
        growing = all(a < b for a, b in itertools.pairwise(steps))
        if answered != list(range(1, len(MEMBERS) + 1)) or not growing:
            problems.append(f"progress before the reply: {steps}, expected 1..{len(MEMBERS)} growing")
    elif progress:
        problems.append(f"progress nobody asked for: {list(progress)[:3]}")
    if message.get("id") != plan.request_id:
        problems.append(f"id {message.get('id')!r} answers request {plan.request_id!r}")
    error = first_error("confer.output.json", result)
    if error is not None:
        problems.append(f"confer.output.json: {error.message} at {list(error.absolute_path)}")
    answers = {str(a.get("provider")): a for a in result.get("answers", []) if isinstance(a, dict)}
    if sorted(answers) != sorted(plan.outcomes):
        problems.append(f"answers from {sorted(answers)}, expected {sorted(plan.outcomes)}")
    for member, outcome in plan.outcomes.items():
        answer = answers.get(member)
        if answer is None:
            continue
        if outcome == "ok":
            if answer.get("status") != "ok":
                problems.append(f"{member}: status {answer.get('status')} {answer.get('error')}, planned ok")
            elif plan.nonce not in (answer.get("text") or ""):
                problems.append(
                    f"{member}: text does not quote this call's nonce: {answer.get('text')!r:.120}"
                )
        elif answer.get("status") == "ok" or not (answer.get("error") or {}).get("code"):
            problems.append(
                f"{member}: planned fault {outcome} but got {answer.get('status')} {answer.get('error')}"
            )
    if result.get("degraded") != bool(plan.faulted):
        problems.append(f"degraded is {result.get('degraded')} with faults {plan.faulted}")
    return result, problems


@dataclass
class TranscriptCheck:
    files: int = 0
    lost: list[str] = field(default_factory=list)  # session ids without a transcript
    duplicated: list[str] = field(default_factory=list)
    corrupt: list[str] = field(default_factory=list)  # unparsable, leftover temp files, mismatches
    unexpected: list[str] = field(default_factory=list)

    @property
    def bad(self) -> int:
        return len(self.lost) + len(self.duplicated) + len(self.corrupt) + len(self.unexpected)


def check_transcripts(directory: Path, results: Mapping[str, Mapping[str, Any]]) -> TranscriptCheck:
    """`results`: session id -> the confer result its reply carried."""
    check = TranscriptCheck()
    redactor = Redactor()
    found: dict[str, list[tuple[Path, Any]]] = {}
    for path in sorted(directory.rglob("*")) if directory.exists() else []:
        if path.is_dir():
            continue
        check.files += 1
        if not path.name.endswith(".json") or path.name.startswith("."):
            check.corrupt.append(f"{path.name}: leftover file")
            continue
        try:
            data = orjson.loads(path.read_bytes())
        except orjson.JSONDecodeError as exc:
            data = _Unparsable(str(exc))
        # The writer names files `<session>-<tool>-<time>[-<seq>].json`; the name finds an unparsable one.
        named = _TRANSCRIPT_NAME.match(path.name)
        session = data.get("session_id") if isinstance(data, dict) else (named[1] if named else path.name)
        found.setdefault(str(session), []).append((path, data))
    for session, result in results.items():
        entries = found.pop(session, [])
        if not entries:
            check.lost.append(session)
            continue
        if len(entries) > 1:
            check.duplicated.append(session)
        path, data = entries[0]
        if isinstance(data, _Unparsable):
            check.corrupt.append(f"{path.name}: does not parse: {data}")
            continue
        expected = orjson.loads(orjson.dumps(redactor.value(dict(result)), default=str))
        if data.get("tool") != "confer" or data.get("result") != expected:
            check.corrupt.append(
                f"{path.name}: does not match its reply{_diff(expected, data.get('result'))}"
            )
    check.unexpected.extend(f"{s}: {len(v)} transcript(s) of no call" for s, v in found.items())
    return check


class _Unparsable(str):
    pass


def _diff(expected: Any, got: Any, where: str = "") -> str:
    if isinstance(expected, dict) and isinstance(got, dict):
        for key in sorted(set(expected) | set(got)):
            if expected.get(key) != got.get(key):
                return _diff(expected.get(key), got.get(key), f"{where}.{key}")
    if isinstance(expected, list) and isinstance(got, list) and len(expected) == len(got):
        for i, (e, g) in enumerate(zip(expected, got, strict=True)):
            if e != g:
                return _diff(e, g, f"{where}[{i}]")
    return f" (at {where or '$'}: expected {str(expected)[:120]!r}, got {str(got)[:120]!r})"


@dataclass
class EventCheck:
    lines: int = 0
    invalid: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # sessions short of their events
    counts: dict[str, int] = field(default_factory=dict)


def check_events(path: Path, sessions: Iterable[str], members: int = len(MEMBERS)) -> EventCheck:
    check = EventCheck()
    per_session: dict[str, Counter[str]] = {}
    counts: Counter[str] = Counter()
    raw = path.read_bytes() if path.exists() else b""
    for number, line in enumerate(raw.split(b"\n"), 1):
        if not line:
            continue
        check.lines += 1
        try:
            event = orjson.loads(line)
            name = event.get("event")
            error = first_error(f"events/{name}.json", event)
        except (orjson.JSONDecodeError, AttributeError, RuntimeError) as exc:
            check.invalid.append(f"line {number}: {type(exc).__name__}: {exc}: {line[:200]!r}")
            continue
        if error is not None:
            check.invalid.append(f"line {number}: {name}: {error.message}")
            continue
        counts[name] += 1
        if isinstance(event.get("session_id"), str):
            per_session.setdefault(event["session_id"], Counter())[name] += 1
    if not raw.endswith(b"\n") and raw:
        check.invalid.append("the log does not end with a newline (a torn last line)")
    for session in sessions:
        seen = per_session.get(session, Counter())
        want = {"session_start": 1, "session_end": 1, "provider_call": members}
        short = {k: seen.get(k, 0) for k, v in want.items() if seen.get(k, 0) != v}
        if short:
            check.missing.append(f"{session}: {short} (want {want})")
    check.counts = dict(counts)
    return check


def rss_bytes(pid: int) -> int:
    """Resident set size of `pid` (psutil when installed, else /proc on Linux)."""
    try:
        import psutil  # type: ignore[import-untyped]
    except ImportError:
        status = Path(f"/proc/{pid}/status").read_text()
        kib = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
        if kib is None:
            raise RuntimeError(f"cannot read the RSS of process {pid}") from None
        return int(kib.group(1)) * 1024
    return int(psutil.Process(pid).memory_info().rss)


# ----------------------------------------------------------------------------- processes


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env.pop("CONCLAVE_CONFIG", None)
    env.pop("CONCLAVE_PANEL", None)
    env.pop("CONCLAVE_TELEMETRY_PATH", None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class SimProcess:
    """`python -m conclave.app.sim --port 0 --no-record` in its own process, scripted for the load."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.urls: dict[str, str] = {}
        self._process: Process | None = None

    async def __aenter__(self) -> SimProcess:
        stderr = (self.workdir / "sim.stderr").open("wb")
        self._process = await anyio.open_process(
            [sys.executable, "-m", "conclave.app.sim", "--port", "0", "--no-record"],
            stdout=-1,
            stderr=stderr,
            env=_child_env(),
        )
        stderr.close()
        assert self._process.stdout is not None
        out = BufferedByteReceiveStream(self._process.stdout)
        with anyio.fail_after(30):
            while len(self.urls) < 3:
                kind, _, url = (await out.receive_until(b"\n", 4096)).decode().partition(" ")
                self.urls[kind] = url.strip()
        root = self.urls["openai"].rsplit("/openai", 1)[0]
        async with httpx.AsyncClient(base_url=root, trust_env=False) as client:
            for model, scenario in scenarios().items():
                reply = await client.put(f"/_sim/scenarios/{model}", json=scenario)
                reply.raise_for_status()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        if self._process is not None:
            await _stop(self._process, signal.SIGTERM)


async def _stop(process: Process, sig: signal.Signals, seconds: float = 15) -> int:
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(sig)
        with anyio.move_on_after(seconds):
            return await process.wait()
        with contextlib.suppress(ProcessLookupError):
            process.kill()
    return await process.wait()


def write_config(sim: SimProcess, workdir: Path, **limits: Any) -> Path:
    """Three members, one per wire kind; one attempt so faults surface; the breaker out of the way
    (a run of unlucky faults must not turn healthy answers into `breaker_open`)."""
    providers = {
        member: {"kind": kind, "model": model, "base_url": sim.urls[kind], "price": PRICE}
        for member, kind, model in MEMBERS
    }
    data = {
        "providers": providers,
        "panel": [m for m, _, _ in MEMBERS],
        "roles": {"proposer": "alpha", "critics": ["beta", "gamma"], "synthesizer": "beta"},
        "limits": {"timeout_seconds": 120, "retry": {"max_attempts": 1}, **limits},
        "breakers": {"failure_threshold": 1000},
        # Content on: question text goes through the event log's serializer and redactor too.
        "telemetry": {"path": str(workdir / "events.ndjson"), "include_content": True},
        "transcripts": {"dir": str(workdir / "transcripts")},
    }
    path = workdir / "load.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


class LostReply(Exception):
    pass


class StdioServer:
    """`conclave serve` over stdio: requests are written as they come, one reader routes replies by id."""

    transport: Transport = "stdio"

    def __init__(self, process: Process, stderr_path: Path) -> None:
        self.process = process
        self.stderr_path = stderr_path
        self.duplicates: list[Any] = []
        self.unexpected: list[Any] = []
        self._waiting: dict[Any, anyio.Event] = {}
        self._replies: dict[Any, Any] = {}
        self._answered: set[Any] = set()
        self.progress: dict[Any, list[Any]] = {}
        self._lock = anyio.Lock()
        self.stdin_closed = False
        self.eof = anyio.Event()

    @property
    def pid(self) -> int:
        return self.process.pid

    async def read_replies(self) -> None:
        assert self.process.stdout is not None
        out = BufferedByteReceiveStream(self.process.stdout)
        try:
            while True:
                line = await out.receive_until(b"\n", 256 * 1024 * 1024)
                try:
                    message = orjson.loads(line)
                except orjson.JSONDecodeError:
                    self.unexpected.append(line[:200])
                    continue
                rid = message.get("id") if isinstance(message, dict) else None
                if _is_progress(message):
                    token = message["params"].get("progressToken")
                    self.progress.setdefault(token, []).append(message["params"])
                elif rid in self._waiting:
                    self._replies[rid] = message
                    self._answered.add(rid)
                    self._waiting.pop(rid).set()
                elif rid in self._answered:
                    self.duplicates.append(message)
                else:
                    self.unexpected.append(message)
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.ClosedResourceError):
            pass
        finally:
            self.eof.set()

    async def send(self, message: Any) -> None:
        assert self.process.stdin is not None
        async with self._lock:
            await self.process.stdin.send(orjson.dumps(message) + b"\n")

    async def call(self, message: dict[str, Any], limit_s: float) -> Any:
        rid = message["id"]
        event = self._waiting[rid] = anyio.Event()
        await self.send(message)
        with anyio.move_on_after(limit_s):
            await event.wait()
        self._waiting.pop(rid, None)
        if rid not in self._replies:
            raise LostReply(
                f"no reply to {rid!r} within {limit_s:.0f}s"
                + (" (stdout closed)" if self.eof.is_set() else "")
            )
        return self._replies.pop(rid)

    async def handshake(self) -> None:
        init = {
            "protocolVersion": MCP_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "load", "version": "1"},
        }
        reply = await self.call({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": init}, 30)
        assert reply.get("result", {}).get("protocolVersion") == MCP_VERSION, reply
        await self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    async def close_stdin(self) -> None:
        assert self.process.stdin is not None
        async with self._lock:
            if not self.stdin_closed:
                self.stdin_closed = True
                with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                    await self.process.stdin.aclose()


class HttpServer:
    """`conclave serve --http 127.0.0.1:0`: plain calls on /rpc, MCP calls on /mcp, one big pool."""

    transport: Transport = "http"

    def __init__(self, process: Process, stderr_path: Path, base_url: str, connections: int) -> None:
        self.process = process
        self.stderr_path = stderr_path
        self.base_url = base_url
        self.duplicates: list[Any] = []
        self.unexpected: list[Any] = []
        self.progress: dict[Any, list[Any]] = {}
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        # httpx's own pool degrades badly at hundreds of concurrent requests (see conclave/net/http.py),
        # which would measure the client; its API over the aiohttp transport does not.
        transport = AiohttpTransport(limits=limits, trust_env=False)
        self.client = httpx.AsyncClient(
            base_url=base_url, limits=limits, timeout=None, trust_env=False, transport=transport
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    async def call(self, message: dict[str, Any], limit_s: float) -> Any:
        mcp = message["method"] in ("tools/call", "initialize")
        headers = {"accept": "application/json, text/event-stream"} if mcp else {}
        if mcp and message["method"] != "initialize":
            headers["mcp-protocol-version"] = MCP_VERSION
        try:
            with anyio.fail_after(limit_s):
                reply = await self.client.post(
                    "/mcp" if mcp else "/rpc",
                    content=orjson.dumps(message),
                    headers={"content-type": "application/json", **headers},
                )
        except TimeoutError:
            raise LostReply(f"no reply to {message['id']!r} within {limit_s:.0f}s") from None
        except httpx.HTTPError as exc:
            raise LostReply(f"{message['id']!r}: {type(exc).__name__}: {exc}") from None
        if reply.status_code != 200:
            raise LostReply(f"{message['id']!r}: HTTP {reply.status_code}: {reply.text[:200]}")
        try:
            if not reply.headers.get("content-type", "").startswith("text/event-stream"):
                return orjson.loads(reply.content)
            events = [
                orjson.loads(line[5:]) for line in reply.content.split(b"\n") if line.startswith(b"data:")
            ]
        except orjson.JSONDecodeError:
            raise LostReply(f"{message['id']!r}: unparsable body {reply.content[:200]!r}") from None
        final = [e for e in events if not _is_progress(e)]
        for event in events:
            if _is_progress(event):
                self.progress.setdefault(event["params"].get("progressToken"), []).append(event["params"])
        if len(final) != 1:
            raise LostReply(
                f"{message['id']!r}: SSE stream with {len(final)} replies: {reply.content[:300]!r}"
            )
        return final[0]

    async def handshake(self) -> None:
        init = {
            "protocolVersion": MCP_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "load", "version": "1"},
        }
        reply = await self.call({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": init}, 30)
        assert reply.get("result", {}).get("protocolVersion") == MCP_VERSION, reply


Server = StdioServer | HttpServer


@contextlib.asynccontextmanager
async def serve(
    transport: Transport, config: Path, workdir: Path, *, connections: int = 1100
) -> AsyncIterator[Any]:
    """Start `conclave serve` (stdio or HTTP) on `config`; yields a StdioServer or HttpServer."""
    stderr_path = workdir / f"serve-{transport}.stderr"
    stderr = stderr_path.open("wb")
    command = [sys.executable, "-m", "conclave", "serve", "--config", str(config)]
    if transport == "http":
        command += ["--http", "127.0.0.1:0"]
    process = await anyio.open_process(
        command,
        cwd=workdir,
        env=_child_env(),
        stdin=-1 if transport == "stdio" else None,
        stderr=stderr,
        stdout=-1 if transport == "stdio" else None,
    )
    stderr.close()
    try:
        if transport == "stdio":
            server = StdioServer(process, stderr_path)
            async with anyio.create_task_group() as group:
                group.start_soon(server.read_replies)
                await server.handshake()
                yield server
                await server.close_stdin()  # EOF: the server finishes what it has and exits
                with anyio.move_on_after(60):
                    await server.eof.wait()
                with anyio.move_on_after(30):
                    await process.wait()
                group.cancel_scope.cancel()
        else:
            base_url = await _wait_for_address(process, stderr_path)
            http = HttpServer(process, stderr_path, base_url, connections)
            async with http.client:
                await http.handshake()
                yield http
    finally:
        await _stop(process, signal.SIGINT, 30)


async def _wait_for_address(process: Process, stderr_path: Path, seconds: float = 30) -> str:
    with anyio.fail_after(seconds):
        while True:
            match = ADDRESS_LINE.search(stderr_path.read_bytes())
            if match:
                return f"http://{match.group(1).decode()}:{match.group(2).decode()}"
            if process.returncode is not None:
                raise RuntimeError(f"conclave serve --http exited: {stderr_path.read_text()[-2000:]}")
            await anyio.sleep(0.05)


# ----------------------------------------------------------------------------- runs


@dataclass
class Batch:
    calls: int = 0
    results: dict[int, dict[str, Any]] = field(default_factory=dict)  # plan index -> result
    lost: list[str] = field(default_factory=list)
    invalid: list[str] = field(default_factory=list)
    invalid_calls: int = 0  # calls whose reply was wrong (invalid lists every problem)
    latencies_ms: list[float] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    wall_s: float = 0.0


async def _one(server: Any, plan: CallPlan, batch: Batch, limit_s: float) -> None:
    started = time.perf_counter()
    try:
        message = await server.call(plan.message(), limit_s)
    except LostReply as exc:
        batch.lost.append(str(exc))
        return
    batch.latencies_ms.append((time.perf_counter() - started) * 1000)
    result, problems = check_reply(plan, message, server.progress.pop(plan.progress_token, []))
    if result is not None:
        batch.results[plan.index] = result
        batch.statuses.update(a["status"] for a in result.get("answers", []) if isinstance(a, dict))
    batch.invalid.extend(f"call {plan.index}: {p}" for p in problems)
    batch.invalid_calls += bool(problems)


async def run_batch(server: Any, plans: Sequence[CallPlan], *, limit_s: float = 180) -> Batch:
    """All of `plans` at once; returns when every call has a reply or has timed out."""
    batch = Batch(calls=len(plans))
    started = time.perf_counter()
    async with anyio.create_task_group() as group:
        for plan in plans:
            group.start_soon(_one, server, plan, batch, limit_s)
    batch.wall_s = time.perf_counter() - started
    return batch


@dataclass
class Integrity:
    calls: int
    transcripts: TranscriptCheck
    events: EventCheck
    stderr_tracebacks: int
    duplicates: int
    unexpected: int


def integrity(workdir: Path, plans: Sequence[CallPlan], batches: Sequence[Batch], server: Any) -> Integrity:
    results: dict[str, dict[str, Any]] = {}
    for batch in batches:
        for result in batch.results.values():
            results[result["session_id"]] = result
    stderr = server.stderr_path.read_text(errors="replace") if server.stderr_path.exists() else ""
    return Integrity(
        calls=len(plans),
        transcripts=check_transcripts(workdir / "transcripts", results),
        events=check_events(workdir / "events.ndjson", results),
        stderr_tracebacks=stderr.count("Traceback (most recent call last)"),
        duplicates=len(server.duplicates),
        unexpected=len([u for u in server.unexpected if not _is_notification(u)]),
    )


def _is_progress(message: Any) -> bool:
    return (
        isinstance(message, dict)
        and message.get("method") == "notifications/progress"
        and isinstance(message.get("params"), dict)
    )


def _is_notification(message: Any) -> bool:
    return isinstance(message, dict) and "method" in message and "id" not in message


def _percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)


@dataclass
class LoadReport:
    transport: Transport
    n: int
    calls: int
    lost: int
    invalid_replies: int
    duplicates: int
    transcripts_lost: int
    transcripts_corrupt: int
    event_lines: int
    invalid_event_lines: int
    sessions_missing_events: int
    rss_warm_mb: float
    rss_after_mb: float
    rss_drift_pct: float
    wall_s: float
    throughput: float
    p50_ms: float | None
    p95_ms: float | None
    faults_planned: int
    statuses: dict[str, int]
    server_exit: int | None
    stderr_tracebacks: int
    samples: dict[str, list[str]]

    def problems(self, *, rss_limit_pct: float = 10.0) -> list[str]:
        out = [f"{k}: {v[:5]}{' …' if len(v) > 5 else ''}" for k, v in self.samples.items() if v]
        if abs(self.rss_drift_pct) > rss_limit_pct:
            out.append(
                f"RSS drift {self.rss_drift_pct:+.1f}% ({self.rss_warm_mb} MB -> {self.rss_after_mb} MB)"
            )
        if self.stderr_tracebacks:
            out.append(f"the server wrote {self.stderr_tracebacks} traceback(s) to stderr")
        if self.server_exit not in (0, None):
            out.append(f"the server exited with status {self.server_exit}")
        return out


async def run_load(
    transport: Transport,
    n: int,
    workdir: Path,
    *,
    seed: int = 7,
    fault_rate: float = 0.05,
    eof_tail: int = 10,
    limits: Mapping[str, Any] | None = None,
) -> LoadReport:
    """Warm up with `n` calls, measure `n` more; over stdio, finish with `eof_tail` calls written just
    before stdin is closed (each must still be answered). Everything written lands in `workdir`."""
    workdir.mkdir(parents=True, exist_ok=True)
    warm_plans = make_plans(n, start=0, seed=seed, fault_rate=fault_rate)
    run_plans = make_plans(n, start=n, seed=seed, fault_rate=fault_rate)
    tail_plans = make_plans(
        eof_tail if transport == "stdio" else 0, start=2 * n, seed=seed, fault_rate=fault_rate
    )
    batches: list[Batch] = []
    async with SimProcess(workdir) as sim:
        config = write_config(sim, workdir, **(limits or {}))
        async with serve(transport, config, workdir, connections=n + 50) as server:
            batches.append(await run_batch(server, warm_plans))
            rss_warm = rss_bytes(server.pid)
            measured = await run_batch(server, run_plans)
            batches.append(measured)
            rss_after = rss_bytes(server.pid)
            if tail_plans:
                batches.append(await _eof_tail(server, tail_plans))
        exit_code = server.process.returncode
    plans = [*warm_plans, *run_plans, *tail_plans]
    check = integrity(workdir, plans, batches, server)
    return LoadReport(
        transport=transport,
        n=n,
        calls=len(plans),
        lost=sum(len(b.lost) for b in batches),
        invalid_replies=sum(b.invalid_calls for b in batches),
        duplicates=check.duplicates + check.unexpected,
        transcripts_lost=len(check.transcripts.lost),
        transcripts_corrupt=len(check.transcripts.corrupt)
        + len(check.transcripts.duplicated)
        + len(check.transcripts.unexpected),
        event_lines=check.events.lines,
        invalid_event_lines=len(check.events.invalid),
        sessions_missing_events=len(check.events.missing),
        rss_warm_mb=round(rss_warm / 2**20, 1),
        rss_after_mb=round(rss_after / 2**20, 1),
        rss_drift_pct=round((rss_after - rss_warm) / rss_warm * 100, 2),
        wall_s=round(measured.wall_s, 2),
        throughput=round(n / measured.wall_s, 1) if measured.wall_s else 0.0,
        p50_ms=_percentile(measured.latencies_ms, 0.5),
        p95_ms=_percentile(measured.latencies_ms, 0.95),
        faults_planned=sum(len(p.faulted) for p in plans),
        statuses=dict(sum((b.statuses for b in batches), Counter())),
        server_exit=exit_code if transport == "stdio" else None,
        stderr_tracebacks=check.stderr_tracebacks,
        samples=_samples(batches, check),
    )


async def _eof_tail(server: StdioServer, plans: Sequence[CallPlan]) -> Batch:
    """Write every request, close stdin at once, then collect: the server must answer them all."""
    batch = Batch(calls=len(plans))
    events = {}
    for plan in plans:
        events[plan.request_id] = server._waiting[plan.request_id] = anyio.Event()
        await server.send(plan.message())
    await server.close_stdin()
    with anyio.move_on_after(180):
        await server.eof.wait()
    for plan in plans:
        server._waiting.pop(plan.request_id, None)
        message = server._replies.pop(plan.request_id, None)
        if message is None:
            batch.lost.append(f"{plan.request_id!r}: no reply before the server closed stdout (stdin EOF)")
            continue
        result, problems = check_reply(plan, message, server.progress.pop(plan.progress_token, []))
        if result is not None:
            batch.results[plan.index] = result
            batch.statuses.update(a["status"] for a in result.get("answers", []) if isinstance(a, dict))
        batch.invalid.extend(f"call {plan.index}: {p}" for p in problems)
        batch.invalid_calls += bool(problems)
    return batch


def _samples(batches: Sequence[Batch], check: Integrity) -> dict[str, list[str]]:
    return {
        "lost replies": [x for b in batches for x in b.lost],
        "invalid replies": [x for b in batches for x in b.invalid],
        "transcripts lost": check.transcripts.lost,
        "transcripts corrupt": check.transcripts.corrupt
        + check.transcripts.duplicated
        + check.transcripts.unexpected,
        "invalid event lines": check.events.invalid,
        "sessions missing events": check.events.missing,
        "duplicate or unexpected replies": (
            [f"{check.duplicates} duplicate(s), {check.unexpected} unexpected"]
            if check.duplicates or check.unexpected
            else []
        ),
        "server tracebacks on stderr": (
            [f"{check.stderr_tracebacks} traceback(s)"] if check.stderr_tracebacks else []
        ),
    }


# ----------------------------------------------------------------------------- soak


@dataclass
class SoakReport:
    transport: Transport
    rate: float
    seconds_planned: float
    duration_s: float
    drain_s: float
    calls: int
    completed: int
    throughput: float
    errors: int
    lost: int
    invalid_replies: int
    transcripts_bad: int
    invalid_event_lines: int
    sessions_missing_events: int
    rss_start_mb: float
    rss_end_mb: float
    rss_max_mb: float
    rss_drift_pct: float
    rss_slope_mb_per_min: float | None
    rss_timeline_mb: list[tuple[float, float]]  # (seconds into the soak, MB), at most ~20 points
    p50_ms: float | None
    p95_ms: float | None
    max_ms: float | None
    statuses: dict[str, int]
    stderr_tracebacks: int
    samples: dict[str, list[str]]

    def problems(
        self, *, rss_limit_pct: float = 10.0, min_throughput_ratio: float = 0.95, max_drain_s: float = 10.0
    ) -> list[str]:
        out = [f"{k}: {v[:5]}{' …' if len(v) > 5 else ''}" for k, v in self.samples.items() if v]
        if abs(self.rss_drift_pct) > rss_limit_pct:
            out.append(
                f"RSS drift {self.rss_drift_pct:+.1f}% ({self.rss_start_mb} MB -> {self.rss_end_mb} MB)"
            )
        if self.throughput < min_throughput_ratio * self.rate:
            out.append(f"throughput {self.throughput}/s under {min_throughput_ratio:.0%} of {self.rate}/s")
        if self.drain_s > max_drain_s:
            out.append(
                f"replies kept arriving {self.drain_s}s after the last request: the server fell behind"
            )
        if self.stderr_tracebacks:
            out.append(f"the server wrote {self.stderr_tracebacks} traceback(s) to stderr")
        return out


async def run_soak(
    transport: Transport,
    workdir: Path,
    *,
    rate: float = 20.0,
    seconds: float = 600.0,
    seed: int = 11,
    fault_rate: float = 0.05,
    sample_every: float = 1.0,
    warmup_calls: int | None = None,
) -> SoakReport:
    """Open-loop traffic: a call starts every 1/rate s for `seconds`, whatever the replies do.

    The warm-up is the same steady traffic (by default a tenth of the run, 5 to 60 s), so the RSS
    baseline is the steady state's, not the peak of a burst. In a 20-minute run on the 2-core machine
    RSS rose about 4 MB in the first 10 minutes and 1 MB in the next 10, levelling off."""
    workdir.mkdir(parents=True, exist_ok=True)
    warm_count = warmup_calls if warmup_calls is not None else int(rate * min(60.0, max(5.0, seconds / 10)))
    total = int(rate * seconds)
    warm_plans = make_plans(warm_count, start=0, seed=seed, fault_rate=fault_rate)
    plans = make_plans(total, start=warm_count, seed=seed, fault_rate=fault_rate)
    rss_samples: list[tuple[float, int]] = []
    batch = Batch(calls=total)
    async with SimProcess(workdir) as sim:
        config = write_config(sim, workdir)
        async with serve(transport, config, workdir, connections=max(64, int(rate * 10))) as server:
            warm = Batch(calls=len(warm_plans))
            await _steady(server, warm_plans, rate, warm)
            rss_start = rss_bytes(server.pid)
            done = anyio.Event()

            async def sample() -> None:
                while not done.is_set():
                    rss_samples.append((time.perf_counter(), rss_bytes(server.pid)))
                    with anyio.move_on_after(sample_every):
                        await done.wait()

            started = time.perf_counter()
            async with anyio.create_task_group() as outer:
                outer.start_soon(sample)
                sent = await _steady(server, plans, rate, batch)
                done.set()
            finished = time.perf_counter()
            rss_end = rss_bytes(server.pid)
    # The sending window is the soak's duration; replies still arriving after it are the drain,
    # which stays near one call's latency unless the server falls behind.
    duration = sent - started + 1 / rate
    drain = finished - sent
    check = integrity(workdir, [*warm_plans, *plans], [warm, batch], server)
    slope = _slope(rss_samples)
    samples = _samples([warm, batch], check)
    transcripts_bad = check.transcripts.bad
    errors = (
        len(batch.lost)
        + len(warm.lost)
        + batch.invalid_calls
        + warm.invalid_calls
        + transcripts_bad
        + len(check.events.invalid)
        + len(check.events.missing)
        + check.duplicates
        + check.unexpected
    )
    return SoakReport(
        transport=transport,
        rate=rate,
        seconds_planned=seconds,
        duration_s=round(duration, 1),
        drain_s=round(drain, 2),
        calls=total,
        completed=len(batch.results),
        throughput=round(len(batch.results) / duration, 2) if duration else 0.0,
        errors=errors,
        lost=len(batch.lost) + len(warm.lost),
        invalid_replies=batch.invalid_calls + warm.invalid_calls,
        transcripts_bad=transcripts_bad,
        invalid_event_lines=len(check.events.invalid),
        sessions_missing_events=len(check.events.missing),
        rss_start_mb=round(rss_start / 2**20, 1),
        rss_end_mb=round(rss_end / 2**20, 1),
        rss_max_mb=round(max((r for _, r in rss_samples), default=rss_end) / 2**20, 1),
        rss_drift_pct=round((rss_end - rss_start) / rss_start * 100, 2),
        rss_slope_mb_per_min=slope,
        rss_timeline_mb=_timeline(rss_samples, started),
        p50_ms=_percentile(batch.latencies_ms, 0.5),
        p95_ms=_percentile(batch.latencies_ms, 0.95),
        max_ms=round(max(batch.latencies_ms), 1) if batch.latencies_ms else None,
        statuses=dict(batch.statuses),
        stderr_tracebacks=check.stderr_tracebacks,
        samples=samples,
    )


async def _steady(server: Any, plans: Sequence[CallPlan], rate: float, batch: Batch) -> float:
    """Start one call every 1/rate s; returns (perf_counter) when the last one was sent, after
    waiting for every reply."""
    t0 = anyio.current_time()
    async with anyio.create_task_group() as group:
        for k, plan in enumerate(plans):
            await anyio.sleep_until(t0 + k / rate)
            group.start_soon(_one, server, plan, batch, 180.0)
        sent = time.perf_counter()  # the task group then waits for every reply
    return sent  # noqa: RET504


def _timeline(
    samples: Sequence[tuple[float, int]], started: float, points: int = 20
) -> list[tuple[float, float]]:
    step = max(1, len(samples) // points)
    picked = list(samples[::step])
    if samples and picked[-1] != samples[-1]:
        picked.append(samples[-1])
    return [(round(t - started, 1), round(r / 2**20, 1)) for t, r in picked]


def _slope(samples: Sequence[tuple[float, int]]) -> float | None:
    """Least-squares RSS growth in MB per minute over the samples."""
    if len(samples) < 3:
        return None
    xs = [t for t, _ in samples]
    ys = [r / 2**20 for _, r in samples]
    try:
        slope = statistics.linear_regression(xs, ys).slope
    except statistics.StatisticsError:
        return None
    return round(slope * 60, 3)


# ----------------------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.hardening.load", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="what", required=True)
    load = sub.add_parser("load", help="warm-up + measured burst of N concurrent confers")
    load.add_argument("--transport", choices=TRANSPORTS, default="stdio")
    load.add_argument("-n", type=int, default=1000)
    soak = sub.add_parser("soak", help="steady traffic for a while")
    soak.add_argument("--transport", choices=TRANSPORTS, default="http")
    soak.add_argument("--rate", type=float, default=20.0)
    soak.add_argument("--seconds", type=float, default=600.0)
    for p in (load, soak):
        p.add_argument("--workdir", type=Path, default=Path(".conclave/load"))
        p.add_argument("--fault-rate", type=float, default=0.05)
    args = parser.parse_args(argv)
    workdir = args.workdir / f"{args.what}-{args.transport}-{int(time.time())}"
    if args.what == "load":
        report: Any = anyio.run(lambda: run_load(args.transport, args.n, workdir, fault_rate=args.fault_rate))
    else:
        report = anyio.run(
            lambda: run_soak(
                args.transport, workdir, rate=args.rate, seconds=args.seconds, fault_rate=args.fault_rate
            )
        )
    print(json.dumps(asdict(report), indent=2, default=str))
    problems = report.problems()
    for problem in problems:
        print(f"PROBLEM: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
