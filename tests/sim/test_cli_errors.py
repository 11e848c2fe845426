"""Bad paths and values on the command line, run as a user would (the ``vertumnus`` console script in a
subprocess): a non-zero exit, one clear line naming the problem, never a traceback. Also `config validate` on
the files a config names and `config show` with every key's description."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from vertumnus.config import REPO_ROOT, VertumnusConfig, load_config

EXCERPT = Path(__file__).resolve().parents[1] / "data" / "conversation_excerpt.jsonl"
CLI = Path(sys.executable).parent / "vertumnus"
PROFILE = "configs/profiles/tiny-cpu.yaml"


def vertumnus(*args: str, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CLI), *args], capture_output=True, text=True, cwd=cwd, timeout=600)


def one_line_error(r: subprocess.CompletedProcess[str]) -> str:
    """The single message line of a failed command (asserting exit 2, one line, no traceback)."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stdout + r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


@pytest.fixture
def a_dir(tmp_path: Path) -> Path:
    d = tmp_path / "configs"
    d.mkdir()
    return d


@pytest.mark.parametrize(
    "command",
    [
        ("config", "show"),
        ("config", "validate"),
        ("simulate", "--trace", str(EXCERPT)),
        ("compare", "--trace", str(EXCERPT)),
        ("evaluate",),
        ("audit",),
        ("profile", "--engine", "sim", "--out", "p.yaml"),
        ("serve",),
        ("demo",),
        ("bench", "sim"),
    ],
    ids=lambda c: " ".join(c[:2]) if c[0] in ("config", "bench") else c[0],
)
def test_a_directory_as_config(tmp_path: Path, a_dir: Path, command: tuple[str, ...]) -> None:
    r = vertumnus(*command, "--config", str(a_dir), cwd=tmp_path)
    msg = one_line_error(r)
    assert f"config {a_dir} is a directory" in msg


def test_profile_show_of_a_directory_or_missing_file(tmp_path: Path, a_dir: Path) -> None:
    assert f"--show {a_dir} is a directory" in one_line_error(vertumnus("profile", "--show", str(a_dir)))
    missing = tmp_path / "nope.yaml"
    assert f"cost profile not found: {missing}" in one_line_error(vertumnus("profile", "--show", str(missing)))
    assert vertumnus("profile", "--show", PROFILE).returncode == 0


def test_profile_out_a_directory(a_dir: Path) -> None:
    msg = one_line_error(vertumnus("profile", "--engine", "sim", "--out", str(a_dir)))
    assert f"--out {a_dir} is a directory" in msg


@pytest.mark.parametrize("port", ["99999", "-1"])
def test_serve_port_out_of_range(port: str) -> None:
    r = vertumnus("serve", "--port", port)  # refused before Ray starts
    assert r.returncode == 2
    assert "Invalid value for '--port'" in r.stderr
    assert "Traceback" not in r.stdout + r.stderr


@pytest.mark.parametrize("command", ["simulate", "compare", "evaluate"])
def test_out_an_existing_file_is_refused_before_any_work(tmp_path: Path, command: str) -> None:
    f = tmp_path / "results.txt"
    f.write_text("keep me\n")
    args = ["--trace", str(EXCERPT), "--slice", "0:20"] if command != "evaluate" else []
    msg = one_line_error(vertumnus(command, *args, "--out", str(f)))
    assert f"--out {f} is an existing file" in msg
    assert f.read_text() == "keep me\n"  # never overwritten
    msg = one_line_error(vertumnus(command, *args, "--out", str(f / "run")))
    assert f"{f} is a file, not a directory" in msg


def test_out_an_existing_directory_is_reused(tmp_path: Path) -> None:
    out = tmp_path / "run"
    for _ in range(2):  # the second run overwrites the first one's outputs (as --help says)
        r = vertumnus("simulate", "--trace", str(EXCERPT), "--slice", "0:20", "--policy", "least-work",
                      "--composition", "10xCP4", "--out", str(out))  # fmt: skip
        assert r.returncode == 0, r.stderr
    assert json.loads((out / "summary.json").read_text())["policy"] == "least-work"
    assert "overwritten" in vertumnus("simulate", "--help").stdout


def _config(tmp_path: Path, profile: str) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump({"cost_model": {"profile": profile}}))
    return p


def test_config_validate_names_a_missing_profile(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "configs/profiles/no-such-profile.yaml")
    r = vertumnus("config", "validate", "--config", str(cfg))
    assert r.returncode == 2 and "Traceback" not in r.stdout + r.stderr
    assert "cost_model.profile: file not found: configs/profiles/no-such-profile.yaml" in r.stderr
    assert "ok" not in r.stdout
    absent = tmp_path / "gone.yaml"
    r = vertumnus("config", "validate", "--config", str(_config(tmp_path, str(absent))))
    assert r.returncode == 2 and f"cost_model.profile: file not found: {absent}" in r.stderr
    r = vertumnus("config", "validate", "--config", str(_config(tmp_path, str(tmp_path))))
    assert r.returncode == 2 and f"cost_model.profile: {tmp_path} is a directory" in r.stderr
    bad = tmp_path / "bad-profile.yaml"
    bad.write_text("degrees: {}\n")
    r = vertumnus("config", "validate", "--config", str(_config(tmp_path, str(bad))))
    assert r.returncode == 2 and "non-empty 'degrees' section" in r.stderr


def test_config_validate_resolves_relative_profiles_like_the_loaders(tmp_path: Path) -> None:
    """CWD first, then the repository root (VertumnusConfig.resolve_path, used by simulate and serve)."""
    cfg = _config(tmp_path, PROFILE)  # not under tmp_path: found in the repo root
    r = vertumnus("config", "validate", "--config", str(cfg), cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip().endswith(": ok"), r.stderr
    (tmp_path / "mine.yaml").write_text((REPO_ROOT / PROFILE).read_text())
    cfg = _config(tmp_path, "mine.yaml")  # only in the CWD
    assert vertumnus("config", "validate", "--config", str(cfg), cwd=tmp_path).returncode == 0
    assert vertumnus("config", "validate", "--config", str(cfg), cwd=REPO_ROOT).returncode == 2


def _fields(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str | None]]:
    out = []
    for name, info in model.model_fields.items():
        out.append((prefix + name, info.description))
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += _fields(ann, f"{prefix}{name}.")
    return out


def test_every_config_key_has_a_description() -> None:
    missing = [key for key, desc in _fields(VertumnusConfig) if not desc]
    assert missing == []


def test_config_show_prints_every_description_and_loads_back() -> None:
    r = vertumnus("config", "show", "--config", "configs/sim-40gpu.yaml")
    assert r.returncode == 0, r.stderr
    text = r.stdout
    for key, desc in _fields(VertumnusConfig):
        assert desc is not None
        first = desc.split()[0]
        assert f"# {first}" in text, key
    assert "# Tokens per trie node (cache block)." in text  # cache.block_tokens, its own line above the key
    assert "    theta_up: 0.775" in text and "[default: 0.8]" in text  # a changed value notes the default
    cfg = load_config("configs/sim-40gpu.yaml")
    assert yaml.safe_load(text) == cfg.model_dump(mode="json")  # comments only: still the config
    plain = vertumnus("config", "show", "--config", "configs/sim-40gpu.yaml", "--values-only")
    assert plain.returncode == 0 and "#" not in plain.stdout
    assert yaml.safe_load(plain.stdout) == cfg.model_dump(mode="json")
    js = vertumnus("config", "show", "--config", "configs/sim-40gpu.yaml", "--json")
    assert js.returncode == 0 and json.loads(js.stdout) == cfg.model_dump(mode="json")
