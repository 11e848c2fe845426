"""RankWorker used directly, in this process, without the data plane or Ray (a world of one gloo rank)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from cp_helpers import TOL, tiny_config, tokens

from vertumnus.cache.block_keys import keys_from_tokens
from vertumnus.cp.model import ReferenceModel
from vertumnus.engines.torch import messages as m
from vertumnus.engines.torch.rank_worker import RankWorker
from vertumnus.types import CacheReport, CacheReportKind, WorkerGroup

B = 8


def test_rank_worker_steps_without_a_driver() -> None:
    cfg = tiny_config(1, [1], capacity=16)
    ref = ReferenceModel.from_config(cfg.model)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    spec = m.RankSpec(
        rank=0, world_size=1, gpus_per_node=1, degrees=(1,), model=cfg.model, block_tokens=B, capacity_blocks=16
    )
    w = RankWorker(spec)
    w.connect("127.0.0.1", store.port, generation=0)
    try:
        assert w.assign(WorkerGroup(5, 0, 0, 1), 3) == [m.EpochAck(5, 0, 3)]
        a = tokens(37, 1)  # 4 full blocks
        ka = keys_from_tokens(a, B)
        (done,) = w.step(m.RunPrefill(5, "a", a, ka, 100, return_kv=True))
        assert isinstance(done, m.PrefillDone) and done.cached_tokens == 0 and done.epoch == 3
        want_logits, want_cache = ref.prefill(a)
        assert done.logits is not None and done.kv is not None
        assert (done.logits - want_logits).abs().max().item() <= TOL
        assert (done.kv - want_cache.tensor()).abs().max().item() <= TOL
        assert done.reports == [CacheReport(5, CacheReportKind.STORED, ka, None)]

        (exp,) = w.step(m.ExportBlocks(1, 5, ka))
        assert isinstance(exp, m.Exported) and exp.keys == ka and exp.blocks is not None
        assert exp.blocks.shape == (4, 2, 2, 2, B, 16)
        assert torch.equal(exp.blocks[1], want_cache.tensor()[:, :, :, B : 2 * B])
        (rm,) = w.step(m.RemoveBlocks(2, 5, ka[2:]))
        assert isinstance(rm, m.OpDone) and rm.reports == [CacheReport(5, CacheReportKind.REMOVED, ka[2:], op_id=2)]
        (imp,) = w.step(m.ImportBlocks(3, 5, ka, 2, ka[2:], ka[2:], exp.blocks[2:]))
        assert isinstance(imp, m.OpDone) and imp.error is None
        assert imp.reports == [CacheReport(5, CacheReportKind.STORED, ka[2:], ka[1], 3)]

        b = a[:32] + tokens(9, 2)  # shares the 4 blocks
        (done,) = w.step(m.RunPrefill(5, "b", b, keys_from_tokens(b, B), 100))
        assert isinstance(done, m.PrefillDone) and done.cached_tokens == 32 and done.kv is None
        assert done.logits is not None and (done.logits - ref.prefill(b)[0]).abs().max().item() <= TOL
        (done,) = w.step(m.RunPrefill(5, "b-capped", b, keys_from_tokens(b, B), 1))  # max_reuse_blocks caps reuse
        assert isinstance(done, m.PrefillDone) and done.cached_tokens == 8

        assert w.step(m.Park(5)) == [m.Parked(5, 0)]
        with pytest.raises(AssertionError, match="command for worker 6"):
            w.step(m.Park(6))
    finally:
        dist.destroy_process_group()
