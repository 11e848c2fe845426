"""Profile the REAL torch CP engine on this CPU (degrees 1 and 2, gloo rank processes) and fit E_C within 15 %.

The machine is shared (2 cores, several busy processes), so the measurement is made robust rather than the
assertion loose: one warm-up pass, five shuffled repeats per point, the per-point median, the ``cpu`` clock
(the slowest rank's CPU time — time spent waiting for a core is not counted) and prompts of 512–2048 tokens,
where the prefill's own work dominates the fixed per-request overheads.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vertumnus.config import config_from_dict
from vertumnus.profiling.cost_model import CostProfile
from vertumnus.profiling.flow import ProfileOptions, run_profile
from vertumnus.profiling.measure import GridSpec, read_samples
from vertumnus.profiling.torch_target import TorchTarget, single_worker_config

TINY = {
    "pool": {"engine": "torch", "nodes": 1, "gpus_per_node": 2, "degrees": [1, 2], "max_model_len": 4096},
    "cache": {"block_tokens": 32},
    "model": {"hidden_size": 64, "intermediate_size": 128, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1},
    "serving": {"device": "cpu"},
}


def test_single_worker_config_keeps_everything_but_the_pool() -> None:
    cfg = config_from_dict(TINY)
    one = single_worker_config(cfg, 2)
    assert (one.pool.nodes, one.pool.gpus_per_node, one.pool.degrees) == (1, 2, [2])
    assert one.model == cfg.model and one.cache == cfg.cache and one.pool.max_model_len == 4096


def test_bad_timing_is_an_error() -> None:
    with pytest.raises(ValueError, match="--timing must be one of wall, cpu"):
        TorchTarget(config_from_dict(TINY), timing="gpu")


def test_cuda_config_on_a_host_without_gpu_is_a_clear_error() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    cfg = config_from_dict({**TINY, "serving": {"device": "cuda"}})
    with pytest.raises(ValueError, match=r"serving\.device is 'cuda' but this machine has no GPU"):
        TorchTarget(cfg)


def test_profiling_the_torch_engine_fits_within_15_percent(tmp_path: Path, excerpt: Path) -> None:
    cfg = config_from_dict(TINY)
    target = TorchTarget(cfg, timing="cpu")
    spec = GridSpec(degrees=(1, 2), lengths=(512, 1024, 1536, 2048), prefix_ratios=(0.0, 0.5), repeats=5)
    out = tmp_path / "torch-tiny.yaml"
    run = run_profile(target, spec, cfg, ProfileOptions(out, max_mape=0.15, trace=excerpt))
    prof = CostProfile.load(out)
    assert (prof.engine, prof.source) == ("torch", "measured")
    assert "hidden 64" in prof.model and "cpu clock" in prof.hardware
    for c in (1, 2):
        mape = prof.degrees[c].mape
        assert mape is not None and mape <= 0.15, (c, mape, run.measurements)
        kappa = prof.degrees[c].kappa
        assert kappa is not None and kappa > 0
    rows = read_samples(out.with_name("torch-tiny.samples.csv"))
    assert len(rows) == 16 and all(m.repeats == 5 and m.seconds > 0 for m in rows)
    assert {(m.point.degree, m.point.length, m.point.p) for m in rows} == {
        (c, n, p) for c in (1, 2) for n in (512, 1024, 1536, 2048) for p in (0, n // 2)
    }
