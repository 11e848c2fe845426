"""Event loop: time order, kind tie-break, insertion order, determinism, no time travel."""

from __future__ import annotations

import pytest

from vertumnus.engines.sim.events import EventKind, EventLoop


def test_pops_by_time_then_kind_then_insertion() -> None:
    loop = EventLoop()
    seen: list[tuple[float, str]] = []

    def rec(tag: str) -> None:
        seen.append((loop.now, tag))

    loop.push(2.0, EventKind.ARRIVAL, rec, "arrival@2")
    loop.push(1.0, EventKind.ARRIVAL, rec, "arrival@1")
    loop.push(2.0, EventKind.TIMER, rec, "timer@2")
    loop.push(2.0, EventKind.ENGINE, rec, "engine@2-a")
    loop.push(2.0, EventKind.ENGINE, rec, "engine@2-b")
    loop.run()
    assert seen == [
        (1.0, "arrival@1"),
        (2.0, "engine@2-a"),
        (2.0, "engine@2-b"),
        (2.0, "timer@2"),
        (2.0, "arrival@2"),
    ]
    assert loop.popped == 5


def test_events_pushed_from_callbacks_run_after_already_queued_peers() -> None:
    loop = EventLoop()
    seen: list[str] = []

    def first() -> None:
        seen.append("first")
        loop.push(loop.now, EventKind.ENGINE, seen.append, "child")

    loop.push(0.0, EventKind.ENGINE, first)
    loop.push(0.0, EventKind.ENGINE, seen.append, "second")
    loop.run()
    assert seen == ["first", "second", "child"]


def test_same_pushes_same_order_across_runs() -> None:
    def run() -> list[int]:
        loop = EventLoop()
        out: list[int] = []
        for i in range(50):
            loop.push(float(i % 7), EventKind(i % 3), out.append, i)
        loop.run()
        return out

    assert run() == run()


def test_past_events_rejected_and_until_stops() -> None:
    loop = EventLoop()
    loop.push(5.0, EventKind.TIMER, lambda: None)
    loop.step()
    with pytest.raises(ValueError, match="in the past"):
        loop.push(4.0, EventKind.ENGINE, lambda: None)
    count: list[float] = []
    for t in (6.0, 7.0, 8.0):
        loop.push(t, EventKind.ENGINE, count.append, t)
    loop.run(until=lambda: len(count) == 2)
    assert count == [6.0, 7.0] and loop.peek_time() == 8.0
    loop.run(max_time=7.5)
    assert count == [6.0, 7.0]
