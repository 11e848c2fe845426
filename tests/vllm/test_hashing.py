"""Vertumnus' vLLM block hashes equal vLLM's own (``hash_block_tokens`` chained as ``get_request_block_hasher``
does), for the sha256_cbor algorithm, the default and an explicit seed, and two block sizes."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from vertumnus.cache.block_keys import engine_blocks_per_block, group_engine_blocks
from vertumnus.engines.vllm.hashing import VllmBlockHasher, external_hash


def _vllm() -> SimpleNamespace:
    """vLLM's hashing code, imported per test (the conftest's gate decides whether vLLM must be here)."""
    from vllm.utils.hashing import sha256_cbor
    from vllm.v1.core import kv_cache_utils

    return SimpleNamespace(sha256_cbor=sha256_cbor, kcu=kv_cache_utils)


def vllm_hashes(tokens: list[int], block: int) -> list[int]:
    """vLLM's chain over full blocks, converted as its KV events convert them."""
    v = _vllm()
    kcu, vllm_sha256_cbor = v.kcu, v.sha256_cbor
    out: list[int] = []
    parent = None
    for k in range(len(tokens) // block):
        parent = kcu.hash_block_tokens(vllm_sha256_cbor, parent, tokens[k * block : (k + 1) * block], None)
        out.append(kcu.maybe_convert_block_hash(parent))
    return out


@pytest.mark.parametrize("block", [16, 32])
@pytest.mark.parametrize("seed", [None, "1234"])
def test_hashes_equal_vllm(block: int, seed: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    if seed is None:
        monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    else:
        monkeypatch.setenv("PYTHONHASHSEED", seed)
    _vllm().kcu.init_none_hash(_vllm().sha256_cbor)
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, 50_000, size=10 * block + block // 2).tolist()
    mine = VllmBlockHasher(block, seed).hashes(tokens)
    assert len(mine) == 10
    assert mine == vllm_hashes(tokens, block)
    assert VllmBlockHasher(block, seed).hashes(np.asarray(tokens, dtype=np.int32), max_blocks=3) == mine[:3]


def test_seed_changes_every_hash(monkeypatch: pytest.MonkeyPatch) -> None:
    tokens = list(range(64))
    assert set(VllmBlockHasher(32).hashes(tokens)).isdisjoint(VllmBlockHasher(32, "0").hashes(tokens))


def test_external_hash_is_low_64_bits() -> None:
    digest = bytes(range(32))
    assert external_hash(digest) == int.from_bytes(digest[-8:], "big")
    assert external_hash((1 << 70) + 5) == 5


def test_engine_blocks_per_block() -> None:
    assert engine_blocks_per_block(512, 32) == 16
    assert engine_blocks_per_block(32, 32) == 1
    with pytest.raises(ValueError, match="does not divide"):
        engine_blocks_per_block(100, 32)
    assert group_engine_blocks([1, 2, 3, 4, 5], [10, 20, 30], 2) == [(10, (1, 2)), (20, (3, 4))]


def test_vectorised_cbor_equals_cbor2(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every CBOR integer width (1, 2, 3, 5, 9 bytes) against cbor2's canonical encoder."""
    import cbor2

    from vertumnus.engines.vllm.hashing import cbor_uints

    values = np.array([0, 1, 23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**40, 2**63 - 1], dtype=np.int64)
    body, offsets = cbor_uints(values)
    assert body == cbor2.dumps(tuple(values.tolist()), canonical=True)[1:]  # minus the array header
    assert offsets.tolist() == [0, 1, 2, 3, 5, 7, 10, 13, 18, 23, 32, 41]
    big = np.random.default_rng(1).integers(0, 2**40, size=64)
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    _vllm().kcu.init_none_hash(_vllm().sha256_cbor)
    assert VllmBlockHasher(32).hashes(big) == vllm_hashes(big.tolist(), 32)
