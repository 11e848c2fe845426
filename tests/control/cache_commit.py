"""Test helpers: one placement through the cache manager's public request path (``commit`` / ``release``)."""

from __future__ import annotations

from collections.abc import Sequence

from vertumnus.cache.manager import CacheManager
from vertumnus.cache.placement import CacheCommit
from vertumnus.types import FetchPlan, Placement, PrefixMatch, Request


def commit(
    m: CacheManager,
    keys: Sequence[int],
    wid: int,
    pref: int | None = None,
    input_len: int | None = None,
    match: PrefixMatch | None = None,
    first: bool = True,
    cached_tokens: int = 0,
    fetch: FetchPlan | None = None,
) -> CacheCommit:
    """Commit a placement of ``keys`` at worker ``wid`` (preferred degree ``pref``: the worker's by default)."""
    keys = tuple(keys)
    w = m.workers.by_id.get(wid)
    deg = w.degree if w is not None else 0
    n = input_len if input_len is not None else len(keys) * m.cfg.block_tokens
    placement = Placement(
        f"t{wid}", wid, deg, cached_tokens, n - cached_tokens, 0.0, 0.0, 0.0, deg if pref is None else pref, 0,
        fetch,
    )  # fmt: skip
    return m.commit(Request(placement.request_id, 0.0, n, keys), match or m.lookup(keys), placement, first)


def record(
    m: CacheManager, keys: Sequence[int], match: PrefixMatch | None, input_len: int, wid: int, pref: int
) -> None:
    """The statistics of one placement: a commit whose pin is released at once (no pending blocks: no copy)."""
    c = commit(m, keys, wid, pref, input_len, match)
    assert c.op is None
    if c.pin is not None:
        m.release(c.pin)
