"""One worker's KV-event feed: a ZMQ SUB socket for live batches plus vLLM's replay socket for gaps.

Topology: the subscriber *binds* its SUB socket (``tcp://<events_host>:<free port>``, port chosen by the OS, so
no race) before the engine starts; the engine's ``ZmqEventPublisher`` *connects* its PUB socket there (vLLM binds
only endpoints with a wildcard host). The publisher binds the replay ROUTER socket itself; the engine actor
picks that port on its own node and reports it once the engine is up (:meth:`KvEventSubscriber.set_replay`).

Delivery invariant: batches reach ``deliver`` exactly once and in sequence order (seq 0, 1, 2, ...). A live batch
ahead of the next expected number is held back and a replay from the expected number is requested (DEALER →
ROUTER: ``[b"", seq as 8 bytes]``; answer: ``[b"", topic, seq, payload]`` frames, then ``seq = -1``). Batches the
publisher no longer buffers are counted as ``lost`` and skipped. Because a PUB socket drops everything sent
before the subscription reaches it, the subscriber also asks for a replay right after the replay socket is
known and every ``resync_s`` while idle, so even a lost *last* batch is recovered.

Threading: sockets are created and used only on the subscriber's own thread (the SUB socket is bound on the
constructing thread and handed over at thread start, which ZMQ allows across a memory barrier). ``deliver``
runs on that thread; the data plane forwards to its event loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable

import zmq

from vertumnus.engines.vllm.events import DecodeStats, Event, decode_batch

log = logging.getLogger("vertumnus.vllm")

END_SEQ = -1
_REPLAY_TIMEOUT_S = 5.0
_MAX_HELD = 10_000  # live batches held behind a gap before giving the gap up
_LOG_SKIPPED = 20  # malformed / unknown events logged at WARNING per subscriber; the rest at DEBUG


class KvEventSubscriber:
    """See module docstring. ``counters`` keys: batches, events, stored, removed, cleared, malformed,
    unknown, other_medium, duplicates, gaps, replay_requests, replayed, lost, replay_timeouts."""

    def __init__(self, name: str, host: str, deliver: Callable[[list[Event]], None], resync_s: float = 2.0) -> None:
        self.name = name
        self.deliver = deliver
        self.resync_s = resync_s
        self.counters: Counter[str] = Counter()
        self.next_seq = 0
        self._ctx = zmq.Context()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.bind(f"tcp://{host}:0")
        self.endpoint: str = self._sub.getsockopt_string(zmq.LAST_ENDPOINT)
        self._replay_endpoint: str | None = None
        self._held: dict[int, list[Event]] = {}
        self._inflight_since: float | None = None
        self._last_request = 0.0
        self._requested_from = 0  # next_seq when the in-flight replay was requested
        self._logged = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"kv-events-{name}", daemon=True)

    # -- control (any thread) -------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def set_replay(self, endpoint: str | None) -> None:
        """The engine's replay ROUTER endpoint (None: no replay; gaps are then counted as lost)."""
        self._replay_endpoint = endpoint

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop the thread and close the sockets (idempotent)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        elif not self._sub.closed:
            self._sub.close(0)
            self._ctx.term()

    # -- the thread -----------------------------------------------------------------------------------------
    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sub, zmq.POLLIN)
        dealer: zmq.Socket | None = None
        try:
            while not self._stop.is_set():
                if dealer is None and self._replay_endpoint is not None:
                    dealer = self._ctx.socket(zmq.DEALER)
                    dealer.setsockopt(zmq.LINGER, 0)
                    dealer.connect(self._replay_endpoint)
                    poller.register(dealer, zmq.POLLIN)
                    self._request(dealer)  # catch up on whatever was published before our subscription
                ready = dict(poller.poll(100))
                if self._sub in ready:
                    while True:
                        try:
                            frames = self._sub.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._live(frames, dealer)
                if dealer is not None and dealer in ready:
                    while True:
                        try:
                            frames = dealer.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._replayed(frames, dealer)
                self._tick(dealer)
        except Exception:  # a bug here must not take the server down; the feed stops and says so
            log.exception("KV event subscriber %s stopped", self.name)
        finally:
            if dealer is not None:
                dealer.close(0)
            self._sub.close(0)
            self._ctx.term()

    def _tick(self, dealer: zmq.Socket | None) -> None:
        if dealer is None:
            return
        now = time.monotonic()
        if self._inflight_since is not None:
            if now - self._inflight_since > _REPLAY_TIMEOUT_S:
                self.counters["replay_timeouts"] += 1
                self._inflight_since = None
        elif now - self._last_request >= self.resync_s:
            self._request(dealer)

    def _request(self, dealer: zmq.Socket) -> None:
        dealer.send_multipart([b"", self.next_seq.to_bytes(8, "big", signed=True)])
        self._requested_from = self.next_seq
        self.counters["replay_requests"] += 1
        self._inflight_since = self._last_request = time.monotonic()

    def _live(self, frames: list[bytes], dealer: zmq.Socket | None) -> None:
        if len(frames) != 3 or len(frames[1]) != 8:
            self._skip(f"live message with {len(frames)} frames")
            return
        seq = int.from_bytes(frames[1], "big", signed=True)
        if seq < self.next_seq:
            self.counters["duplicates"] += 1
            return
        events = self._decode(frames[2])
        if seq == self.next_seq:
            self._emit(events)
            self._flush()
            return
        self.counters["gaps"] += 1
        self._held[seq] = events
        if dealer is None or len(self._held) > _MAX_HELD:
            self._give_up_gap()
        elif self._inflight_since is None:
            self._request(dealer)

    def _replayed(self, frames: list[bytes], dealer: zmq.Socket | None = None) -> None:
        if len(frames) != 4 or len(frames[2]) != 8:
            self._skip(f"replay message with {len(frames)} frames")
            return
        seq = int.from_bytes(frames[2], "big", signed=True)
        if seq == END_SEQ:
            self._inflight_since = None
            if self._held:
                if self.next_seq > self._requested_from and dealer is not None:
                    # This replay made progress; batches held now may have been published after the buffer was
                    # read (a live batch raced the replay), so ask again from where we are. Each re-request needs
                    # progress, so this cannot loop.
                    self._request(dealer)
                else:
                    self._give_up_gap()  # the publisher no longer buffers what we miss
            return
        if seq < self.next_seq:
            return  # already delivered (live or by an earlier replay)
        self.counters["replayed"] += 1
        events = self._decode(frames[3])
        if seq == self.next_seq:
            self._emit(events)
            self._flush()
        else:
            self._held.setdefault(seq, events)

    def _give_up_gap(self) -> None:
        first = min(self._held)
        self.counters["lost"] += first - self.next_seq
        log.warning("KV events %s: batches %d..%d lost (not in the replay buffer)", self.name, self.next_seq, first - 1)
        self.next_seq = first
        self._flush()

    def _flush(self) -> None:
        while self.next_seq in self._held:
            self._emit(self._held.pop(self.next_seq))

    def _emit(self, events: list[Event]) -> None:
        self.next_seq += 1
        self.counters["batches"] += 1
        self.counters["events"] += len(events)
        for ev in events:
            self.counters[type(ev).__name__.lower()] += 1
        if events:
            try:
                self.deliver(events)
            except Exception:  # the consumer's bug: log it, keep the feed alive
                log.exception("KV events %s: delivery failed", self.name)

    def _decode(self, payload: bytes) -> list[Event]:
        stats = DecodeStats()
        events = decode_batch(payload, stats)
        self.counters["malformed"] += stats.malformed
        self.counters["unknown"] += stats.unknown
        self.counters["other_medium"] += stats.other_medium
        for what in stats.skipped:
            self._log_skip(what)
        return events

    def _skip(self, what: str) -> None:
        self.counters["malformed"] += 1
        self._log_skip(what)

    def _log_skip(self, what: str) -> None:
        self._logged += 1
        level = logging.WARNING if self._logged <= _LOG_SKIPPED else logging.DEBUG
        log.log(level, "KV events %s: skipped %s", self.name, what)
