"""Config validation: every invalid value fails at load time naming its key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from vertumnus.config import (
    ConfigError,
    ControllerConfig,
    PredictiveConfig,
    RulesConfig,
    config_from_dict,
    describe_config,
    dump_config,
    format_composition,
    load_config,
    parse_composition,
    unread_settings,
    whole_windows,
)
from vertumnus.config.renamed import RENAMED

REPO = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    ("text", "key", "fragment"),
    [
        ("scheduler: {beta: 0.5}", "scheduler.beta", "greater than or equal to 1"),
        ("scheduler: {lam: -1}", "scheduler.lam", "greater than or equal to 0"),
        ("cache: {theta_reclaim: 9, theta_intra: 8}", "cache", "theta_reclaim (9.0) must be below theta_intra"),
        ("cache: {decay: 1.0}", "cache.decay", "less than 1"),
        ("cache: {decay: 0}", "cache.decay", "greater than 0"),
        ("pool: {degrees: [3, 4]}", "pool.degrees", "degree 3 is not a power of two"),
        ("pool: {gpus_per_node: 4, degrees: [8]}", "pool", "degree 8 does not divide gpus_per_node=4"),
        ("pool: {colour: red}", "pool.colour", "unknown key"),
        ("pool: {engine: torch, sim_switch_s: 3}", "pool", "sim_switch_s applies to engine sim only (engine is torch)"),
        ("bogus: 1", "bogus", "unknown key"),
        ("controller: {rules: {theta_low: 0.9, theta_up: 0.8}}", "controller.rules",
         "theta_low (0.9) must be below theta_up"),
        ("controller: {predictive: {split_margin: 1.0}}", "controller.predictive.split_margin", "less than 1"),
        ("controller: {predictive: {colour: red}}", "controller.predictive.colour", "unknown key"),
        ("pool: {nodes: 1, gpus_per_node: 8, degrees: [4, 8], initial_composition: 1xCP4}", "pool", "uses 4 GPUs"),
        # No split / merge connects CP2 and CP8: the controller could never act.
        ("pool: {degrees: [2, 8]}", "pool.degrees", "no operation connects CP2 and CP8 (each degree must be twice "
         "the previous one, e.g. [2, 4, 8])"),
        ("pool: {degrees: [8, 1, 2]}", "pool.degrees", "connects CP2 and CP8 (each degree must be twice the "
         "previous one, e.g. [2, 4, 8])"),
        # The trie node must cover whole vLLM blocks: caught at load, not when the first engine starts.
        ("pool: {engine: vllm}\ncache: {block_tokens: 48}\nvllm: {block_size: 32}", "vllm.block_size",
         "32 tokens does not divide cache.block_tokens=48"),
        ("pool: {engine: vllm}\ncache: {block_tokens: 64}\nvllm: {block_size: 32, engine_args: "
         "{decode_context_parallel_size: 4}}", "vllm.engine_args.decode_context_parallel_size",
         "block_size 32 × DCP 4 = 128 tokens does not divide cache.block_tokens=64"),
        # queue_aware prices copies at link speed: a vLLM "copy" that recomputes the prefix cannot back it.
        ("pool: {engine: vllm}\ncache: {policy: queue_aware}", "cache.policy", "set vllm.replication: transfer"),
        ("cache: {policy: lru}", "cache.policy", "Input should be 'rules' or 'queue_aware'"),
        # a Ray resource name: `ray start --resources` would refuse it, and the pool would wait for no node
        ("serving: {ray_node_resource: 'pool node'}", "serving.ray_node_resource", "String should match pattern"),
    ],
)  # fmt: skip
def test_invalid_values_name_their_key(tmp_path: Path, text: str, key: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, text))
    msg = str(err.value)
    assert f"  {key}:" in msg
    assert fragment in msg


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(_write(tmp_path, "pool: [unclosed"))
    with pytest.raises(ConfigError, match="mapping at the top level"):
        load_config(_write(tmp_path, "- 1\n- 2"))


def test_defaults_round_trip(tmp_path: Path) -> None:
    cfg = load_config(None)
    again = load_config(_write(tmp_path, dump_config(cfg)))
    assert again == cfg


def test_shipped_configs_load() -> None:
    paths = sorted((REPO / "configs").glob("*.yaml"))
    assert len(paths) >= 6
    for path in paths:
        load_config(path)


def test_engine_block_size_binds_only_the_vllm_engine(tmp_path: Path) -> None:
    # The sim / torch engines do not read the vllm section: its default block_size (32) need not divide 100.
    cfg = load_config(_write(tmp_path, "pool: {engine: sim}\ncache: {block_tokens: 100}"))
    assert (cfg.cache.block_tokens, cfg.vllm.block_size) == (100, 32)
    cfg = load_config(_write(tmp_path, "pool: {engine: vllm}\ncache: {block_tokens: 128}\nvllm: {block_size: 32}"))
    assert cfg.cache.block_tokens // cfg.vllm.block_size == 4
    assert load_config(_write(tmp_path, "pool: {degrees: [1, 2, 4, 8]}")).pool.degrees == [1, 2, 4, 8]
    assert load_config(_write(tmp_path, "pool: {degrees: [8]}")).pool.degrees == [8]  # one degree: no moves


def test_cache_policy_default_resolves_for_vllm_recompute(tmp_path: Path) -> None:
    # queue_aware is the default, but a vLLM pool that recomputes its copies cannot back it: a config that never
    # names cache.policy loads with rules there (explicit queue_aware is rejected above), and shows it.
    assert load_config(None).cache.policy == "queue_aware"
    cfg = load_config(_write(tmp_path, "pool: {engine: vllm}\ncache: {block_tokens: 512}"))
    assert (cfg.vllm.replication, cfg.cache.policy) == ("recompute", "rules")
    assert "  policy: rules\n" in dump_config(cfg)
    assert load_config(_write(tmp_path, dump_config(cfg))) == cfg
    cfg = load_config(_write(tmp_path, "pool: {engine: vllm}\nvllm: {replication: transfer}"))
    assert cfg.cache.policy == "queue_aware"
    cfg = load_config(_write(tmp_path, "pool: {engine: vllm}\ncache: {replication: false}"))
    assert cfg.cache.policy == "queue_aware"  # no copies at all: nothing to resolve


def test_composition_parsing() -> None:
    assert parse_composition("4xCP4+3xCP8") == {4: 4, 8: 3}
    assert parse_composition(" 2 x CP4 + 1xCP4 ") == {4: 3}
    assert format_composition({8: 3, 4: 4}) == "4xCP4+3xCP8"
    for bad in ("", "4CP4", "4xCP4+", "0xCP4", "axCP4"):
        with pytest.raises(ValueError, match="composition"):
            parse_composition(bad)


def test_the_default_controller_policy_is_predictive_and_the_rules_config_differs_in_the_policy_only() -> None:
    # configs/sim-40gpu-rules.yaml is the rule controller's ablation: everything but the policy held fixed.
    base = yaml.safe_load((REPO / "configs" / "sim-40gpu.yaml").read_text())
    rules = yaml.safe_load((REPO / "configs" / "sim-40gpu-rules.yaml").read_text())
    assert (base["controller"].pop("policy"), rules["controller"].pop("policy")) == ("predictive", "rules")
    assert rules == base
    assert load_config(REPO / "configs" / "sim-40gpu-rules.yaml").controller.policy == "rules"
    assert load_config(REPO / "configs" / "local.yaml").controller.policy == "predictive"  # the default


def test_the_controller_is_nested_by_policy_with_horizons_in_seconds() -> None:
    cc = load_config(None).controller
    assert (cc.enabled, cc.policy, cc.window_s) == (True, "predictive", 5.0)
    assert set(ControllerConfig.model_fields) == {"enabled", "policy", "window_s", "rules", "predictive"}
    fields = len(ControllerConfig.model_fields) - 2 + len(RulesConfig.model_fields) + len(PredictiveConfig.model_fields)
    assert fields <= 20
    # the horizons the predictive policy was tuned at, in seconds of 5-s windows
    p = cc.predictive
    assert (p.span_s, p.burst_span_s, p.merge_persist_s, p.merge_stress_memory_s) == (10.0, 2.0, 10.0, 30.0)
    assert [whole_windows(s, cc.window_s) for s in (p.merge_persist_s, p.merge_stress_memory_s)] == [2, 6]
    assert whole_windows(0.3, 0.1) == 3 and whole_windows(7.0, 5.0) is None
    pool = load_config(None).pool
    assert (pool.initial_headroom, pool.history_trace, pool.sim_switch_s) == (0.2, None, 0.8)


@pytest.mark.parametrize(
    ("controller", "keys"),
    [
        ({"predictive": {"merge_persist_s": 7.5}}, ["controller.predictive.merge_persist_s"]),
        ({"window_s": 4.0}, ["controller.predictive.merge_persist_s", "controller.predictive.merge_stress_memory_s"]),
        ({"window_s": 4.0, "predictive": {"merge_persist_s": 8, "merge_stress_memory_s": 30}},
         ["controller.predictive.merge_stress_memory_s"]),
    ],
)  # fmt: skip
def test_a_horizon_that_is_not_whole_windows_is_an_error_naming_the_key(
    controller: dict[str, object], keys: list[str]
) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict({"controller": controller})
    msg = str(err.value)
    for key in keys:
        assert f"  {key}: " in msg and "is not a whole number of controller.window_s" in msg
    assert msg.count("\n  ") == len(keys)


def test_whole_windows_bind_the_predictive_policy_only() -> None:
    # the rule controller does not read the predictive horizons: any window goes
    assert config_from_dict({"controller": {"policy": "rules", "window_s": 4.0}}).controller.window_s == 4.0
    cfg = config_from_dict({"controller": {"window_s": 2.5, "predictive": {"merge_stress_memory_s": 0}}})
    assert cfg.controller.predictive.merge_stress_memory_s == 0  # 0: always the largest stress
    cfg.controller.policy = "rules"
    cfg.controller.window_s = 3.0
    with pytest.raises(ValueError, match="merge_persist_s"):  # assignments are validated like loads
        cfg.controller.policy = "predictive"


@pytest.mark.parametrize(
    ("text", "lines"),
    [
        ("controller: {split_margin: 0.1}", ["controller.split_margin: moved to controller.predictive.split_margin"]),
        ("controller: {lookback_windows: 3, headroom: 0.3}",
         ["controller.lookback_windows: now controller.predictive.span_s, in seconds",
          "controller.headroom: moved to pool.initial_headroom"]),
        ("controller: {theta_up: 0.7}", ["controller.theta_up: moved to controller.rules.theta_up"]),
        ("controller: {history_trace: t.jsonl}", ["controller.history_trace: moved to pool.history_trace"]),
        ("controller: {switch_s: 2}", ["controller.switch_s: split in two: controller.predictive.switch_s"]),
        ("controller: {merge_persist_windows: 2}", ["controller.merge_persist_windows: now "
                                                    "controller.predictive.merge_persist_s"]),
        ("controller: {max_concurrent_ops: 2}", ["controller.max_concurrent_ops: removed: a constant"]),
        ("controller: {merge_patient_margin: 0.01}", ["controller.merge_patient_margin: removed"]),
    ],
)  # fmt: skip
def test_a_former_flat_controller_key_names_where_it_went(tmp_path: Path, text: str, lines: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, text))
    msg = str(err.value)
    for line in lines:
        assert f"\n  {line}" in msg
    assert "unknown key" not in msg and "Extra inputs" not in msg


def test_every_former_flat_key_but_the_shared_three_names_where_it_went() -> None:
    # the former section had 36 keys: enabled, policy and window_s stay, the other 33 moved, changed or went
    assert len(RENAMED) == 33 and not set(RENAMED) & set(ControllerConfig.model_fields)


def test_a_config_may_carry_the_other_policys_section_for_a_policy_override(tmp_path: Path) -> None:
    # The evaluation's controller ablation runs the rule controller on a predictive config (controller.policy
    # overridden): the rule band stands beside policy predictive, is not read there, and validate notes it.
    cfg = load_config(REPO / "configs" / "sim-40gpu.yaml")
    assert cfg.controller.policy == "predictive" and cfg.controller.rules.theta_up == 0.775
    notes = unread_settings(cfg)
    assert notes and all("read only by controller.policy rules" in n for n in notes)
    assert not any("long_threshold_tokens" in n for n in notes)  # the evaluation's long class too
    assert unread_settings(load_config(REPO / "configs" / "sim-40gpu-rules.yaml")) == []
    cfg = load_config(_write(tmp_path, "controller: {policy: rules, predictive: {split_margin: 0.1}}"))
    assert unread_settings(cfg) == [
        "controller.predictive.split_margin: read only by controller.policy predictive (this is rules)"
    ]


def test_example_configs_set_only_what_their_policy_reads() -> None:
    for name in ("local.yaml", "h200x8-example.yaml", "h200-vllm-pcp-example.yaml", "test-serve.yaml"):
        cfg = load_config(REPO / "configs" / name)
        assert cfg.controller.policy == "predictive" and unread_settings(cfg) == [], name
    assert load_config(REPO / "configs" / "local.yaml").controller.window_s == 5.0


def test_describe_config_nests_the_policy_sections_and_loads_back(tmp_path: Path) -> None:
    cfg = load_config(REPO / "configs" / "sim-40gpu.yaml")
    text = describe_config(cfg)
    assert "\ncontroller:\n" in text and "\n  rules:\n    # " in text and "\n  predictive:\n    # " in text
    assert "    theta_up: 0.775\n" in text
    assert load_config(_write(tmp_path, text)) == cfg
