"""Instructions per K=5 confer, counted by callgrind: a figure this noisy machine cannot move.

Run: .venv/bin/python -m bench.instructions [--via api,server,panel,raw,verify-tags,verify-native]
     [--variants default,off]   (needs valgrind; each via and variant takes about a minute and a half)

The timing figures of the suite swing by ±15 % between runs here, so a change worth 2 % of
Conclave's CPU cannot be seen in them. Executed instructions can: the same build counts the
same within about 0.3 %. Each figure comes from two runs under `valgrind --tool=callgrind`,
each in a fresh interpreter with the hash seed fixed, one with no measured confers and one
with `--confers`: the difference divided by the confers, so start-up and imports cancel out.

What runs (`--batch` confers at a time, after two warm-up waves):
- `api`: `confer` through the Python API from a host's asyncio loop, on a provider transport
  that answers at once from memory with an OpenAI-shaped body: Conclave's own work per confer
  (validation, fan-out, adapters, worker turns, the result, events and transcripts, asyncio's
  share of scheduling it), without the HTTP work every client does alike;
- `server`: the same as `tools/call` lines through the stdio server's line loop, under
  `anyio.run` as `conclave serve` runs, minus the pipe;
- `panel`: `confer` through the Python API over real HTTP to the simulated panel (zero
  latency, in its own process, not counted): Conclave plus aiohttp;
- `raw`: the suite's raw-aiohttp fan-out making the same calls to the panel (the limit);
- `verify-tags`, `verify-native`: as `api`, with `worker_tools=["verify"]` and
  `worker_tool_mode` tags or native. The in-memory transport answers like a model: while the
  request holds no tool result it asks for one `verify` call (a `<tool_call>` tag in the
  text, or an OpenAI `tool_calls` entry), then it gives the final answer. Every member thus
  makes one verify hop (two model calls); an answer with any other shape fails the run.
  Given both, the run prints their ratio (`verify hop: native / tags`).

The kernel's work (sockets, the event log, transcript files) is not counted: callgrind sees
user space only. `default` writes events and transcripts; `off` writes neither; their
difference is what telemetry and transcripts cost.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import orjson
from multidict import CIMultiDict, CIMultiDictProxy

from bench.common import PLAIN_MODELS, QUESTION, VARIANTS, bench_env, scenarios, write_config
from bench.panel import panel_process, put_scenarios

K = 5
ANSWER = (
    b'{"id":"chatcmpl-bench","object":"chat.completion","model":"bench-m0","choices":[{"index":0,'
    b'"message":{"role":"assistant","content":"[simulated bench-m0] Having weighed the question, '
    b'I would choose option 2; the trade-offs favour it. (ref 97bcc8)"},"finish_reason":"stop"}],'
    b'"usage":{"prompt_tokens":21,"completion_tokens":28,"total_tokens":49}}'
)


def _headers(body: bytes) -> CIMultiDictProxy[str]:
    """As aiohttp's parser hands them over: a read-only mapping that ignores the name's case."""
    return CIMultiDictProxy(
        CIMultiDict(
            (
                ("Content-Type", "application/json"),
                ("x-request-id", "req-bench"),
                ("Content-Length", str(len(body))),
            )
        )
    )


def _completion(message: dict[str, Any], finish_reason: str) -> bytes:
    choice = {"index": 0, "message": message, "finish_reason": finish_reason}
    usage = {"prompt_tokens": 21, "completion_tokens": 28, "total_tokens": 49}
    body = {"id": "chatcmpl-bench", "object": "chat.completion", "model": "bench-m0"}
    return orjson.dumps({**body, "choices": [choice], "usage": usage})


ANSWER_HEADERS = _headers(ANSWER)
SIX_SEVENS = {"checks": [{"type": "math", "expression": "6*7", "expected": 42}]}
_TAG = json.dumps({"name": "verify", "args": SIX_SEVENS})
_FUNCTION = {"name": "verify", "arguments": json.dumps(SIX_SEVENS)}  # arguments: a JSON string
_NATIVE_CALL = {"id": "call_bench", "type": "function", "function": _FUNCTION}
# A model's first turn, asking for one verify call in each encoding, as the exchange returns it.
VERIFY_CALLS = {
    "tags": _completion({"role": "assistant", "content": f"Checking. <tool_call>{_TAG}</tool_call>"}, "stop"),
    "native": _completion({"role": "assistant", "content": None, "tool_calls": [_NATIVE_CALL]}, "tool_calls"),
}
VERIFY_REPLIES = {mode: (200, _headers(body), body) for mode, body in VERIFY_CALLS.items()}
# The wrapped verify result, in a user message (tags) or a tool message (native): the hop is done.
HOP_DONE = b'<tool_result name=\\"verify\\"'
_COLLECTED = re.compile(r"Collected : (\d+)")
ARGUMENTS = {"question": QUESTION, "providers": list(PLAIN_MODELS[:K])}
WARM_UP_WAVES = 2  # caches, pools and the day's transcript folder, before anything is counted
VIA_MEANS = {
    "api": "Python API, transport in memory",
    "server": "stdio server's line loop, transport in memory",
    "panel": "Python API over HTTP to the panel (+ aiohttp)",
    "raw": "raw aiohttp fan-out over HTTP to the panel",
    "verify-tags": "Python API, one verify hop per member, tags",
    "verify-native": "Python API, one verify hop per member, native",
}
# panel and raw: real HTTP to the simulated panel; verify-*: the api via with one tool hop
VIAS = ("api", "server", "panel", "raw", "verify-tags", "verify-native")
HOP_VIAS = {"verify-tags": "tags", "verify-native": "native"}
OVER_HTTP = ("panel", "raw")


def in_memory_transport(hop: str | None = None) -> Any:
    """A provider transport answering at once from memory. With `hop` (tags | native) it answers
    like a model making one verify call in that encoding: the call while the conversation holds
    no tool result, then the final answer."""
    plain = (200, ANSWER_HEADERS, ANSWER)
    first = plain if hop is None else VERIFY_REPLIES[hop]  # the call, until its result is sent

    class InMemory:  # no request or response objects: the cost counted is Conclave's own
        async def exchange(
            self, _method: str, _url: str, _headers: Any, body: bytes, **_kwargs: Any
        ) -> tuple[int, Any, bytes]:
            await asyncio.sleep(0)  # a real exchange suspends the caller at least once
            return plain if hop is None or HOP_DONE in body else first

        def stream(self, *_args: Any, **_kwargs: Any) -> Any:
            raise NotImplementedError("the benchmark's members fetch nothing")

        async def aclose(self) -> None:
            pass

    return InMemory()


def bench_config(variant: str, work: Path, url: str = "http://127.0.0.1:9/v1") -> Any:
    from conclave.schema.config import load_config

    path = write_config(work, url, VARIANTS[variant], max_concurrency=1024)
    return load_config(str(path), env=bench_env(), dotenv=None)


async def _confers(config: Any, transport: Any, count: int, batch: int, hop: str | None = None) -> None:
    """`confer` called through the Python API from a host's own asyncio loop, as the suite's
    conclave-api contender; `transport` None means the production one. With `hop`, each
    member has the verify tool in that mode and must use it once."""
    from conclave import Conclave

    async with Conclave(config, transport=transport) as client:
        for _ in range(WARM_UP_WAVES + count // batch):
            await confer_wave(client, batch, hop)


async def confer_wave(client: Any, batch: int, hop: str | None = None) -> None:
    """`batch` K=5 confers at once; any degraded answer, or with `hop` any answer that did not
    make exactly one verify call in that mode, fails the measurement."""
    arguments = (
        ARGUMENTS if hop is None else {**ARGUMENTS, "worker_tools": ["verify"], "worker_tool_mode": hop}
    )

    async def one() -> None:
        result = await client.confer(**arguments)
        if result.degraded:
            raise RuntimeError(f"degraded: {result.degraded_reasons}")
        if hop is not None:
            for answer in result.answers:
                _check_hop(answer, hop)

    await asyncio.gather(*(one() for _ in range(batch)))


def _check_hop(answer: Any, mode: str) -> None:
    """One verify call that ran, then the final answer: two model calls, in `mode`."""
    calls = [(call.name, call.status) for call in answer.inner_tool_calls]
    if answer.hops != 2 or calls != [("verify", "ok")] or answer.tool_mode != mode:
        raise RuntimeError(f"not one {mode} verify hop: hops={answer.hops} calls={calls} {answer}")


async def _via_server(variant: str, count: int, batch: int, work: Path) -> None:
    """`tools/call` lines through the stdio server's line loop (`serve_lines`), as `conclave
    serve` handles them, minus the pipe: requests and replies pass through memory streams."""
    from conclave.app.runtime import open_runtime
    from conclave.app.server.core import Server
    from conclave.app.server.stdio import serve_lines

    requests_in, requests_out = anyio.create_memory_object_stream[bytes](batch)
    replies_in, replies_out = anyio.create_memory_object_stream[bytes](batch)

    async def read_line(_limit: int) -> bytes:
        try:
            return await requests_out.receive()
        except anyio.EndOfStream:
            return b""

    async def one_wave(first_id: int) -> None:
        for request_id in range(first_id, first_id + batch):
            call = {"name": "confer", "arguments": ARGUMENTS}
            line = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": call}
            await requests_in.send(orjson.dumps(line) + b"\n")
        for _ in range(batch):
            reply = orjson.loads(await replies_out.receive())
            if (
                "error" in reply
                or reply["result"].get("isError")
                or reply["result"]["structuredContent"]["degraded"]
            ):
                raise RuntimeError(f"not a complete answer: {reply}")

    config = bench_config(variant, work)
    async with open_runtime(config, transport=in_memory_transport()) as runtime:
        server = Server(runtime)
        async with anyio.create_task_group() as group:
            group.start_soon(serve_lines, server, read_line, replies_in.send)
            for wave in range(WARM_UP_WAVES + count // batch):
                await one_wave(1 + wave * batch)
            await requests_in.aclose()


async def _via_raw(count: int, batch: int, url: str) -> None:
    """The suite's raw-aiohttp contender (the limit) making the same K=5 calls to the panel."""
    from bench.common import Point
    from bench.contenders import RawAiohttp

    raw = RawAiohttp(Point("instructions", "confer", K, batch, 1, 0, 0.0), url)
    await raw.start()
    try:
        for _ in range(WARM_UP_WAVES + count // batch):
            await asyncio.gather(*(raw.op() for _ in range(batch)))
    finally:
        await raw.close()


def count_instructions(via: str, variant: str, confers: int, batch: int, url: str) -> int:
    """Instructions callgrind counts for one child process running `confers` measured confers."""
    with tempfile.TemporaryDirectory(prefix="conclave-instructions-") as work:
        command = [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            "-m",
            "bench.instructions",
            "--child",
            variant,
            "--via",
            via,
            "--confers",
            str(confers),
            "--batch",
            str(batch),
            "--work",
            work,
            "--url",
            url,
        ]
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    found = _COLLECTED.search(done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"callgrind run failed ({done.returncode}): {done.stderr[-2000:]}")
    return int(found.group(1))


def per_confer(via: str, variant: str, confers: int, batch: int, url: str = "") -> float:
    with ThreadPoolExecutor(max_workers=2) as pool:  # the two runs are independent: one per core
        empty = pool.submit(count_instructions, via, variant, 0, batch, url)
        full = pool.submit(count_instructions, via, variant, confers, batch, url)
        return (full.result() - empty.result()) / confers


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.instructions",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--confers", type=int, default=200, help="measured confers per variant (K=5 each)")
    parser.add_argument("--batch", type=int, default=50, help="confers in flight at once")
    parser.add_argument(
        "--variants", default="default,off", help=f"comma-separated subset of {','.join(VARIANTS)}"
    )
    parser.add_argument(
        "--via",
        default="api",
        help=f"comma-separated subset of {','.join(VIAS)}; verify-tags and verify-native: as api, every"
        " member making one verify hop in that encoding; given both, their ratio is printed",
    )
    parser.add_argument("--child", metavar="VARIANT", help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--url", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.confers % args.batch:
        parser.error("--confers must be a multiple of --batch")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        if args.via == "server":  # as `conclave serve` runs: anyio.run
            anyio.run(_via_server, args.child, args.confers, args.batch, args.work)
        elif args.via == "panel":  # real HTTP to the panel: the production transport
            config = bench_config(args.child, args.work, args.url)
            asyncio.run(_confers(config, None, args.confers, args.batch))
        elif args.via == "raw":
            asyncio.run(_via_raw(args.confers, args.batch, args.url))
        elif args.via in HOP_VIAS:
            config, hop = bench_config(args.child, args.work), HOP_VIAS[args.via]
            asyncio.run(_confers(config, in_memory_transport(hop), args.confers, args.batch, hop))
        else:  # as a host application would: its own asyncio loop
            config = bench_config(args.child, args.work)
            asyncio.run(_confers(config, in_memory_transport(), args.confers, args.batch))
        return 0
    if shutil.which("valgrind") is None:
        print("bench.instructions needs valgrind (apt install valgrind)", file=sys.stderr)
        return 2
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    vias = [v.strip() for v in args.via.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS] + [v for v in vias if v not in VIAS]
    if unknown:
        print(f"unknown: {unknown}; variants are {list(VARIANTS)}, vias {list(VIAS)}", file=sys.stderr)
        return 2
    print(f"confer K={K}; {args.confers} confers, {args.batch} at a time")
    with contextlib.ExitStack() as stack:
        url = ""
        if any(via in OVER_HTTP for via in vias):
            urls = stack.enter_context(panel_process(0.0))  # its own process: not counted
            put_scenarios(urls, scenarios())
            url = urls["openai"]
        figures: dict[tuple[str, str], float] = {}
        width = max(len(via) for via in vias)
        for via in vias:
            for variant in ["default"] if via == "raw" else variants:
                figures[via, variant] = per_confer(via, variant, args.confers, args.batch, url)
                calls = K * (2 if via in HOP_VIAS else 1)  # a verify hop: two model calls per member
                print(
                    f"  {via:{width}s} {variant:17s} {figures[via, variant]:>12,.0f} instructions per confer"
                    f"  ({figures[via, variant] / calls:,.0f} per model call)  {VIA_MEANS[via]}"
                )
            if (via, "default") in figures and (via, "off") in figures:
                on, off = figures[via, "default"], figures[via, "off"]
                print(
                    f"  {via:{width}s} telemetry + transcripts: {(on - off) / on * 100.0:.1f} %"
                    " of the default's instructions"
                )
        for variant in variants:
            if ("verify-native", variant) in figures and ("verify-tags", variant) in figures:
                ratio = figures["verify-native", variant] / figures["verify-tags", variant]
                print(f"  verify hop: native / tags = {ratio:.3f} ({variant}; the issue's bound: 1.10)")
        if ("panel", "default") in figures and ("raw", "default") in figures:
            ratio = figures["raw", "default"] / figures["panel", "default"]
            print(
                f"  raw aiohttp / Conclave over HTTP: {ratio:.2f}"
                " (the throughput ratio a loop bound by these instructions would reach)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
