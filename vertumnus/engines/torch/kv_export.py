"""Write a torch-engine prefill's KV as the files vLLM's ``ExampleConnector`` loads (``kv_consumer`` side).

The connector (``vllm/distributed/kv_transfer/kv_connector/v1/example_connector.py``) keeps one folder per
prompt under ``shared_storage_path``, named by the hash of the int64 token ids it covers, holding one
``{layer_name}.safetensors`` per attention layer with a single tensor ``kv_cache``. That tensor is not K and V
per token: it is ``layer[block_idxs, :, offsets]`` of the decode engine's paged cache viewed as
``[blocks, kv_heads, block_size, C]`` — the backend's own block memory, slot by slot. vLLM's CPU backend stores
a block per head as ``[2 * block_size, head_dim]`` (keys, then values) in an ISA-specific packing, viewed as
``[block_size, 2 * head_dim]``. So the exporter does not re-derive that packing: it writes the KV into blocks
of the same shape with vLLM's own cache-write kernel (``cpu_attn_reshape_and_cache``, the ISA vLLM picks for
the dtype and block size) and slices them exactly as the connector's save path does.

Which tokens: for a prompt of L tokens the decode engine looks up the folder of the first
``((L - 1) - 1) // B * B`` tokens (``get_num_new_matched_tokens``) and then loads the files of the first
``(L - 1) // B * B`` tokens (``ReqMeta.make_meta`` over the whole prompt); the two differ when L - 1 is a
multiple of B. Both folders are written (the shorter is a prefix of the longer), so every prompt length hits and
loads; the tokens past them (at least the last one) are recomputed by the decode engine, which yields the first
token's logits there.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from vertumnus.config import VertumnusConfig

# vLLM's attention layer names for the Llama / Qwen2 / Qwen3 / Qwen3-MoE families (``{prefix}.attn`` of
# ``model.layers.{i}.self_attn``); the connector's files are named after them.
LAYER_NAME = "model.layers.{}.self_attn.attn"


@dataclass(slots=True, frozen=True)
class ExportedPrefill:
    """What one export wrote: the folders (lookup and load; equal unless L - 1 is a multiple of the block)."""

    folders: tuple[Path, ...]
    tokens: int  # tokens the decode engine loads (the rest it recomputes)


def cached_tokens(num_prompt_tokens: int, block_size: int) -> tuple[int, int]:
    """(tokens the connector looks up, tokens it loads) for a prompt of ``num_prompt_tokens``."""
    return (num_prompt_tokens - 2) // block_size * block_size, (num_prompt_tokens - 1) // block_size * block_size


def folder_name(token_ids: list[int]) -> str:
    """The connector's folder name for ``token_ids`` (hash of their int64 bytes; md5, sha256 under FIPS)."""
    data = torch.tensor(token_ids, dtype=torch.int64).numpy().tobytes()
    try:
        return hashlib.md5(data, usedforsecurity=False).hexdigest()
    except ValueError:  # FIPS: vllm.utils.hashing.safe_hash falls back the same way
        return hashlib.sha256(data).hexdigest()


class ExampleConnectorExporter:
    """Writes prefills into ``storage`` for a vLLM CPU decode instance whose KV blocks hold ``block_size`` tokens
    (the cache dtype and head size are the exported KV's own: the decode instance must serve the same checkpoint
    in the same dtype).

    Construction imports vLLM's CPU kernels (vLLM must be installed where the torch engine's driver runs) and
    fails with a clear error otherwise."""

    def __init__(self, storage: str | Path, block_size: int) -> None:
        try:
            import vllm._custom_ops  # noqa: F401  (registers torch.ops._C.cpu_attn_reshape_and_cache)
            from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
        except Exception as e:  # any import failure: the export cannot produce vLLM's layout
            raise RuntimeError(f"KV export for vLLM needs vllm (CPU build) importable here: {e}") from e
        self.storage = Path(storage)
        self.block_size = block_size
        self._isa = _get_attn_isa
        self._write_op = torch.ops._C.cpu_attn_reshape_and_cache

    def export(self, token_ids: list[int], kv: torch.Tensor) -> ExportedPrefill:
        """Write the connector files of a prompt whose full KV is ``kv`` ([layers, 2, Hkv, T, D], T ≥ the
        tokens loaded, sequence order). A prompt too short for a lookup hit writes nothing (vLLM computes it)."""
        look, load = cached_tokens(len(token_ids), self.block_size)
        if kv.dim() != 5 or kv.shape[1] != 2 or kv.shape[3] < load:
            raise ValueError(f"KV of shape {tuple(kv.shape)} does not cover {load} tokens")
        if look == 0:  # the lookup covers no whole block (L ≤ B + 1): vLLM computes the whole prompt itself
            return ExportedPrefill((), 0)
        slots = self._slots(kv[:, :, :, :load])
        folders = []
        for n in sorted({look, load}, reverse=True):
            folder = self.storage / folder_name(token_ids[:n])
            tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
            tmp.mkdir(parents=True, exist_ok=True)
            for layer, per_slot in enumerate(slots):
                _save(tmp / f"{LAYER_NAME.format(layer)}.safetensors", per_slot[:n])
            # Rename last: the decode engine treats an existing folder as a hit, so it must never see a partial one.
            try:
                tmp.rename(folder)
            except OSError:  # an identical prompt was exported before (same tokens → same KV): keep that one
                if not folder.is_dir():
                    raise
                _remove(tmp)
            folders.append(folder)
        return ExportedPrefill(tuple(folders), load)

    def _slots(self, kv: torch.Tensor) -> list[torch.Tensor]:
        """Per layer: the connector's ``[tokens, Hkv, C]`` slot tensor of ``kv`` ([layers, 2, Hkv, n, D])."""
        layers, _, heads, n, dim = kv.shape
        bs = self.block_size
        isa = self._isa(kv.dtype, bs, dim)  # what vLLM's CPU backend picks for this cache (dtype, block, head)
        blocks = n // bs
        slot_mapping = torch.arange(n, dtype=torch.int64)
        out = []
        for layer in range(layers):
            cache = torch.zeros(blocks, heads, bs, 2 * dim, dtype=kv.dtype)
            key_cache, value_cache = cache.view(blocks, heads, 2 * bs, dim).chunk(2, dim=2)
            k = kv[layer, 0].transpose(0, 1).contiguous()  # [n, Hkv, D]
            v = kv[layer, 1].transpose(0, 1).contiguous()
            self._write_op(k, v, key_cache, value_cache, slot_mapping, isa, 1.0, 1.0, "auto")
            out.append(cache[slot_mapping // bs, :, slot_mapping % bs].contiguous())  # the connector's save slice
        return out


def _save(path: Path, tensor: torch.Tensor) -> None:
    from safetensors.torch import save_file

    save_file({"kv_cache": tensor.contiguous()}, str(path))


def _remove(folder: Path) -> None:
    for f in folder.iterdir():
        f.unlink()
    folder.rmdir()


def exporter_for(cfg: VertumnusConfig) -> ExampleConnectorExporter | None:
    """The exporter ``serving.kv_export_path`` asks for (None when unset)."""
    if not cfg.serving.kv_export_path:
        return None
    return ExampleConnectorExporter(cfg.resolve_path(cfg.serving.kv_export_path), cfg.serving.kv_export_block_size)
