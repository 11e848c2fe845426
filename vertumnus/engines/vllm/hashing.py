"""vLLM-compatible prefix-cache block hashes, recomputed outside vLLM.

vLLM (``vllm/v1/core/kv_cache_utils.py``, ``hash_block_tokens`` and ``get_request_block_hasher``) identifies the
k-th full block of ``B`` tokens of a prompt by a chained digest::

    h_0 = H((NONE_HASH, tuple(tokens[0:B]), None))
    h_k = H((h_{k-1}, tuple(tokens[kB:(k+1)B]), None))        NONE_HASH = H(seed)

with ``H = sha256(cbor2.dumps(x, canonical=True))`` for ``prefix_caching_hash_algo="sha256_cbor"``. The seed is
``PYTHONHASHSEED`` when the engine process has it set, else the fixed string ``"vllm-none-hash"``
(``resolve_none_hash_seed``; cryptographic algorithms only — the xxhash variants use a random per-process seed,
which is why Vertumnus pins sha256_cbor). ``extra_keys`` is None for plain token prompts (no LoRA, multimodal
inputs, cache salt or prompt embeddings — Vertumnus sends none of them). KV events carry the low 64 bits of each
digest as an unsigned int (``maybe_convert_block_hash`` with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``, the
default); the chain itself runs on full 32-byte digests.

Only full blocks are hashed. Under decode context parallelism one hashed block spans ``block_size × dcp``
tokens; prefill context parallelism alone replicates the KV cache and keeps ``block_size`` (vLLM 0.32).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import cbor2
import numpy as np

DEFAULT_SEED = "vllm-none-hash"
_LOW64 = (1 << 64) - 1


def sha256_cbor(obj: object) -> bytes:
    """vLLM's ``sha256_cbor``: SHA-256 of the canonical CBOR encoding."""
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def none_hash(seed: str | None = None) -> bytes:
    """The chain's root digest for ``seed`` (None: vLLM's default seed)."""
    return sha256_cbor(DEFAULT_SEED if seed is None else seed)


def external_hash(digest: bytes | int) -> int:
    """A digest as KV events carry it: the low 64 bits, big-endian (ints pass through)."""
    if isinstance(digest, int):
        return digest & _LOW64
    return int.from_bytes(digest, "big") & _LOW64


def _array_header(n: int) -> bytes:
    """Canonical CBOR header of an array of ``n`` items."""
    if n < 24:
        return bytes([0x80 | n])
    if n < 1 << 8:
        return bytes([0x98, n])
    if n < 1 << 16:
        return b"\x99" + n.to_bytes(2, "big")
    return b"\x9a" + n.to_bytes(4, "big")


def cbor_uints(values: np.ndarray) -> tuple[bytes, np.ndarray]:
    """Canonical CBOR encodings of non-negative ints, concatenated, and each value's start offset — what
    ``cbor2.dumps(tuple(values), canonical=True)`` writes after the array header, vectorised: shortest form,
    1 byte below 24, else a 0x18 / 0x19 / 0x1a / 0x1b prefix and 1 / 2 / 4 / 8 big-endian bytes."""
    v = values.astype(np.uint64, copy=False)
    if len(v) and int(values.min()) < 0:
        raise ValueError("token ids must be non-negative")
    width = np.select([v < 24, v < 1 << 8, v < 1 << 16, v < 1 << 32], [0, 1, 2, 4], 8).astype(np.int64)
    size = 1 + width
    offsets = np.concatenate(([0], np.cumsum(size)[:-1])).astype(np.int64)
    buf = np.zeros(int(size.sum()), dtype=np.uint8)
    small = width == 0
    buf[offsets[small]] = v[small].astype(np.uint8)
    for w, tag in ((1, 0x18), (2, 0x19), (4, 0x1A), (8, 0x1B)):
        sel = width == w
        if not sel.any():
            continue
        at = offsets[sel]
        buf[at] = tag
        x = v[sel]
        for b in range(w):  # big-endian payload bytes
            buf[at + 1 + b] = ((x >> np.uint64(8 * (w - 1 - b))) & np.uint64(0xFF)).astype(np.uint8)
    return buf.tobytes(), offsets


class VllmBlockHasher:
    """Block hashes of token prompts as one vLLM engine computes them (fixed seed and block size).

    ``block_tokens`` is the *hashed* block size (``block_size`` × DCP size); see the module docstring.
    """

    __slots__ = ("block_tokens", "root", "seed")

    def __init__(self, block_tokens: int, seed: str | None = None) -> None:
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be ≥ 1, got {block_tokens}")
        self.block_tokens = block_tokens
        self.seed = seed
        self.root = none_hash(seed)

    def digests(self, token_ids: Sequence[int] | np.ndarray, max_blocks: int | None = None) -> list[bytes]:
        """Chained 32-byte digests of the prompt's full blocks (at most ``max_blocks`` of them)."""
        toks = np.asarray(token_ids, dtype=np.int64)
        n = len(toks) // self.block_tokens
        if max_blocks is not None:
            n = min(n, max_blocks)
        if n == 0:
            return []
        body, offsets = cbor_uints(toks[: n * self.block_tokens])
        ends = [*offsets[:: self.block_tokens].tolist(), len(body)]
        head = b"\x83\x58\x20"  # array(3) [ bytes(32) parent, array(B) tokens, None ]
        arr, none = _array_header(self.block_tokens), b"\xf6"
        out: list[bytes] = []
        parent = self.root
        for k in range(n):  # one SHA-256 per block over pre-encoded bytes, never a per-token Python step
            parent = hashlib.sha256(b"".join((head, parent, arr, body[ends[k] : ends[k + 1]], none))).digest()
            out.append(parent)
        return out

    def hashes(self, token_ids: Sequence[int] | np.ndarray, max_blocks: int | None = None) -> list[int]:
        """The prompt's block hashes as KV events report them (low 64 bits)."""
        return [int.from_bytes(d, "big") & _LOW64 for d in self.digests(token_ids, max_blocks)]
