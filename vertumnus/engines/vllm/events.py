"""Decoding vLLM KV-cache event batches, defensively.

Wire format (``vllm/distributed/kv_events.py``, vLLM 0.32): each ZMQ message is ``[topic, seq (8 bytes, big
endian), payload]``; ``payload`` is msgpack of ``KVEventBatch`` — an array ``[ts, events, data_parallel_rank]``
whose events are tagged maps (msgspec ``tag=True``)::

    {"type": "BlockStored", "block_hashes": [...], "parent_block_hash": int | None, "token_ids": [...],
     "block_size": int, "medium": "GPU" | "CPU" | ..., "group_idx": int, ...}
    {"type": "BlockRemoved", "block_hashes": [...], "medium": ..., "group_idx": ...}
    {"type": "AllBlocksCleared"}

Older vLLM versions encoded events as arrays ``["BlockStored", hashes, parent, token_ids, block_size, ...]``;
both forms are accepted. Hashes may be ints (default) or digest bytes (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``;
converted to the same low 64 bits). The payload is decoded untyped and checked event by event, so one malformed
event is counted and skipped without losing the rest of the batch; nothing here raises on bad input.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from vertumnus.engines.vllm.hashing import external_hash

DEVICE_MEDIA = (None, "GPU")  # the engine's own paged KV ("GPU" on every platform); "CPU" / "STORAGE": offload tiers


@dataclass(slots=True, frozen=True)
class Stored:
    hashes: tuple[int, ...]
    parent: int | None
    block_size: int | None


@dataclass(slots=True, frozen=True)
class Removed:
    hashes: tuple[int, ...]


@dataclass(slots=True, frozen=True)
class Cleared:
    pass


Event = Stored | Removed | Cleared


@dataclass(slots=True)
class DecodeStats:
    """What a decode pass skipped, by reason (the subscriber adds these to its counters)."""

    malformed: int = 0  # undecodable payload or event
    unknown: int = 0  # well-formed event of a type this version does not know
    other_medium: int = 0  # events of an offload tier (CPU / disk) or another KV-cache group
    skipped: list[str] = field(default_factory=list)  # short descriptions for the log (first few)


def _hashes(raw: Any) -> tuple[int, ...] | None:
    if not isinstance(raw, list):
        return None
    out: list[int] = []
    for h in raw:
        if isinstance(h, bool) or not isinstance(h, int | bytes):
            return None
        out.append(external_hash(h))
    return tuple(out)


def _from_array(ev: list[Any]) -> dict[str, Any] | None:
    """Array-encoded (pre-0.10) events → the tagged-map form."""
    if not ev or not isinstance(ev[0], str):
        return None
    kind = ev[0]
    if kind == "BlockStored" and len(ev) >= 5:
        return {"type": kind, "block_hashes": ev[1], "parent_block_hash": ev[2], "block_size": ev[4]}
    if kind == "BlockRemoved" and len(ev) >= 2:
        return {"type": kind, "block_hashes": ev[1]}
    return {"type": kind}


def decode_event(ev: Any, stats: DecodeStats) -> Event | None:
    """One event → :data:`Event`, or None (counted in ``stats``)."""
    if isinstance(ev, list):
        ev = _from_array(ev)
    if not isinstance(ev, dict) or not isinstance(ev.get("type"), str):
        stats.malformed += 1
        stats.skipped.append(f"malformed event {str(ev)[:80]}")
        return None
    kind = ev["type"]
    if kind == "AllBlocksCleared":
        return Cleared()
    if kind not in ("BlockStored", "BlockRemoved"):
        stats.unknown += 1
        stats.skipped.append(f"unknown event type {kind!r}")
        return None
    if ev.get("medium") not in DEVICE_MEDIA or ev.get("group_idx") not in (None, 0):
        stats.other_medium += 1
        return None
    hashes = _hashes(ev.get("block_hashes"))
    if hashes is None:
        stats.malformed += 1
        stats.skipped.append(f"{kind} without a list of block hashes")
        return None
    if kind == "BlockRemoved":
        return Removed(hashes)
    parent_raw = ev.get("parent_block_hash")
    bs = ev.get("block_size")
    if (parent_raw is not None and not isinstance(parent_raw, int | bytes)) or not (bs is None or isinstance(bs, int)):
        stats.malformed += 1
        stats.skipped.append("BlockStored with a bad parent hash or block size")
        return None
    parent = None if parent_raw is None else external_hash(parent_raw)
    return Stored(hashes, parent, bs)


def decode_batch(payload: bytes, stats: DecodeStats) -> list[Event]:
    """A ``KVEventBatch`` payload → its decodable events in order (bad ones counted in ``stats``)."""
    try:
        batch = msgspec.msgpack.decode(payload)
    except (msgspec.DecodeError, ValueError, TypeError):
        stats.malformed += 1
        stats.skipped.append(f"undecodable payload of {len(payload)} bytes")
        return []
    if isinstance(batch, dict):  # a map-encoded batch
        events = batch.get("events")
    elif isinstance(batch, list) and len(batch) >= 2:
        events = batch[1]
    else:
        events = None
    if not isinstance(events, list):
        stats.malformed += 1
        stats.skipped.append("batch without an event list")
        return []
    out: list[Event] = []
    for ev in events:
        got = decode_event(ev, stats)
        if got is not None:
            out.append(got)
    return out
