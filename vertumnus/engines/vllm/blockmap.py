"""Engine blocks → cache-manager blocks: turning a vLLM worker's KV events into :class:`CacheReport` s.

The trie's block (``cache.block_tokens`` = M tokens, key = the project's chained key) covers n = M / E engine
blocks (E = the engine's hashed block size). At admission the data plane computes the request's vLLM block
hashes (:mod:`~vertumnus.engines.vllm.hashing`) and registers, per engine block size, which engine hashes make
up each cache block (:class:`KeyIndex`). A :class:`WorkerBlocks` mirrors one engine's holdings from its events.

Invariants of :class:`WorkerBlocks` (what the trie is told):

- *complete(m)*: every engine block of cache block m is held (engine hashes stored and not removed since);
- *visible* = the reported holdings = {m : complete(m), m not suppressed, parent(m) visible or m is a root
  block}. Visibility is prefix-closed, like vLLM's own prefix matching (a hit stops at the first missing block);
- a block becomes visible → STORED (chains in parent→child order, parent key attached); a visible block stops
  being complete → REMOVED (the trie drops its subtree, and so do we); AllBlocksCleared → CLEARED;
- *suppressed*: logically reclaimed blocks (vLLM has no per-prefix eviction). They stay invisible while the
  engine still holds them and are forgotten once a new BlockStored touches them (recomputed → really cached);
- engine hashes stored before their cache block was registered ("orphans", e.g. a prompt's tail beyond its
  last full cache block) are kept, and re-examined when a later request registers that cache block.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from vertumnus.cache.block_keys import group_engine_blocks
from vertumnus.engines.vllm.events import Cleared, Event, Removed, Stored
from vertumnus.types import CacheReport, CacheReportKind


class KeyIndex:
    """Which engine hashes make up each known cache block, for one engine block size, plus each block's token
    ids (replication by recomputation needs them). Bounded LRU over cache blocks (``capacity``); a request
    touches its blocks leaf-first so ancestors are always more recent than their descendants and a shared
    prefix is never evicted before the branches below it."""

    def __init__(self, block_tokens: int, per_block: int, capacity: int) -> None:
        self.block_tokens = block_tokens
        self.per_block = per_block
        self.capacity = capacity
        self.members: OrderedDict[int, tuple[int, ...]] = OrderedDict()  # cache key -> its engine hashes
        self.owner: dict[int, int] = {}  # engine hash -> cache key
        self.parent: dict[int, int | None] = {}
        self.children: dict[int, set[int]] = {}
        self.tokens: dict[int, np.ndarray] = {}
        self.workers: dict[int, WorkerBlocks] = {}  # engines whose hashes this index describes

    def register(
        self, block_keys: Sequence[int], engine_hashes: Sequence[int], token_ids: Sequence[int] | None = None
    ) -> None:
        """Record a request's cache blocks (keys, their engine hashes, their tokens); engines that already held
        some of the newly mapped engine blocks re-examine them."""
        new: list[int] = []
        toks = np.asarray(token_ids, dtype=np.int32) if token_ids is not None else None
        m = self.block_tokens
        groups = group_engine_blocks(engine_hashes, block_keys, self.per_block)
        prev: int | None = None
        for j, (key, hashes) in enumerate(groups):
            if key not in self.members:
                self.members[key] = hashes
                for h in hashes:
                    self.owner[h] = key
                self.parent[key] = prev
                if prev is not None:
                    self.children.setdefault(prev, set()).add(key)
                new.extend(hashes)
            if toks is not None and key not in self.tokens and len(toks) >= (j + 1) * m:
                self.tokens[key] = toks[j * m : (j + 1) * m].copy()
            prev = key
        for key, _ in reversed(groups):
            self.members.move_to_end(key)
        while len(self.members) > self.capacity:
            self._evict(next(iter(self.members)))
        if new:
            for w in self.workers.values():
                w.adopt(new)

    def _evict(self, key: int) -> None:
        """Forget ``key``: engines stop reporting it (REMOVED if visible); its engine hashes become orphans
        again (a later registration can map them anew). Children keep their parent key (so stay hidden)."""
        hashes = self.members.pop(key)
        for w in self.workers.values():
            w.unmap(key, hashes)
        for h in hashes:
            if self.owner.get(h) == key:
                del self.owner[h]
        parent = self.parent.pop(key, None)
        if parent is not None and parent in self.children:
            self.children[parent].discard(key)
        self.children.pop(key, None)
        self.tokens.pop(key, None)

    def path_tokens(self, keys: Sequence[int]) -> np.ndarray | None:
        """Token ids of the prefix ``keys`` (root→z), or None if any block's tokens are not known."""
        parts = [self.tokens.get(k) for k in keys]
        if not parts or any(p is None for p in parts):
            return None
        return np.concatenate(parts)  # type: ignore[arg-type]


class WorkerBlocks:
    """One engine's holdings mirrored from its KV events (see module docstring); emits reports via ``emit``."""

    def __init__(self, worker_id: int, index: KeyIndex, emit: Callable[[CacheReport], None]) -> None:
        self.worker_id = worker_id
        self.index = index
        self.emit = emit
        index.workers[worker_id] = self
        self.have: set[int] = set()  # engine hashes held
        self.orphans: set[int] = set()  # held, but unknown to the index when stored
        self.visible: set[int] = set()
        self.suppressed: set[int] = set()
        self.expect: dict[int, tuple[int, ...]] = {}  # op id -> path whose visibility confirms it

    # -- events -------------------------------------------------------------------------------------------
    def apply(self, events: Iterable[Event]) -> None:
        """Mirror a batch of events (in order), then confirm the ops it completed."""
        for ev in events:
            if isinstance(ev, Stored):
                self._stored(ev.hashes)
            elif isinstance(ev, Removed):
                self._removed(ev.hashes)
            elif isinstance(ev, Cleared):
                self.clear()
        self._confirm()

    def _stored(self, hashes: Sequence[int]) -> None:
        owner = self.index.owner
        touched: list[int] = []
        for h in hashes:
            self.have.add(h)
            key = owner.get(h)
            if key is None:
                self.orphans.add(h)
            elif not touched or touched[-1] != key:
                touched.append(key)
        for key in touched:
            self.suppressed.discard(key)
            self._show(key)

    def _removed(self, hashes: Sequence[int]) -> None:
        owner = self.index.owner
        for h in hashes:
            self.have.discard(h)
            self.orphans.discard(h)
            key = owner.get(h)
            if key is not None and key in self.visible:
                self._hide(key)
                self.emit(CacheReport(self.worker_id, CacheReportKind.REMOVED, (key,)))

    def clear(self) -> None:
        """AllBlocksCleared (or a restarted engine): the worker holds nothing."""
        self.have.clear()
        self.orphans.clear()
        self.visible.clear()
        self.suppressed.clear()
        self.emit(CacheReport(self.worker_id, CacheReportKind.CLEARED))

    def adopt(self, new_hashes: Iterable[int]) -> None:
        """Newly registered engine hashes this engine already held (orphans) now map to cache blocks."""
        if not self.orphans:
            return
        hit = self.orphans.intersection(new_hashes)
        if not hit:
            return
        self.orphans.difference_update(hit)
        owner = self.index.owner
        for key in dict.fromkeys(owner[h] for h in new_hashes if h in hit):  # prompt order: parents first
            self._show(key)
        self._confirm()

    def unmap(self, key: int, hashes: Sequence[int]) -> None:
        """The index forgets ``key`` (LRU): stop reporting it; its held engine blocks become orphans."""
        if key in self.visible:
            self._hide(key)
            self.emit(CacheReport(self.worker_id, CacheReportKind.REMOVED, (key,)))
        self.suppressed.discard(key)
        self.orphans.update(h for h in hashes if h in self.have)

    def detach(self) -> None:
        """Stop mirroring (the engine was stopped); the index no longer updates this worker."""
        self.index.workers.pop(self.worker_id, None)

    # -- visibility -----------------------------------------------------------------------------------------
    def _complete(self, key: int) -> bool:
        members = self.index.members.get(key)
        return members is not None and self.have.issuperset(members)

    def _show(self, key: int) -> None:
        """Make ``key`` and its showable descendants visible; one STORED report per linear chain."""
        parent = self.index.parent.get(key)
        if key in self.visible or (parent is not None and parent not in self.visible):
            return
        stack = [key]
        chain: list[int] = []
        chain_parent: int | None = parent
        while stack:
            k = stack.pop()
            if k in self.visible or k in self.suppressed or not self._complete(k):
                continue
            p = self.index.parent.get(k)
            if chain and p != chain[-1]:
                self.emit(CacheReport(self.worker_id, CacheReportKind.STORED, tuple(chain), chain_parent))
                chain = []
            if not chain:
                chain_parent = p
            self.visible.add(k)
            chain.append(k)
            stack.extend(self.index.children.get(k, ()))
        if chain:
            self.emit(CacheReport(self.worker_id, CacheReportKind.STORED, tuple(chain), chain_parent))

    def _hide(self, key: int) -> None:
        """``key`` and every visible descendant stop being visible (no report: the caller sends one)."""
        stack = [key]
        while stack:
            k = stack.pop()
            if k in self.visible:
                self.visible.discard(k)
                stack.extend(self.index.children.get(k, ()))

    # -- cache ops ------------------------------------------------------------------------------------------
    def reclaim(self, op_id: int, keys: Sequence[int]) -> None:
        """Logical reclamation: ``keys`` leave the holdings now (confirmed at once, REMOVED with ``op_id``);
        the engine keeps them until its LRU evicts them."""
        for k in keys:
            self.suppressed.add(k)
            self._hide(k)
        self.emit(CacheReport(self.worker_id, CacheReportKind.REMOVED, tuple(keys), None, op_id))

    def expect_path(self, op_id: int, keys: Sequence[int]) -> None:
        """Confirm op ``op_id`` (STORED with the op id) once the whole path ``keys`` is visible."""
        self.expect[op_id] = tuple(keys)
        for k in keys:  # an explicit copy request lifts a logical reclamation
            self.suppressed.discard(k)
        for k in keys:
            self._show(k)
        self._confirm()

    def forget(self, op_id: int) -> bool:
        """Stop waiting for ``op_id``; False if it was already confirmed."""
        return self.expect.pop(op_id, None) is not None

    def _confirm(self) -> None:
        if not self.expect:
            return
        for op_id, keys in list(self.expect.items()):
            if not keys or keys[-1] in self.visible:  # prefix-closed: the last block visible ⇒ the whole path
                del self.expect[op_id]
                self.emit(CacheReport(self.worker_id, CacheReportKind.STORED, keys, None, op_id))
