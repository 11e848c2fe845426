"""Benchmark helpers for the cache manager (called by ``vertumnus bench control-plane``; no printing here).

Synthetic trie: ``families`` shared heads of ``head`` blocks; each prompt is a head plus a unique tail of
``tail`` blocks, stored (STORED report from the root) by workers in round-robin, so heads have many holders
and tails one. Keys are random 63-bit ints, as chained hashes are.
"""

from __future__ import annotations

import time
import tracemalloc
from dataclasses import dataclass

import numpy as np

from vertumnus.cache.manager import CacheManager
from vertumnus.cache.stats import bytes_per_node
from vertumnus.config import DEFAULT_PROFILE, REPO_ROOT, CacheConfig
from vertumnus.cost_model import CostModel
from vertumnus.types import CacheReport, CacheReportKind, Placement, PrefixMatch, Request


@dataclass(slots=True)
class SyntheticTrie:
    """A populated manager plus the key material of its prompts (row j: prompt j's head + tail keys)."""

    manager: CacheManager
    heads: np.ndarray  # (families, head) int64
    tails: np.ndarray  # (prompts, tail) int64

    def prompt(self, j: int) -> tuple[int, ...]:
        """Block keys of prompt ``j``."""
        fam = j % self.heads.shape[0]
        return tuple(self.heads[fam].tolist()) + tuple(self.tails[j].tolist())


def _cost() -> CostModel:
    return CostModel.from_file(REPO_ROOT / DEFAULT_PROFILE)


def _keys(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    return rng.integers(1 << 40, (1 << 63) - 1, size=shape, dtype=np.int64)


def shape(n_nodes: int, head: int = 32, tail: int = 32) -> tuple[int, int]:
    """(families, prompts) of a synthetic trie of about ``n_nodes`` nodes: one family per 1,000 nodes (at
    most 1,000), every family used. The trie then has ``families·head + prompts·tail`` nodes."""
    families = min(1000, max(1, n_nodes // 1000))
    return families, max(families, (n_nodes - families * head) // tail)


def build_trie(n_nodes: int, n_workers: int = 64, head: int = 32, tail: int = 32, seed: int = 0) -> SyntheticTrie:
    """A manager whose trie has about ``n_nodes`` nodes (see :func:`shape`), over ``n_workers`` workers (half
    CP4, half CP8, capacity large enough to never bind)."""
    rng = np.random.default_rng(seed)
    families, n_prompts = shape(n_nodes, head, tail)
    heads = _keys(rng, (families, head))
    tails = _keys(rng, (n_prompts, tail))
    cfg = CacheConfig()
    m = CacheManager(cfg, _cost(), [4, 8])
    for w in range(n_workers):
        m.add_worker(w, 4 if w % 2 == 0 else 8, w // 2, 1 << 30)
    st = SyntheticTrie(m, heads, tails)
    _populate(m, st, n_prompts, n_workers)
    return st


def _populate(m: CacheManager, st: SyntheticTrie, n_prompts: int, n_workers: int) -> None:
    apply = m.apply_report
    for j in range(n_prompts):
        apply(CacheReport(j % n_workers, CacheReportKind.STORED, st.prompt(j)))


def bytes_per_trie_node(n_nodes: int = 1_000_000, n_workers: int = 64) -> dict[str, float]:
    """Memory of the cache manager per trie node, measured with tracemalloc (everything the manager retains:
    node arrays, key dict and key objects, worker table)."""
    rng = np.random.default_rng(1)
    head, tail = 32, 32
    families, n_prompts = shape(n_nodes, head, tail)
    heads = _keys(rng, (families, head))
    tails = _keys(rng, (n_prompts, tail))
    cost = _cost()
    tracemalloc.start()
    try:
        m = CacheManager(CacheConfig(), cost, [4, 8])
        for w in range(n_workers):
            m.add_worker(w, 4 if w % 2 == 0 else 8, w // 2, 1 << 30)
        _populate(m, SyntheticTrie(m, heads, tails), n_prompts, n_workers)
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    nodes = m.trie.n_nodes
    return {
        "trie_nodes": float(nodes),
        "bytes_per_trie_node": current / nodes,
        "peak_bytes_per_trie_node": peak / nodes,
        "estimate_bytes_per_node": bytes_per_node(m.trie),
    }


def scan_ms(st: SyntheticTrie, active: int, repeats: int = 5, seed: int = 2) -> dict[str, float]:
    """Time of one periodic scan with about ``active`` nodes holding live statistics (median of ``repeats``
    scans, each from the same statistics). Placements go to a holder of the prompt's head."""
    m = st.manager
    rng = np.random.default_rng(seed)
    n_prompts = st.tails.shape[0]
    n_workers = len(m.workers.by_id)
    queue = dict.fromkeys(sorted(m.workers.by_id), 0.0)
    # The built trie flags its replicated family heads (several copies, no statistics: possible reclamations);
    # the first scan finds that every holder keeps a tail below them and lets them go. Settle that first, so
    # the timed scans see the rows with statistics.
    c0 = time.thread_time()
    for op in m.scan(0.0, queue):
        m.op_failed(op.op_id, "benchmark reset")
    settle_cpu = time.thread_time() - c0
    while len(m.trie.active) < active:
        j = int(rng.integers(n_prompts))
        keys = st.prompt(j)
        match = m.lookup(keys)
        wid = j % n_workers  # stored this prompt: reuses head + tail
        pref = 8 if rng.random() < 0.5 else 4
        _record(m, keys, match, len(keys) * m.cfg.block_tokens, wid, pref)
    act = m.trie.active.rows().copy()
    acc, mis = m.trie.access[:, act], m.trie.missed[:, act]  # copies
    times, cpu, n_ops = [], [], 0
    for _ in range(repeats):
        m.trie.access[:, act], m.trie.missed[:, act] = acc, mis
        m.trie.active.add(act[~m.trie.active.flag[act]])
        c0, t0 = time.thread_time(), time.perf_counter()
        ops = m.scan(0.0, queue)
        times.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
        n_ops = len(ops)
        for op in ops:
            m.op_failed(op.op_id, "benchmark reset")
    return {
        "scan_ms": float(np.median(times) * 1e3),
        "scan_cpu_ms": float(np.median(cpu) * 1e3),  # thread CPU time: robust to a shared, loaded machine
        "active_nodes": float(act.size),
        "trie_nodes": float(m.trie.n_nodes),
        "scan_ops": float(n_ops),
        "settle_scan_cpu_ms": float(settle_cpu * 1e3),  # the first scan after building (see above)
    }


def _record(m: CacheManager, keys: tuple[int, ...], match: PrefixMatch, n: int, wid: int, pref: int) -> None:
    """The statistics of one placement at ``wid`` (a commit whose pin is released at once)."""
    deg = m.workers.by_id[wid].degree
    placement = Placement(f"b{wid}", wid, deg, 0, n, 0.0, 0.0, 0.0, pref, 0)
    commit = m.commit(Request(placement.request_id, 0.0, n, keys), match, placement)
    if commit.pin is not None:
        m.release(commit.pin)


def match_us(n_workers: int = 64, blocks: int = 256, repeats: int = 2000, seed: int = 3) -> dict[str, float]:
    """Latency of ``lookup`` and of ``lookup`` + ``commit`` (statistics, pin) for a ``blocks``-block prompt whose
    prefix is held to different depths by each of ``n_workers`` workers (p50 / p99, microseconds)."""
    rng = np.random.default_rng(seed)
    m = CacheManager(CacheConfig(), _cost(), [4, 8])
    keys = tuple(_keys(rng, (1, blocks))[0].tolist())
    for w in range(n_workers):
        m.add_worker(w, 4 if w % 2 == 0 else 8, w // 2, 1 << 20)
        m.apply_report(CacheReport(w, CacheReportKind.STORED, keys[: int(rng.integers(1, blocks + 1))]))
    probe = keys[: blocks // 2] + tuple(_keys(rng, (1, blocks - blocks // 2))[0].tolist())
    t_match, t_place, c_match = [], [], []
    clock, cpu = time.perf_counter, time.thread_time
    for i in range(repeats):
        q = keys if i % 2 == 0 else probe
        c0, t0 = cpu(), clock()
        mt = m.lookup(q)
        t1, c1 = clock(), cpu()
        _record(m, q, mt, blocks * m.cfg.block_tokens, i % n_workers, 8)
        t2 = clock()
        t_match.append(t1 - t0)
        t_place.append(t2 - t0)
        c_match.append(c1 - c0)
    a, b, c = np.array(t_match) * 1e6, np.array(t_place) * 1e6, np.array(c_match) * 1e6
    return {
        "match_us_p50": float(np.percentile(a, 50)),
        "match_us_p99": float(np.percentile(a, 99)),
        "match_cpu_us_p50": float(np.percentile(c, 50)),  # thread CPU time (includes the two clock reads)
        "match_record_us_p50": float(np.percentile(b, 50)),
        "match_record_us_p99": float(np.percentile(b, 99)),
    }


def figures(
    n_nodes: int = 1_000_000,
    n_workers: int = 64,
    active: tuple[int, ...] = (20_000, 100_000),
    memory: bool = True,
    match_repeats: int = 2000,
) -> dict[str, float]:
    """All cache-manager figures in one flat dict: ``scan_ms`` (first entry of ``active``), ``scan_ms_active_N``
    for each entry, ``bytes_per_trie_node`` (tracemalloc; skipped with ``memory=False``), ``match_us_*``."""
    out: dict[str, float] = {}
    st = build_trie(n_nodes, n_workers)
    for i, a in enumerate(sorted(active)):
        r = scan_ms(st, a)
        out[f"scan_ms_active_{int(r['active_nodes'])}"] = r["scan_ms"]
        out[f"scan_cpu_ms_active_{int(r['active_nodes'])}"] = r["scan_cpu_ms"]
        if i == 0:
            out["scan_ms"] = r["scan_ms"]
            out["scan_active_nodes"] = r["active_nodes"]
    out["trie_nodes"] = float(st.manager.trie.n_nodes)
    del st
    if memory:
        out.update({k: v for k, v in bytes_per_trie_node(n_nodes, n_workers).items() if k != "trie_nodes"})
    out.update(match_us(n_workers, repeats=match_repeats))
    return out
