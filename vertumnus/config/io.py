"""Load, dump and describe a config; every error names its key (pydantic's path, e.g. ``cache.theta_reclaim``)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from vertumnus.config._base import REPO_ROOT, KeyedError
from vertumnus.config.root import VertumnusConfig


class ConfigError(ValueError):
    """Raised when a config file cannot be read or does not validate; the message names the key."""


def _format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"invalid config {source}:"]
    for e in err.errors():
        keyed = e.get("ctx", {}).get("error")
        if isinstance(keyed, KeyedError):
            lines.extend(f"  {key}: {msg}" for key, msg in keyed.items)
            continue
        key = ".".join(str(p) for p in e["loc"]) or "<root>"
        msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
        lines.append(f"  {key}: {msg}")
    return "\n".join(lines)


def config_from_dict(data: dict[str, Any] | None, source: str = "<dict>") -> VertumnusConfig:
    """Validate a mapping into a config, raising :class:`ConfigError` naming the bad key."""
    try:
        return VertumnusConfig.model_validate(data or {})
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err, source)) from None


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> VertumnusConfig:
    """Load a YAML config (None: all defaults), deep-merging optional overrides first."""
    data: dict[str, Any] = {}
    source = "<defaults>"
    if path is not None:
        p = Path(path)
        source = str(p)
        if p.is_dir():
            raise ConfigError(f"config {p} is a directory; give a YAML file (e.g. configs/local.yaml)")
        try:
            raw = yaml.safe_load(p.read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {p}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"config file {p} is not UTF-8 text") from None
        except OSError as e:
            raise ConfigError(f"cannot read config file {p}: {e.strerror or e}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {p} is not valid YAML: {e}") from None
        if raw is not None and not isinstance(raw, dict):
            raise ConfigError(f"config file {p} must hold a mapping at the top level")
        data = raw or {}
    if overrides:
        data = _deep_merge(data, overrides)
    return config_from_dict(data, source)


def _deep_merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def dump_config(cfg: VertumnusConfig) -> str:
    """The resolved config as YAML."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def describe_config(cfg: VertumnusConfig, width: int = 100) -> str:
    """The resolved config as YAML with every field's description (and, where the value is not the default,
    the default) in a comment above it; still valid YAML that loads back to the same config."""
    lines: list[str] = []
    _describe(cfg, 0, width, lines)
    return "\n".join(lines) + "\n"


def _describe(section: BaseModel, depth: int, width: int, out: list[str]) -> None:
    pad = "  " * depth
    values = section.model_dump(mode="json")
    defaults = type(section)().model_dump(mode="json")
    for name, info in type(section).model_fields.items():
        note = info.description or ""
        value = getattr(section, name)
        if isinstance(value, BaseModel):
            out.extend(textwrap.wrap(note, width, initial_indent=f"{pad}# ", subsequent_indent=f"{pad}# "))
            out.append(f"{pad}{name}:")
            _describe(value, depth + 1, width, out)
            continue
        if values[name] != defaults[name]:
            note += f" [default: {_flow(defaults[name])}]"
        out.extend(textwrap.wrap(note, width, initial_indent=f"{pad}# ", subsequent_indent=f"{pad}#   "))
        out.append(f"{pad}{name}: {_flow(values[name])}")


def _flow(value: Any) -> str:
    """A value as one line of YAML (for comments)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    return text.removesuffix("...").strip()


def missing_files(cfg: VertumnusConfig) -> list[str]:
    """Files the config names that do not exist, as ``key: message`` (resolved like :meth:`resolve_path`):
    ``cost_model.profile`` and ``pool.history_trace``. Loading does not check them (``vertumnus profile``
    may be about to write the profile); ``config validate`` does."""
    out = []
    named = {"cost_model.profile": cfg.cost_model.profile, "pool.history_trace": cfg.pool.history_trace}
    for key, value in named.items():
        if not value:
            continue
        path = cfg.resolve_path(value)
        if path.is_file():
            continue
        if path.is_dir():
            out.append(f"{key}: {value} is a directory, not a file")
        elif Path(value).is_absolute():
            out.append(f"{key}: file not found: {value}")
        else:
            out.append(f"{key}: file not found: {value} (looked in the CWD {Path.cwd()} and the repo root {REPO_ROOT})")
    return out


def unread_settings(cfg: VertumnusConfig) -> list[str]:
    """Keys the file sets that the configured controller policy does not read (allowed, for a policy override
    such as the evaluation's controller ablation), as ``key: note``; `config validate` prints them."""
    cc = cfg.controller
    out = []
    for section in ("rules", "predictive"):
        if section != cc.policy:
            # the long class is the evaluation's too, whichever policy runs
            for name in sorted(getattr(cc, section).model_fields_set - {"long_threshold_tokens"}):
                out.append(
                    f"controller.{section}.{name}: read only by controller.policy {section} (this is {cc.policy})"
                )
    return out
