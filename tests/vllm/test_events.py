"""KV-event decoding and the per-worker feed: vLLM's own encoder and publisher on one side, Vertumnus' decoder
and subscriber on the other; gaps recovered through the replay socket, malformed input counted, never raised.

Event-driven: every wait is for a condition (a delivered event, a counter, a socket becoming readable) with a
bounded timeout and a message naming what did not happen — no fixed sleeps, no blocking receive that a lost
frame would turn into a hang. The hand-driven publisher is an XPUB socket, so the test *sees* the subscriber's
subscription arrive before it publishes instead of sleeping for it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec
import zmq

from vertumnus.engines.vllm.events import Cleared, DecodeStats, Event, Removed, Stored, decode_batch
from vertumnus.engines.vllm.subscriber import KvEventSubscriber
from vertumnus.ports import free_port

ENC = msgspec.msgpack.Encoder()
WAIT_S = 30.0  # bound of every wait (the loopback events take milliseconds; this only turns a bug into a failure)


def kv() -> Any:
    """vLLM's KV-event classes (imported per test: the conftest's gate decides whether vLLM must be here)."""
    from vllm.distributed import kv_events

    return kv_events


def stored(hashes: list[int], parent: int | None = None, medium: str | None = "GPU") -> Any:
    return kv().BlockStored(
        block_hashes=hashes, parent_block_hash=parent, token_ids=[1] * 32 * len(hashes), block_size=32,
        lora_id=None, medium=medium, lora_name=None,
    )  # fmt: skip


def batch(*events: object) -> bytes:
    return ENC.encode(kv().KVEventBatch(ts=1.0, events=list(events)))


def wait_for(cond: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    """Poll ``cond`` until true; AssertionError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f} s waiting for {what}"
        time.sleep(0.01)


def recv(sock: zmq.Socket, what: str, timeout_s: float = WAIT_S) -> list[bytes]:
    """One multipart message, or AssertionError naming ``what`` if none arrives within ``timeout_s``."""
    assert sock.poll(int(timeout_s * 1000), zmq.POLLIN), f"no {what} within {timeout_s:.0f} s"
    return sock.recv_multipart(zmq.NOBLOCK)


def test_decode_vllm_payload() -> None:
    BlockRemoved, AllBlocksCleared = kv().BlockRemoved, kv().AllBlocksCleared
    stats = DecodeStats()
    got = decode_batch(
        batch(stored([5, 6], 4), BlockRemoved(block_hashes=[6], medium="GPU"), AllBlocksCleared()), stats
    )
    assert got == [Stored((5, 6), 4, 32), Removed((6,)), Cleared()]
    assert stats == DecodeStats()


def test_decode_is_defensive() -> None:
    stats = DecodeStats()
    assert decode_batch(b"\xc1 not msgpack", stats) == []
    legacy = msgspec.msgpack.encode([1.0, [["BlockStored", [7], None, [1, 2], 32], ["BlockRemoved", [7]]]])
    assert decode_batch(legacy, stats) == [Stored((7,), None, 32), Removed((7,))]
    odd = msgspec.msgpack.encode(
        [1.0, [{"type": "BlockMoved"}, {"type": "BlockStored", "block_hashes": "x"}, 3, {"type": "BlockRemoved",
         "block_hashes": [bytes(24) + (9).to_bytes(8, "big")]}]]
    )  # fmt: skip
    assert decode_batch(odd, stats) == [Removed((9,))]
    assert decode_batch(batch(stored([8], medium="CPU")), stats) == []
    assert (stats.malformed, stats.unknown, stats.other_medium) == (3, 1, 1)


class Collect:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.lock = threading.Lock()

    def __call__(self, events: list[Event]) -> None:
        with self.lock:
            self.events.extend(events)


def test_subscriber_catches_up_on_batches_published_before_it_listened() -> None:
    KVEventBatch, BlockRemoved = kv().KVEventBatch, kv().BlockRemoved
    got = Collect()
    sub = KvEventSubscriber("t", "127.0.0.1", got, resync_s=0.2)
    sub.start()
    replay = f"tcp://127.0.0.1:{free_port('127.0.0.1')}"
    pub = kv().ZmqEventPublisher(0, endpoint=sub.endpoint, replay_endpoint=replay, topic="t")
    try:
        for i in range(3):  # probably before the PUB connection is up: dropped live, recovered by replay
            pub.publish(KVEventBatch(ts=1.0, events=[stored([i])]))
        sub.set_replay(replay)
        wait_for(lambda: len(got.events) == 3, "the 3 batches published before the subscription (via replay)")
        pub.publish(KVEventBatch(ts=1.0, events=[BlockRemoved(block_hashes=[1], medium="GPU")]))
        wait_for(lambda: len(got.events) == 4, "the live batch 3")
        asked = sub.counters["replay_requests"]
        # More idle resync rounds, each answered in full: a round re-delivers nothing already delivered.
        wait_for(lambda: sub.counters["replay_requests"] >= asked + 3, "3 more resync rounds")
        assert got.events == [Stored((0,), None, 32), Stored((1,), None, 32), Stored((2,), None, 32), Removed((1,))]
        assert sub.next_seq == 4 and sub.counters["lost"] == 0
    finally:
        sub.stop()
        pub.shutdown()


def test_subscriber_recovers_a_gap_and_counts_what_the_publisher_no_longer_has() -> None:
    """A hand-driven PUB / ROUTER pair: seq 1 is skipped live; the replay answers it (first gap) or not
    (second gap: counted lost, delivery resumes)."""
    got = Collect()
    sub = KvEventSubscriber("g", "127.0.0.1", got, resync_s=60.0)
    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)  # a PUB socket that also reports subscriptions
    pub.connect(sub.endpoint)
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    frames = {s: batch(stored([100 + s])) for s in range(6)}
    sub.set_replay(f"tcp://127.0.0.1:{port}")
    sub.start()
    try:
        ident, _, start = recv(router, "catch-up replay request right after connecting")
        router.send_multipart([ident, b"", b"", (-1).to_bytes(8, "big", signed=True), b""])
        assert int.from_bytes(start, "big") == 0
        # The subscriber's subscription reaching the publisher: from here on nothing published is dropped.
        assert recv(pub, "subscription from the subscriber's SUB socket") == [b"\x01"]
        for seq in (0, 2):
            pub.send_multipart([b"g", seq.to_bytes(8, "big"), frames[seq]])
        ident, _, start = recv(router, "replay request for the gap at seq 1")
        assert int.from_bytes(start, "big") == 1
        for seq in (1, 2, 3):
            router.send_multipart([ident, b"", b"g", seq.to_bytes(8, "big"), frames[seq]])
        router.send_multipart([ident, b"", b"", (-1).to_bytes(8, "big", signed=True), b""])
        # 0, 1, 2, 3 in order (2 once, although sent live and replayed)
        wait_for(lambda: len(got.events) == 4, "batches 0-3 in order")
        pub.send_multipart([b"g", (5).to_bytes(8, "big"), frames[5]])
        ident, _, start = recv(router, "replay request for the gap at seq 4")
        assert int.from_bytes(start, "big") == 4
        router.send_multipart([ident, b"", b"g", (5).to_bytes(8, "big"), frames[5]])  # the buffer lost seq 4
        router.send_multipart([ident, b"", b"", (-1).to_bytes(8, "big", signed=True), b""])
        pub.send_multipart([b"g", b"short", b"x"])  # malformed: counted, ignored
        wait_for(lambda: len(got.events) == 5 and sub.counters["malformed"] == 1, "batch 5 and the malformed frame")
        assert [e.hashes for e in got.events] == [(100,), (101,), (102,), (103,), (105,)]  # type: ignore[union-attr]
        c = sub.counters
        assert (c["gaps"], c["replay_requests"], c["replayed"], c["lost"]) == (
            2,
            3,
            3,
            1,
        )  # replayed: 1, 3 and 5 (2 had arrived live)
    finally:
        sub.stop()
        pub.close(0)
        router.close(0)
        ctx.term()
