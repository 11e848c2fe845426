"""Real multi-process zigzag CP (4 gloo ranks): last-token logits and produced KV equal the single-process
reference for C ∈ {1, 2, 4}, uncached lengths that are not multiples of 2C, and cached prefixes of 0–3 blocks
(gathered from canonical and post-merge block placements)."""

from __future__ import annotations

import torch.distributed as dist
import torch.multiprocessing as tmp
from cp_mp_cases import BLOCK, CASES, MODEL, case_tokens, collect, run_rank

from vertumnus.cp.model import ReferenceModel
from vertumnus.engines.torch.launcher import FORKSERVER_PRELOAD

TOL = 1e-4


def test_cp_prefill_matches_reference_on_4_ranks() -> None:
    ctx = tmp.get_context("forkserver")
    ctx.set_forkserver_preload([*FORKSERVER_PRELOAD, "cp_mp_cases"])  # no effect if already running
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    out_q, done = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=run_rank, args=(r, store.port, out_q, done), daemon=True) for r in range(4)]
    got = collect(procs, out_q, done)
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
