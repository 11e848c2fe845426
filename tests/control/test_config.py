"""Config validation: every invalid value fails at load time naming its key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from vertumnus.config import (
    ConfigError,
    dump_config,
    format_composition,
    load_config,
    parse_composition,
)

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
        ("controller: {theta_low: 0.9, theta_up: 0.8}", "controller", "theta_low (0.9) must be below theta_up"),
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
