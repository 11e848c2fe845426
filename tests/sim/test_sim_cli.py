"""The simulate / compare / bench sim commands: outputs written, bad input -> message and exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_runner import Cli

EXCERPT = Path(__file__).resolve().parents[1] / "data" / "conversation_excerpt.jsonl"


def test_simulate_writes_summary_csv_and_plots(cli: Cli, tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = cli("simulate", "--trace", str(EXCERPT), "--policy", "least-work", "--composition", "6xCP4+2xCP8",
            "--slice", "0:60", "--out", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    for key in ("policy", "requests", "completed", "mean_ttft_s", "p50_ttft_s", "p90_ttft_s", "p99_ttft_s",
                "slo_attainment_token_weighted", "slo_attainment", "prefix_hit_rate_tokens", "reconfigurations",
                "replications", "reclamations", "sim_wall_s"):  # fmt: skip
        assert key in s, key
    assert s["policy"] == "least-work" and s["initial_composition"] == "6xCP4+2xCP8"
    assert s["requests"] == s["completed"] > 0
    rows = (out / "requests.csv").read_text().splitlines()
    assert rows[0].startswith("request_id,arrival_s,input_tokens,slo_s,worker,degree,cached_tokens")
    assert len(rows) == s["requests"] + 1
    for png in ("ttft_cdf.png", "ttft_per_minute.png", "prefix_hit_rate.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


def test_compare_prints_table_and_writes_markdown(cli: Cli, tmp_path: Path) -> None:
    r = cli("compare", "--trace", str(EXCERPT), "--slice", "0:40", "--policies", "round-robin,dynamo-kv,lower-bound",
            "--composition", "10xCP4", "--out", str(tmp_path))  # fmt: skip
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "compare.md").read_text()
    assert "| round-robin |" in md and "| dynamo-kv |" in md and "| lower-bound |" in md
    assert "round-robin" in r.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--trace", "no/such/trace.jsonl"), "trace file not found"),
        (("--trace", str(EXCERPT), "--composition", "3xCP4"), "uses 12 GPUs"),
        (("--trace", str(EXCERPT), "--composition", "4xCP3+1xCP8"), "degree(s) [3]"),
        (("--trace", str(EXCERPT), "--composition", "lots"), "bad composition term"),
        (("--trace", str(EXCERPT), "--policy", "fastest"), "unknown policy 'fastest'"),
        (("--trace", str(EXCERPT), "--slice", "9:3"), "bad --slice"),
        ((), "exactly one of --trace"),
        (("--workload", "phases:10@oops"), "bad phase"),
    ],
)
def test_bad_input_is_a_clear_error(cli: Cli, tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    r = cli("simulate", *args, "--out", str(tmp_path / "x"))
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_strict_rejects_bad_line_and_lenient_skips_it(cli: Cli, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    lines = EXCERPT.read_text().splitlines()[:20]
    lines.insert(3, '{"timestamp": "soon"}')
    bad.write_text("\n".join(lines) + "\n")
    r = cli("simulate", "--trace", str(bad), "--strict", "--out", str(tmp_path / "s"))
    assert r.returncode == 2 and "line 4" in r.stderr
    r = cli("simulate", "--trace", str(bad), "--policy", "round-robin", "--composition", "10xCP4",
            "--out", str(tmp_path / "l"))  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "skipped malformed trace line 4" in r.stderr
    assert json.loads((tmp_path / "l" / "summary.json").read_text())["requests"] == 20
