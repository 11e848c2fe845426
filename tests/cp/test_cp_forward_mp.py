"""Real multi-process zigzag CP (4 gloo ranks): last-token logits and produced KV equal the single-process
reference for C ∈ {1, 2, 4}, uncached lengths that are not multiples of 2C, and cached prefixes of 0–3 blocks
(gathered from canonical and post-merge block placements)."""

from __future__ import annotations

import queue

import torch
import torch.distributed as dist
import torch.multiprocessing as tmp
from cp_mp_cases import BLOCK, CASES, MODEL, case_tokens, run_rank

from vertumnus.cp.model import ReferenceModel
from vertumnus.engines.torch.launcher import FORKSERVER_PRELOAD

TOL = 1e-4


def test_cp_prefill_matches_reference_on_4_ranks() -> None:
    ctx = tmp.get_context("forkserver")
    ctx.set_forkserver_preload([*FORKSERVER_PRELOAD, "cp_mp_cases"])  # no effect if already running
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    out_q, done = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=run_rank, args=(r, store.port, out_q, done), daemon=True) for r in range(4)]
    for p in procs:
        p.start()
    got: dict[tuple[str, tuple], torch.Tensor] = {}
    finished = 0
    try:
        while finished < 4:
            kind, key, val = out_q.get(timeout=240)
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
    model = ReferenceModel.from_config(MODEL)
    checked = 0
    for i, (_total, pblocks) in enumerate(CASES):
        ids = case_tokens(i)
        logits, cache = model.prefill(ids)
        ref_kv = cache.tensor()[:, :, :, pblocks * BLOCK :]
        for impl in ("flash_lse", "mask"):
            for c in (1, 2, 4):
                layouts = ["canonical", "merged"] if c == 4 and pblocks else ["canonical"]
                for layout in layouts:
                    for group in range(4 // c):
                        key = (impl, i, c, layout, group)
                        assert (got[("logits", key)] - logits).abs().max().item() <= TOL, key
                        kv = got[("kv", key)]
                        assert kv.shape == ref_kv.shape, key
                        assert (kv - ref_kv).abs().max().item() <= TOL, key
                        checked += 1
    assert checked == 2 * len(CASES) * 7 + 2 * sum(1 for _, pb in CASES if pb)
