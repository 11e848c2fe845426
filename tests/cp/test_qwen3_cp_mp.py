"""Real multi-process zigzag CP (4 gloo ranks) of Qwen3 and Qwen3-MoE checkpoints written with transformers:
last-token logits and produced KV equal the single-rank reference for C ∈ {1, 2, 4}, with and without a cached
prefix gathered from the ranks' blocks (each rank routes its own tokens through the replicated experts)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.distributed as dist
import torch.multiprocessing as tmp
from cp_mp_cases import collect
from cp_qwen3_mp_cases import BLOCK, CASES, case_tokens, run_rank
from qwen3_ckpt import hf_qwen3, hf_qwen3_moe, save

from vertumnus.cp.model import ReferenceModel
from vertumnus.cp.weights import load_hf_weights
from vertumnus.engines.torch.launcher import FORKSERVER_PRELOAD

pytest.importorskip("transformers")
TOL = 1e-4


def test_qwen3_and_moe_cp_prefill_match_reference_on_4_ranks(tmp_path: Path) -> None:
    paths = [str(save(hf_qwen3(seed=1), tmp_path / "dense")), str(save(hf_qwen3_moe(seed=2), tmp_path / "moe"))]
    ctx = tmp.get_context("forkserver")
    ctx.set_forkserver_preload([*FORKSERVER_PRELOAD, "cp_qwen3_mp_cases"])  # no effect if already running
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    out_q, done = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=run_rank, args=(r, store.port, paths, out_q, done), daemon=True) for r in range(4)]
    got = collect(procs, out_q, done)
    checked = 0
    for m, path in enumerate(paths):
        model = ReferenceModel(load_hf_weights(path))
        for i, (_total, pblocks) in enumerate(CASES):
            logits, cache = model.prefill(case_tokens(i))
            ref_kv = cache.tensor()[:, :, :, pblocks * BLOCK :]
            for c in (1, 2, 4):
                for group in range(4 // c):
                    key = (m, i, c, group)
                    assert (got[("logits", key)] - logits).abs().max().item() <= TOL, key
                    kv = got[("kv", key)]
                    assert kv.shape == ref_kv.shape, key
                    assert (kv - ref_kv).abs().max().item() <= TOL, key
                    checked += 1
    assert checked == 2 * len(CASES) * 7
