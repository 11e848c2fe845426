"""One validated configuration tree for every part of Vertumnus, one module per section.

Loaded from YAML (`configs/*.yaml`); unknown keys and invalid values fail at load time with a message that
names the offending key; a key of the former flat ``controller`` section names where it went
(:mod:`vertumnus.config.renamed`). Every field has a default and a description, so `vertumnus config show`
prints a self-documenting resolved config.
"""

from vertumnus.config._base import REPO_ROOT
from vertumnus.config.cache import CacheConfig
from vertumnus.config.controller import ControllerConfig, PredictiveConfig, RulesConfig, whole_windows
from vertumnus.config.io import (
    ConfigError,
    config_from_dict,
    describe_config,
    dump_config,
    load_config,
    missing_files,
    unread_settings,
)
from vertumnus.config.model import DEFAULT_PROFILE, CostModelConfig, ModelConfig, SLOConfig
from vertumnus.config.pool import SIM_SWITCH_S, PoolConfig, format_composition, parse_composition
from vertumnus.config.root import VertumnusConfig
from vertumnus.config.scheduler import SchedulerConfig
from vertumnus.config.serving import ServingConfig
from vertumnus.config.vllm import VllmConfig

__all__ = [
    "DEFAULT_PROFILE",
    "REPO_ROOT",
    "SIM_SWITCH_S",
    "CacheConfig",
    "ConfigError",
    "ControllerConfig",
    "CostModelConfig",
    "ModelConfig",
    "PoolConfig",
    "PredictiveConfig",
    "RulesConfig",
    "SLOConfig",
    "SchedulerConfig",
    "ServingConfig",
    "VertumnusConfig",
    "VllmConfig",
    "config_from_dict",
    "describe_config",
    "dump_config",
    "format_composition",
    "load_config",
    "missing_files",
    "parse_composition",
    "unread_settings",
    "whole_windows",
]
