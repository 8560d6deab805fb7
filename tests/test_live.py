"""The in-process hub of running sessions' deltas (`conclave.deliberation.live`): in order, bounded
per subscriber with the dropped counted in a `Gap`, ended with the session, unsubscribed on
leaving, and a dict lookup when nobody listens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from conclave.app.runtime import open_runtime
from conclave.core.messages import Delta
from conclave.deliberation.live import Gap, Heard, LiveDeltas, LiveItem

pytestmark = pytest.mark.anyio


def text(i: int) -> Delta:
    return Delta("text", f"t{i} ")


def shown(items: list[LiveItem]) -> list[str | int]:
    """Each delta's text, each gap as the number it dropped."""
    return [item.dropped if isinstance(item, Gap) else item.delta.text for item in items]


async def test_subscribers_hear_every_delta_in_order_and_only_their_session_s() -> None:
    hub = LiveDeltas()
    with hub.running("s1"):
        async with hub.subscribe("s1") as items:
            for i in range(5):
                hub.publish("s1", "alpha", None, text(i))
            hub.publish("s1", "beta", "critic", Delta("tool_call", '{"a"', index=1, name="verify"))
            hub.publish("s2", "alpha", None, text(99))  # another session's: not heard here
            heard = [await anext(items) for _ in range(6)]
            waiting = anyio.Event()

            async def read_one() -> None:
                heard.append(await anext(items))
                waiting.set()

            async with anyio.create_task_group() as group:
                group.start_soon(read_one)
                await anyio.sleep(0.01)
                hub.publish("s1", "alpha", None, text(5))  # handed to a reader already waiting
                with anyio.fail_after(5):
                    await waiting.wait()
    assert shown(heard) == ["t0 ", "t1 ", "t2 ", "t3 ", "t4 ", '{"a"', "t5 "]
    assert heard[0] == Heard("alpha", None, text(0))
    assert heard[5] == Heard("beta", "critic", Delta("tool_call", '{"a"', index=1, name="verify"))


async def test_the_end_of_the_session_ends_every_subscriber_s_stream() -> None:
    hub = LiveDeltas()
    heard: list[list[LiveItem]] = [[], []]

    async def listen(into: list[LiveItem], ready: anyio.Event) -> None:
        async with hub.subscribe("s1") as items:
            ready.set()
            async for item in items:
                into.append(item)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            with hub.running("s1"):
                for into in heard:
                    ready = anyio.Event()
                    group.start_soon(listen, into, ready)
                    await ready.wait()
                assert hub.subscribers("s1") == 2
                hub.publish("s1", "alpha", None, text(0))
                await anyio.sleep(0.01)
            # leaving `running` closed both streams: the listeners' loops end, the group returns
    assert [shown(h) for h in heard] == [["t0 "], ["t0 "]]
    assert hub.subscribers("s1") == 0


async def test_drops_are_announced_before_the_next_item_and_last_when_nothing_follows() -> None:
    hub = LiveDeltas(buffer=3)
    got: list[LiveItem] = []
    with hub.running("s1"):
        async with hub.subscribe("s1") as items:
            for i in range(10):  # nobody reads: 3 fit, 7 are dropped
                hub.publish("s1", "alpha", None, text(i))
            for _ in range(3):
                got.append(await anext(items))
            hub.publish("s1", "alpha", None, text(10))  # the gap first, then this one
            hub.publish("s1", "alpha", None, text(11))  # fits
            for i in range(12, 15):  # the buffer is full: dropped
                hub.publish("s1", "alpha", None, text(i))
            for _ in range(3):
                got.append(await anext(items))
            late = anyio.Event()

            async def read_rest() -> None:
                async for item in items:
                    got.append(item)
                late.set()

            async with anyio.create_task_group() as group:
                group.start_soon(read_rest)
                await anyio.sleep(0.01)
                hub_end(hub, "s1")
                with anyio.fail_after(5):
                    await late.wait()
    assert shown(got) == ["t0 ", "t1 ", "t2 ", 7, "t10 ", "t11 ", 3]


def hub_end(hub: LiveDeltas, session_id: str) -> None:
    """End the session as `running`'s exit does, while still inside its block (for the test)."""
    for subscriber in hub._subscribers.pop(session_id, ()):
        subscriber.close()


async def test_a_subscriber_s_buffer_never_grows_past_its_bound_however_much_is_published() -> None:
    hub = LiveDeltas(buffer=8)
    with hub.running("s1"):
        async with hub.subscribe("s1"):
            started = anyio.current_time()
            for i in range(100_000):
                hub.publish("s1", "alpha", None, text(i))
            assert anyio.current_time() - started < 5, "publishing never waits"
            (subscriber,) = hub._subscribers["s1"]
            assert subscriber.send.statistics().current_buffer_used <= 8
            assert subscriber.dropped == 100_000 - 8


async def test_a_fast_subscriber_hears_everything_beside_a_slow_one() -> None:
    hub = LiveDeltas(buffer=2)
    fast: list[LiveItem] = []
    with hub.running("s1"):
        async with hub.subscribe("s1") as slow_items, hub.subscribe("s1") as fast_items:
            for i in range(6):
                hub.publish("s1", "alpha", None, text(i))
                fast.append(await anext(fast_items))
            slow = [await anext(slow_items) for _ in range(2)]
    assert shown(fast) == [f"t{i} " for i in range(6)]
    assert shown(slow) == ["t0 ", "t1 "]


async def test_leaving_unsubscribes_and_the_session_is_forgotten() -> None:
    hub = LiveDeltas()
    with hub.running("s1"):
        async with hub.subscribe("s1"):
            assert hub.subscribers("s1") == 1
        assert hub.subscribers("s1") == 0
        assert "s1" not in hub._subscribers, "no subscriber: not even an empty list to look through"
        hub.publish("s1", "alpha", None, text(0))  # nobody hears it, nothing fails
    assert not hub.is_running("s1")


async def test_subscribing_to_a_session_not_running_here_ends_at_once() -> None:
    hub = LiveDeltas()
    with anyio.fail_after(5):
        async with hub.subscribe("elsewhere") as items:
            assert [item async for item in items] == []
    assert hub.subscribers("elsewhere") == 0


def test_publishing_with_no_subscriber_is_one_dict_lookup() -> None:
    hub = LiveDeltas()
    looked: list[str] = []

    class Counting(dict[str, Any]):
        def get(self, key: str, default: Any = None) -> Any:
            looked.append(key)
            return super().get(key, default)

        def __getitem__(self, key: str) -> Any:
            raise AssertionError("only get() on the no-subscriber path")

        def __contains__(self, key: object) -> bool:
            raise AssertionError("only get() on the no-subscriber path")

    hub._subscribers = Counting()
    with hub.running("s1"):
        hub.publish("s1", "alpha", None, text(0))
    hub.publish("s2", "alpha", None, text(1))
    assert looked == ["s1", "s2"]


def test_a_session_running_twice_at_once_ends_only_with_the_last() -> None:
    hub = LiveDeltas()
    with hub.running("s1"):
        with hub.running("s1"):
            assert hub.is_running("s1")
        assert hub.is_running("s1")
    assert not hub.is_running("s1")


# -- every session publishes to its runtime's hub ---------------------------------------------


@pytest.mark.parametrize("with_sink", [False, True], ids=["no sink", "beside the caller's sink"])
async def test_a_session_publishes_its_deltas_to_its_runtime_s_hub(tmp_path: Path, with_sink: bool) -> None:
    from conclave.app.sim import SimPanel
    from conclave.deliberation.confer import confer
    from conclave.schema.config import load_config
    from tests.live_support import script_long_replies
    from tests.server_support import panel_config

    async with SimPanel(stream_tokens_per_s=200) as panel:
        replies = script_long_replies(panel, latency_ms=300, words=20)
        config = load_config(str(panel_config(panel, tmp_path)), env={}, dotenv=None)
        hub = LiveDeltas()
        sunk: list[tuple[str, str | None, Delta]] = []
        sink = (lambda provider, role, delta: sunk.append((provider, role, delta))) if with_sink else None
        heard: list[LiveItem] = []
        async with open_runtime(config, live=hub) as runtime:
            assert runtime.live is hub

            async def listen() -> None:
                while not hub.is_running("s-live"):
                    await anyio.sleep(0.005)
                async with hub.subscribe("s-live") as items:
                    async for item in items:
                        heard.append(item)

            with anyio.fail_after(30):
                async with anyio.create_task_group() as group:
                    group.start_soon(listen)
                    result = await confer(
                        runtime, {"question": "Which?", "session_id": "s-live"}, deltas=sink
                    )
    assert {a.provider: a.text for a in result.answers} == replies
    said: dict[str, str] = {}
    for item in heard:
        assert isinstance(item, Heard)
        said[item.provider] = said.get(item.provider, "") + item.delta.text
    assert said == replies
    if with_sink:
        assert [Heard(*item) for item in sunk] == heard, "the caller's sink hears the same, in order"
    assert not hub.is_running("s-live") and hub.subscribers("s-live") == 0
