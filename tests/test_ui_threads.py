"""A thread on the page (docs/ui.md, "Threads"): a follow-up's page shows the turns before it as one
conversation, a followed-up session links its follow-ups, and the list marks follow-ups. Fetched
over real HTTP from sessions run against the simulated panel, and from hand-made transcripts
for the threads no real call makes (a loop, more turns than a page reads back)."""

from __future__ import annotations

import html as htmllib
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from conclave.app.ui import build_app
from conclave.app.ui.markup import escape
from conclave.deliberation.threads import MAX_DEPTH
from tests.ui_support import IMG, SCRIPT, THREAD_QUESTIONS, thread_sessions, workdir_config

pytestmark = pytest.mark.anyio

Client = TestClient[web.Request, web.Application]
THREAD = ("t-1", "t-2", "t-3")
BROKEN = ("b-1", "b-2", "b-3")  # b-1's transcript is deleted once the thread has run


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """Two threads of three turns, run for real into one folder; the second loses its first
    transcript. Returns the folder and the first thread's results."""
    folder = tmp_path_factory.mktemp("ui-threads")
    base = workdir_config(folder)
    results = anyio.run(thread_sessions, base, THREAD)
    anyio.run(thread_sessions, base, BROKEN)
    (gone,) = (folder / "transcripts").glob("*/b-1-*.json")
    gone.unlink()
    return folder, results


@pytest.fixture
async def client(workdir: tuple[Path, list[dict[str, Any]]]) -> AsyncIterator[Client]:
    async with TestClient(TestServer(build_app(workdir_config(workdir[0])))) as test_client:
        yield test_client


async def page(client: Client, path: str) -> str:
    response = await client.get(path)
    assert response.status == 200, path
    return await response.text()


def shown(markup: str) -> str:
    """The text a reader sees: tags out, entities decoded, whitespace as single spaces."""
    return " ".join(htmllib.unescape(re.sub(r"<[^>]+>", " ", markup)).split())


def in_order(text: str, *parts: str) -> None:
    at = 0
    for part in parts:
        found = text.find(" ".join(part.split()), at)
        assert found >= 0, f"{part!r} missing, or not after what comes before it"
        at = found + len(part)


def said(result: dict[str, Any]) -> list[str]:
    return [answer["text"] for answer in result["answers"]]


def link(session_id: str) -> str:
    return f'href="/session?id={session_id}"'


# -- a thread run for real --------------------------------------------------------------------


async def test_a_follow_ups_page_shows_the_turns_before_it_in_order_then_its_own(
    client: Client, workdir: tuple[Path, list[dict[str, Any]]]
) -> None:
    first, second, third = workdir[1]
    assert (third["thread_id"], third["parent"]) == ("t-1", "t-2")
    html = await page(client, "/session?id=t-3")
    synthesis = second["synthesis"]["envelope"]["answer"]
    in_order(
        shown(html),
        "Thread t-1",
        "Turn 1 · t-1",
        THREAD_QUESTIONS[0],
        *said(first),
        "Turn 2 · t-2",
        THREAD_QUESTIONS[1],
        *said(second),
        "Synthesis",
        synthesis,
        "Turn 3 of thread t-1: the latest turn.",
        THREAD_QUESTIONS[2],
        *said(third),
    )
    assert html.count(link("t-1")) >= 3 and html.count(link("t-2")) >= 4, (
        "each turn and answer links its page"
    )
    assert "Followed up by" not in html


async def test_a_followed_up_session_links_its_follow_ups(client: Client) -> None:
    first = await page(client, "/session?id=t-1")
    assert 'class="thread"' not in first, "a thread's first turn has nothing before it"
    mark = re.search(r'<p class="thread-mark">.*?</p>', first, re.S)
    assert mark and shown(mark[0]) == "Turn 1 of thread t-1. Followed up by t-2 ." and link("t-2") in mark[0]
    middle = shown(await page(client, "/session?id=t-2"))
    in_order(middle, "Turn 1 · t-1", THREAD_QUESTIONS[0], "Turn 2 of thread t-1. Followed up by t-3")


async def test_the_list_marks_each_follow_up_with_the_session_it_continued(client: Client) -> None:
    html = await page(client, "/")
    rows = {sid: row_of(html, sid) for sid in THREAD}
    assert "follow-up" not in rows["t-1"] and 'data-thread="t-1"' in rows["t-1"]
    for sid, parent in (("t-2", "t-1"), ("t-3", "t-2")):
        assert f"↳ follow-up of {parent}" in shown(rows[sid]) and link(parent) in rows[sid]
        assert 'data-thread="t-1"' in rows[sid]


def row_of(page: str, session_id: str) -> str:
    found = re.search(rf'<tr data-session="{re.escape(session_id)}"[^>]*>.*?</tr>', page, re.S)
    assert found, f"no row for {session_id}"
    return found[0]


async def test_a_thread_whose_first_transcript_is_gone_shows_the_rest_and_says_so(client: Client) -> None:
    text = shown(await page(client, "/session?id=b-3"))
    in_order(
        text,
        "Earlier turns are no longer available: a transcript of the thread is gone",
        "b-2",
        THREAD_QUESTIONS[1],
        "Synthesis",
        "A later turn of thread b-1: the latest turn.",
        THREAD_QUESTIONS[2],
    )
    assert THREAD_QUESTIONS[0] not in text and "Turn 1" not in text, (
        "no number for a turn whose start is gone"
    )


async def test_markup_in_an_earlier_answer_is_text(client: Client) -> None:
    html = await page(client, "/session?id=t-3")
    assert SCRIPT not in html and IMG not in html
    assert escape(SCRIPT) in html and escape(IMG) in html
    assert f"The page says: {SCRIPT} {IMG}" in shown(html)


# -- hand-made threads ------------------------------------------------------------------------


def transcript(folder: Path, sid: str, parent: str | None, n: int, answer: str = "Fine.") -> None:
    """A confer transcript as the runtime writes one, at its own minute of one day."""
    body = {
        "tool": "confer",
        "session_id": sid,
        "thread_id": "h-0",
        "parent": parent,
        "arguments": {"question": f"Question {sid}?"},
        "result": {
            "session_id": sid,
            "answers": [{"provider": "sim-openai", "model": "sim-gpt", "status": "ok", "text": answer}],
        },
    }
    day = folder / "transcripts" / "2026-01-02"
    day.mkdir(parents=True, exist_ok=True)
    (day / f"{sid}-confer-{n // 60:02d}{n % 60:02d}00000000-{n:04d}.json").write_bytes(orjson.dumps(body))


@pytest.fixture
async def handmade(tmp_path: Path) -> AsyncIterator[Client]:
    async with TestClient(TestServer(build_app(workdir_config(tmp_path)))) as test_client:
        yield test_client


async def test_a_long_thread_is_read_back_a_hundred_turns_at_most(handmade: Client, tmp_path: Path) -> None:
    for n in range(MAX_DEPTH + 20):
        transcript(tmp_path, f"h-{n}", f"h-{n - 1}" if n else None, n)
    html = await page(handmade, f"/session?id=h-{MAX_DEPTH + 19}")
    assert html.count('class="thread-turn"') == MAX_DEPTH - 1
    text = shown(html)
    in_order(
        text, "Earlier turns are not shown", "Question h-20?", "Question h-118?", "A later turn of thread"
    )
    assert "Question h-19?" not in text


async def test_a_thread_that_loops_stops_where_it_comes_back(handmade: Client, tmp_path: Path) -> None:
    transcript(tmp_path, "h-1", "h-2", 1)
    transcript(tmp_path, "h-2", "h-1", 2)
    text = shown(await page(handmade, "/session?id=h-2"))
    looped = "Earlier turns are no longer available: the thread's links loop back on themselves"
    in_order(text, looped, "Question h-1?", "A later turn", "Question h-2?")
    assert text.count("Question h-1?") == 1


async def test_an_earlier_answer_shows_its_first_lines_and_links_the_whole(
    handmade: Client, tmp_path: Path
) -> None:
    transcript(tmp_path, "h-1", None, 1, answer="\n".join(f"line {n}" for n in range(1, 11)))
    transcript(tmp_path, "h-2", "h-1", 2)
    html = await page(handmade, "/session?id=h-2")
    excerpt = re.search(r'<article class="card excerpt[^"]*">.*?</article>', html, re.S)
    assert excerpt and "line 4…" in excerpt[0] and "line 5" not in excerpt[0]
    assert f'<a {link("h-1")} class="more">the whole answer →</a>' in excerpt[0]
