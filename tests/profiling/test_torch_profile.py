"""Profile the REAL torch CP engine on this CPU (degrees 1 and 2, gloo rank processes): the whole flow.

The engine runs every grid point — C rank processes, the prefix prefilled untimed and cached, then the timed
prefill that must reuse exactly P tokens — but the recorded seconds come from a controlled timer (the planted
E_C), so the fitted coefficients, the samples CSV and κ are exact and independent of the machine's load. The
timed fit within 15 % on real clocks is a benchmark: ``vertumnus bench profile-fit --engine torch``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from profile_helpers import PlantedTimer

from vertumnus.config import config_from_dict
from vertumnus.cost_model import COEFFICIENTS, CostModel, CostProfile, DegreeProfile
from vertumnus.profiling.flow import ProfileOptions, run_profile
from vertumnus.profiling.measure import GridSpec, read_samples
from vertumnus.profiling.torch_target import TorchTarget, single_worker_config

TINY = {
    "pool": {"engine": "torch", "nodes": 1, "gpus_per_node": 2, "degrees": [1, 2], "max_model_len": 4096},
    "cache": {"block_tokens": 32},
    "model": {"hidden_size": 64, "intermediate_size": 128, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1},
    "serving": {"device": "cpu"},
}
LENGTHS = (96, 160, 256)


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


def test_profiling_the_torch_engine_runs_every_point_and_fits_controlled_timings(
    tmp_path: Path, excerpt: Path, planted: dict[int, DegreeProfile]
) -> None:
    cfg = config_from_dict(TINY)
    target = TorchTarget(cfg)
    spec = GridSpec(degrees=(1, 2), lengths=LENGTHS, prefix_ratios=(0.0, 0.5), repeats=2, warmup=1)
    timer = PlantedTimer({c: planted[c] for c in (1, 2)})
    out = tmp_path / "torch-tiny.yaml"
    run_profile(target, spec, cfg, ProfileOptions(out, trace=excerpt), timer=timer)
    # P = ⌊L/2⌋ rounded down to whole 32-token cache blocks: 96 → 32, 160 → 64, 256 → 128
    points = {(c, n - p, p) for c in (1, 2) for n, half in zip(LENGTHS, (32, 64, 128), strict=True) for p in (0, half)}
    assert timer.per_point() == {pt: 2 for pt in points}  # every point timed `repeats` times ...
    assert all(engine_s > 0 for _, engine_s in timer.runs)  # ... by a real prefill on the C rank processes
    # every prefill, warm-up and timed, reused exactly its P cached tokens (the engine's own count)
    assert sorted(target.reused) == sorted((p, p) for *_, p in points for _ in range(spec.warmup + spec.repeats))
    prof = CostProfile.load(out)
    assert (prof.engine, prof.source, sorted(prof.degrees)) == ("torch", "controlled", [1, 2])
    assert "hidden 64" in prof.model and "wall clock" in prof.hardware and "controlled timer" in prof.notes
    for c in (1, 2):  # the fit ran on exactly the planted times
        for name in COEFFICIENTS:
            want = getattr(planted[c], name)
            assert getattr(prof.degrees[c], name) == pytest.approx(want, rel=1e-6, abs=1e-15), (c, name)
        mape, kappa = prof.degrees[c].mape, prof.degrees[c].kappa
        assert mape is not None and mape < 1e-9
        assert kappa is not None and 0 < kappa <= prof.kappa_window_s  # κ from the fitted (= planted) model
    rows = read_samples(out.with_name("torch-tiny.samples.csv"))
    assert len(rows) == 12 and {m.repeats for m in rows} == {2}
    assert {(m.point.degree, m.point.r, m.point.p) for m in rows} == points
    model = CostModel(prof)
    assert all(m.seconds == pytest.approx(model.predict(m.point.degree, m.point.r, m.point.p), rel=1e-9) for m in rows)
    assert out.with_name("torch-tiny.fit.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
