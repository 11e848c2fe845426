"""Mooncake trace parsing: good lines, bad lines with line numbers, --strict, slicing, rate scaling, SLOs."""

from __future__ import annotations

from pathlib import Path

import pytest

from vertumnus.cache.block_keys import keys_from_hash_ids
from vertumnus.config import VertumnusConfig, config_from_dict
from vertumnus.sim.workload import (
    TraceError,
    build_requests,
    parse_lines,
    parse_slice,
    read_trace,
)

EXCERPT = Path(__file__).resolve().parents[1] / "data" / "conversation_excerpt.jsonl"

GOOD = [
    '{"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2, 3]}',
    '{"timestamp": 2000, "input_length": 600, "output_length": 1, "hash_ids": [1, 9]}',
    '{"timestamp": 4000, "input_length": 300, "output_length": 1, "hash_ids": [7]}',
]


def _cfg() -> VertumnusConfig:
    return config_from_dict({"slo": {"base_s": 1.0, "per_token_s": 0.001}})


def test_excerpt_parses_cleanly() -> None:
    records, issues = read_trace(EXCERPT)
    assert issues == []
    assert len(records) == 300
    assert records[0].input_len == 6758 and records[0].hash_ids[:3] == (0, 1, 2)


def test_bad_lines_reported_with_numbers_and_skipped() -> None:
    lines = [
        GOOD[0],
        "not json",
        "",  # blank lines are ignored, not errors
        '{"timestamp": 1000, "input_length": 0, "hash_ids": []}',
        '{"timestamp": -5, "input_length": 10, "hash_ids": []}',
        '{"timestamp": 1000, "input_length": 10, "hash_ids": [1, "x"]}',
        "[1, 2]",
        '{"timestamp": 1000, "input_length": 2.5, "hash_ids": []}',
        GOOD[1],
    ]
    records, issues = parse_lines(lines)
    assert [r.line for r in records] == [1, 9]
    assert [i.line for i in issues] == [2, 4, 5, 6, 7, 8]
    assert "not valid JSON" in issues[0].message
    assert "'input_length' must be ≥ 1" in issues[1].message
    assert "timestamp" in issues[2].message
    assert "hash_ids" in issues[3].message
    assert "JSON object" in issues[4].message
    assert "integer" in issues[5].message
    assert str(issues[0]).startswith("line 2:")


def test_strict_rejects_first_bad_line() -> None:
    with pytest.raises(TraceError, match="line 2: not valid JSON"):
        parse_lines([GOOD[0], "{oops", GOOD[1]], strict=True)


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="trace file not found"):
        read_trace(tmp_path / "nope.jsonl")


def test_requests_keys_slo_and_rate_scale() -> None:
    records, _ = parse_lines(GOOD)
    reqs = build_requests(records, _cfg(), rate_scale=2.0)
    assert [r.arrival_s for r in reqs] == [0.0, 1.0, 2.0]
    # full 512-token blocks only: 1100 tokens -> 2 blocks, 600 -> 1, 300 -> 0
    assert reqs[0].block_keys == keys_from_hash_ids([1, 2])
    assert reqs[1].block_keys == keys_from_hash_ids([1])
    assert reqs[1].block_keys[0] == reqs[0].block_keys[0]  # shared first block
    assert reqs[2].block_keys == ()
    assert reqs[0].slo_s == pytest.approx(1.0 + 0.001 * 1100)
    assert [r.request_id for r in reqs] == ["t1", "t2", "t3"]


def test_target_rps_and_slice() -> None:
    records, _ = parse_lines(GOOD)
    # 3 requests over 4 s = 0.75 rps; target 3 rps -> time divided by 4
    reqs = build_requests(records, _cfg(), target_rps=3.0)
    assert [r.arrival_s for r in reqs] == [0.0, 0.5, 1.0]
    sliced = build_requests(records, _cfg(), slice_s=parse_slice("1:5"))
    assert [(r.request_id, r.arrival_s) for r in sliced] == [("t2", 0.0), ("t3", 2.0)]
    with pytest.raises(ValueError, match="not both"):
        build_requests(records, _cfg(), rate_scale=2.0, target_rps=1.0)
    with pytest.raises(TraceError, match="no requests left"):
        build_requests(records, _cfg(), slice_s=(100.0, 200.0))


@pytest.mark.parametrize("bad", ["5", "a:b", "5:2", "-1:3", "1:2:3"])
def test_bad_slices(bad: str) -> None:
    with pytest.raises(ValueError, match="slice"):
        parse_slice(bad)
    assert parse_slice(":30") == (0.0, 30.0)
