"""Chained block keys: the identity of a cache block is its whole prefix.

key_0 = H(ROOT, block_0), key_k = H(key_{k-1}, block_k). Equal keys therefore mean equal prefixes, and a
request's keys are computed once at admission (DESIGN.md §3). Keys are 63-bit non-negative ints so they fit
numpy int64 arrays and msgpack.

Two sources of blocks:
- token ids (real engines): block k = tokens [k·B, (k+1)·B); only full blocks get keys;
- trace hash ids (Mooncake traces: one id per 512-token block, equal ids = same prefix block).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

KEY_MASK = (1 << 63) - 1
ROOT_KEY = 0x5645525455  # "VERTU": parent of block 0


def keys_from_tokens(token_ids: Sequence[int] | np.ndarray, block_tokens: int) -> tuple[int, ...]:
    """Chained keys of the full ``block_tokens``-token blocks of a prompt."""
    toks = np.asarray(token_ids, dtype=np.int64)
    n = len(toks) // block_tokens
    if n == 0:
        return ()
    blocks = toks[: n * block_tokens].reshape(n, block_tokens)
    out: list[int] = []
    parent = ROOT_KEY
    for row in blocks:  # one hash per block, not per token
        h = hashlib.blake2b(parent.to_bytes(8, "little"), digest_size=8)
        h.update(row.tobytes())
        parent = int.from_bytes(h.digest(), "little") & KEY_MASK
        out.append(parent)
    return tuple(out)


def keys_from_hash_ids(hash_ids: Sequence[int]) -> tuple[int, ...]:
    """Chained keys for a trace's per-block hash ids (deterministic across processes)."""
    out: list[int] = []
    parent = ROOT_KEY
    for hid in hash_ids:
        # tuple hashing of ints is deterministic in CPython (no PYTHONHASHSEED randomisation for ints).
        parent = hash((parent, int(hid))) & KEY_MASK
        out.append(parent)
    return tuple(out)


def engine_blocks_per_block(block_tokens: int, engine_block_tokens: int) -> int:
    """How many engine KV blocks one cache (trie) block covers; a worker holds a cache block once it holds all
    of them (DESIGN.md §3). ValueError unless the engine block divides the cache block."""
    if engine_block_tokens < 1 or block_tokens % engine_block_tokens:
        raise ValueError(
            f"engine KV block of {engine_block_tokens} tokens does not divide cache.block_tokens={block_tokens}"
        )
    return block_tokens // engine_block_tokens


def group_engine_blocks(
    engine_hashes: Sequence[int], block_keys: Sequence[int], per_block: int
) -> list[tuple[int, tuple[int, ...]]]:
    """Pair cache block j's key with the engine-block hashes it covers, ``engine_hashes[j·n : (j+1)·n]``
    (n = ``per_block``). Only cache blocks whose engine blocks are all given are returned, in prompt order."""
    n = min(len(block_keys), len(engine_hashes) // per_block)
    return [(block_keys[j], tuple(engine_hashes[j * per_block : (j + 1) * per_block])) for j in range(n)]
