"""F7 item 2, the SSRF corpus (`data/ssrf_corpus.json`), exercised twice:

- through the `fetch` tool directly: each URL is refused with its reason (docs/tools.md#fetch), a
  `fetch_blocked` event is left, and the local server is never hit (redirect cases: hit
  exactly on the hops before the refused one);
- from INSIDE a worker's tool call (a scripted model writing `<tool_call>{"name": "fetch", ...}`):
  the refusal reaches the model as `fetch_blocked` carrying the policy's reason as
  `fetch_reason`, and nothing more reaches the local server. A few cases also go end to end
  through the simulated panel, one per wire kind.

Names resolve through the corpus's fake DNS table, never the real network. `CASES` is the
corpus as data; the last test records the figures "ssrf: refused via fetch" and "ssrf: refused
via worker" (refused with the right reason and nothing served / total) for `scripts/hardening`.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from aiohttp import web

from conclave.app.runtime import Runtime, open_runtime
from conclave.app.sim import NativeCall, Reply, Rule, Scenario, SimPanel
from conclave.core.errors import ToolRefused
from conclave.core.messages import CompletionRequest, Message, ToolUse
from conclave.providers.scripted import ScriptedProvider, ScriptedReply
from conclave.schema.config import Config
from conclave.worker.encodings import ToolMode
from conclave.worker.loop import WorkerLoop, WorkerOutcome, WorkerTurn
from tests.hardening.figures import record
from tests.support import last_tool_result_text, read_events

pytestmark = pytest.mark.anyio

CORPUS_PATH = Path(__file__).parent / "data" / "ssrf_corpus.json"
_CORPUS: dict[str, Any] = json.loads(CORPUS_PATH.read_text(encoding="utf-8"))
FAKE_DNS: dict[str, list[str]] = _CORPUS["dns"]


@dataclass(frozen=True, slots=True)
class Case:
    id: str
    mode: str  # direct | redirect
    url: str  # with "{port}" for the local server's port
    reason: str
    note: str
    hits: int = 0  # requests the local server must see before the refusal

    def at(self, port: int) -> str:
        return self.url.replace("{port}", str(port))


DIRECT = [
    Case(f"direct-{i:03d}", "direct", c["url"], c["reason"], c["note"])
    for i, c in enumerate(_CORPUS["direct"], 1)
]
REDIRECT = [
    Case(f"redirect-{i:03d}", "redirect", c["url"], c["reason"], c["note"], c["hits"])
    for i, c in enumerate(_CORPUS["redirect"], 1)
]
CASES = DIRECT + REDIRECT


# case id -> refused as expected, per door; filled as the cases run
_REFUSED: dict[str, dict[str, bool]] = {"fetch": {}, "worker": {}, "worker (native)": {}}


def corpus_counts() -> dict[str, int]:
    return {"total": len(CASES), "direct": len(DIRECT), "redirect": len(REDIRECT)}


async def fake_resolver(host: str, port: int) -> list[Any]:
    if host not in FAKE_DNS:
        raise OSError(f"[Errno -2] Name or service not known: {host}")
    return [ipaddress.ip_address(a) for a in FAKE_DNS[host]]


class Site:
    """The local server an SSRF would reach; records every request."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        self.port = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.hits.append(request.path)
        if request.path == "/redirect":
            return web.Response(status=302, headers={"location": request.query["to"]})
        if request.path == "/loop":
            return web.Response(status=302, headers={"location": "/loop"})
        return web.json_response({"secret": "internal"})


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    server = Site()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    tcp = web.TCPSite(runner, "127.0.0.1", 0)
    await tcp.start()
    server.port = tcp._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield server
    finally:
        await runner.cleanup()


def _fetch_policy(case: Case, port: int) -> dict[str, Any]:
    return {
        "allow_ports": [80, 443, port],
        # Redirect cases start at the local server, so exactly its /32 is let in.
        "allow_private": ["127.0.0.1/32"] if case.mode == "redirect" else [],
        "read_timeout_seconds": 2,
        "total_timeout_seconds": 5,
    }


@pytest.fixture
def runtime_for(make_config: Callable[..., Config], site: Site) -> Callable[[Case], Any]:
    def open_for(case: Case, providers: dict[str, dict[str, Any]] | None = None) -> Any:
        config = make_config(
            providers or {"p": {"kind": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1"}},
            fetch=_fetch_policy(case, site.port),
        )
        return open_runtime(config, resolver=fake_resolver)

    return open_for


def _check_site(case: Case, site: Site, *, runs: int = 1) -> None:
    if case.mode == "direct":
        assert site.hits == [], f"a refused fetch reached the local server: {site.hits}"
    else:
        assert len(site.hits) == case.hits * runs, site.hits
        assert set(site.hits) <= {"/redirect", "/loop"}, "only the redirecting hops may be served"


def _check_blocked_events(case: Case, events_path: Path, *, runs: int = 1) -> None:
    events = read_events(events_path)
    assert [e["reason"] for e in events if e["event"] == "fetch_blocked"] == [case.reason] * runs
    assert not any(e["event"] == "fetch" for e in events), "no fetch may complete"


def fetch_tag(url: str) -> str:
    call = json.dumps({"name": "fetch", "args": {"url": url}}, ensure_ascii=False)
    return f"Let me look.\n<tool_call>{call}</tool_call>"


def refusal_body(fed_back: str) -> dict[str, Any]:
    inner = fed_back.split("<untrusted_input>", 1)[1].rsplit("</untrusted_input>", 1)[0]
    body: dict[str, Any] = json.loads(inner)
    return body


def native_fetch(url: str) -> ScriptedReply:
    return ScriptedReply("", "tool_calls", (ToolUse("call-1", "fetch", {"url": url}),))


def fed_back_natively(request: CompletionRequest) -> str:
    """The result a native call got: the one ToolReturn of the last message, a refusal."""
    (returned,) = request.messages[-1].tool_returns
    assert returned.is_error and returned.call_id == "call-1"
    return returned.content


async def run_worker(rt: Runtime, provider: Any, session_id: str, mode: ToolMode = "tags") -> WorkerOutcome:
    loop = WorkerLoop(
        registry=rt.tools,
        tool_context=rt.tool_context,
        telemetry=rt.telemetry,
        settings=rt.config.worker_tools,
    )
    turn = WorkerTurn(
        provider=provider,
        messages=(Message("user", "Read the page and summarize it."),),
        deadline=anyio.current_time() + 20,
        session_id=session_id,
        tools=("fetch",),
        canary="CANARY-00112233445566ff",
        tool_mode=mode,
    )
    with anyio.fail_after(25):
        return await loop.run(turn)


def _check_worker(case: Case, out: WorkerOutcome, fed_back: str, events_path: Path, runs: int = 1) -> None:
    assert out.error is None
    assert [c.to_dict() for c in out.inner_tool_calls] == [
        {"hop": 1, "name": "fetch", "status": "refused", "reason": "fetch_blocked"}
    ]
    body = refusal_body(fed_back)
    assert (body["refused"], body["reason"], body["fetch_reason"]) == (True, "fetch_blocked", case.reason)
    inner = [e for e in read_events(events_path) if e["event"] == "worker_inner_call"]
    assert [(e["tool"], e["status"], e["reason"]) for e in inner] == [
        ("fetch", "refused", "fetch_blocked")
    ] * runs
    assert inner[-1]["mode"] == out.tool_mode


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
async def test_refused_through_the_tool_and_from_inside_a_worker(
    case: Case, site: Site, runtime_for: Callable[[Case], Any], events_path: Path
) -> None:
    url = case.at(site.port)
    for door in _REFUSED:
        _REFUSED[door][case.id] = False
    async with runtime_for(case) as rt:
        # 1. The fetch tool, called directly.
        with anyio.fail_after(10), pytest.raises(ToolRefused) as info:
            await rt.call_tool("fetch", {"url": url, "session_id": f"{case.id}-tool"})
        assert (info.value.reason, info.value.tool) == (case.reason, "fetch"), case.note
        rt.telemetry.flush()  # the event log batches its writes
        _check_site(case, site)
        _check_blocked_events(case, events_path)
        _REFUSED["fetch"][case.id] = True
        # 2. The same URL from inside a worker's tool call.
        provider = ScriptedProvider("p", [fetch_tag(url), "Nothing I can use."])
        out = await run_worker(rt, provider, f"{case.id}-worker")
        rt.telemetry.flush()
        assert len(provider.requests) == 2
        _check_worker(case, out, provider.requests[1].messages[-1].content, events_path)
        assert out.text == "Nothing I can use."
        _check_site(case, site, runs=2)
        _check_blocked_events(case, events_path, runs=2)
        _REFUSED["worker"][case.id] = True
        # 3. The same URL as a native tool call: the same refusal, for the same reason.
        native = ScriptedProvider("p", [native_fetch(url), "Nothing I can use."])
        out = await run_worker(rt, native, f"{case.id}-native", mode="native")
        rt.telemetry.flush()
    assert len(native.requests) == 2 and out.tool_mode == "native"
    _check_worker(case, out, fed_back_natively(native.requests[1]), events_path, runs=2)
    assert out.text == "Nothing I can use."
    _check_site(case, site, runs=3)
    _check_blocked_events(case, events_path, runs=3)
    _REFUSED["worker (native)"][case.id] = True


E2E = {"openai": "direct-001", "anthropic": "direct-065", "gemini": "redirect-012"}


@pytest.mark.parametrize("mode", ["tags", "native"])
@pytest.mark.parametrize("kind", sorted(E2E))
async def test_worker_over_the_simulated_panel_is_refused(
    kind: str, mode: ToolMode, site: Site, runtime_for: Callable[..., Any], events_path: Path
) -> None:
    case = next(c for c in CASES if c.id == E2E[kind])
    url = case.at(site.port)
    call = (
        Reply(text=fetch_tag(url))
        if mode == "tags"
        else Reply(tool_calls=(NativeCall("fetch", {"url": url}),))
    )
    scenario = Scenario(replies=(call,), rules=(Rule("<tool_result", Reply(text="The fetch was refused.")),))
    async with SimPanel(scenarios={"w1": scenario}) as panel:
        providers = {"w": {"kind": kind, "model": "w1", "base_url": panel.base_url(kind)}}  # type: ignore[arg-type]
        async with runtime_for(case, providers) as rt:
            out = await run_worker(rt, rt.providers.get("w"), case.id, mode)
        fed_back = [r for r in panel.received if r.model == "w1"][-1].body
    assert out.text == "The fetch was refused." and out.tool_mode == mode
    assert isinstance(fed_back, dict)
    last = json.dumps(fed_back)
    assert "fetch_blocked" in last and case.reason in last
    _check_worker(case, out, last_tool_result_text(kind, mode, fed_back), events_path)
    _check_site(case, site)


def test_the_corpus_is_large_and_well_formed() -> None:
    assert len(CASES) >= 40
    assert len({c.url for c in CASES}) == len(CASES), "duplicate URLs"
    reasons = {c.reason for c in CASES}
    assert reasons <= {
        "scheme_not_allowed",
        "host_not_allowed",
        "unresolvable_host",
        "private_address",
        "metadata_address",
        "port_not_allowed",
        "too_many_redirects",
    }
    assert {"private_address", "metadata_address", "scheme_not_allowed", "port_not_allowed"} <= reasons
    assert all(c.hits >= 1 for c in REDIRECT)


def test_figures_refused_over_total() -> None:
    """Last in the file: records, per door, how many corpus URLs were refused as expected."""
    if set(_REFUSED["fetch"]) != {c.id for c in CASES}:
        pytest.skip("the figures need the whole corpus: run the whole file")
    for door, outcomes in _REFUSED.items():
        record(
            f"ssrf: refused via {door}",
            sum(outcomes.values()),
            total=len(CASES),
            target="== total",
            command=".venv/bin/pytest tests/hardening/test_ssrf_corpus.py",
            details={"failed": sorted(k for k, ok in outcomes.items() if not ok), **corpus_counts()},
        )
    assert all(all(outcomes.values()) for outcomes in _REFUSED.values())
    assert _REFUSED["worker"] == _REFUSED["worker (native)"], "both encodings refuse the same URLs"
