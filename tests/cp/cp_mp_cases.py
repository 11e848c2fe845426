"""Rank-process body of the multi-process CP correctness test (imported by the child processes).

World of 4 gloo ranks on 127.0.0.1; groups {0,1,2,3}, {0,1}, {2,3}. Every rank runs every case at C = 4, 2
and 1 (the two C = 2 groups and the four C = 1 ranks each run the same case) and sends what it computed back.
"""

from __future__ import annotations

import queue
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from vertumnus.config import ModelConfig
from vertumnus.cp.attention import chunk_attention
from vertumnus.cp.block_index import BlockIndex
from vertumnus.cp.comm import Comm, DistComm, LocalComm
from vertumnus.cp.cp_forward import cp_prefill, gather_prefix
from vertumnus.cp.model import ReferenceModel

BLOCK = 8
MODEL = ModelConfig(hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2, vocab_size=256, seed=11)
# (total tokens, cached prefix blocks): uncached R = 45, 29, 46, 3 (R < 2C at C = 4), 9 — none a multiple of 2C
CASES = [(45, 0), (45, 2), (70, 3), (19, 2), (9, 0)]


def case_tokens(i: int) -> torch.Tensor:
    total, _ = CASES[i]
    return torch.randint(0, MODEL.vocab_size, (total,), generator=torch.Generator().manual_seed(100 + i))


def _layouts(c: int, nblocks: int) -> dict[str, BlockIndex]:
    """Block placements to gather from: canonical (b mod C) and, for C = 4, the one a merge leaves (a prefix
    computed on the upper CP2 half stays on ranks 2, 3)."""
    keys = list(range(1, nblocks + 1))
    canon = BlockIndex(c, 64)
    canon.add_path(keys, 0)
    out = {"canonical": canon}
    if c == 4:
        half = BlockIndex(2, 64)
        half.add_path(keys, 0)
        out["merged"], _ = BlockIndex.merge([(2, half.rows())], 4, 64)
    return out


def gloo_comms(rank: int, port: int) -> dict[int, Comm]:
    """Join the 4-rank gloo world at ``port``; this rank's comm for C = 4 ({0..3}), 2 ({0,1} / {2,3}), 1."""
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=120))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=4, timeout=timedelta(seconds=120))
    g4 = dist.new_group([0, 1, 2, 3])
    g01, g23 = dist.new_group([0, 1]), dist.new_group([2, 3])
    return {4: DistComm(g4, rank, 4), 2: DistComm(g01 if rank < 2 else g23, rank % 2, 2), 1: LocalComm()}


def collect(procs: list[Any], out_q: Any, done: Any, timeout_s: float = 240) -> dict[tuple[str, Any], torch.Tensor]:
    """Start the rank processes and gather their ``(kind, key, tensor)`` messages until all four sent
    ``finished``; the ranks are released (``done``) and joined whatever happens."""
    for p in procs:
        p.start()
    got: dict[tuple[str, Any], torch.Tensor] = {}
    finished = 0
    try:
        while finished < len(procs):
            kind, key, val = out_q.get(timeout=timeout_s)
            if kind == "finished":
                finished += 1
            else:
                got[(kind, key)] = val.clone()
    except queue.Empty:
        raise AssertionError(f"ranks stalled; exit codes {[p.exitcode for p in procs]}") from None
    finally:
        done.set()
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    return got


def send(out_q: Any, key: Any, out: Any, comm: Comm) -> None:
    """One case's results: last-token logits (the rank that has them) and the new KV (the group's rank 0)."""
    if out.logits is not None:
        out_q.put(("logits", key, out.logits))
    if comm.rank == 0:
        out_q.put(("kv", key, out.new_kv))


def finish(out_q: Any, rank: int, done: Any) -> None:
    """Say this rank is done, wait for the test to release the world, leave it."""
    out_q.put(("finished", rank, None))
    done.wait(120)
    dist.destroy_process_group()


def run_rank(rank: int, port: int, out_q: Any, done: Any) -> None:
    comms = gloo_comms(rank, port)
    model = ReferenceModel.from_config(MODEL)
    for impl in ("flash_lse", "mask"):
        attend = chunk_attention(impl, "cpu")
        for i, (_total, pblocks) in enumerate(CASES):
            ids = case_tokens(i)
            p = pblocks * BLOCK
            prefix_kv = model.prefill(ids[:p])[1].tensor() if p else None
            for c, comm in comms.items():
                for layout, index in _layouts(c, pblocks).items():
                    keys = list(range(1, pblocks + 1))
                    blocks = {
                        k: prefix_kv[:, :, :, b * BLOCK : (b + 1) * BLOCK].clone()  # type: ignore[index]
                        for b, k in enumerate(keys)
                        if index.owner(k) == comm.rank
                    }
                    like = torch.empty(2, 2, 2, BLOCK, 16)
                    prefix = gather_prefix(comm, index, blocks, keys, like)
                    out = cp_prefill(model, comm, ids[p:], prefix, attend)
                    send(out_q, (impl, i, c, layout, rank // c), out, comm)
    finish(out_q, rank, done)
