"""A trace with an idle gap of years (one timestamp of 1e12 ms) simulates in seconds with the results of walking
the gap window by window: the simulator jumps idle timer ticks once the pool is at a fixed point
(``Simulation._idle_tick``); timestamps beyond the float clock's range are refused with a clear error."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

import vertumnus.controller.controller as controller_module
from vertumnus.sim.inputs import load_cost, load_sim_config, load_workload_requests
from vertumnus.sim.runner import RunResult, Simulation

EXCERPT = Path(__file__).resolve().parents[1] / "data" / "conversation_excerpt.jsonl"
CLI = Path(sys.executable).parent / "vertumnus"
HANG_GUARD_S = 900  # bounds a hang (the walk through 1e9 s never ends); not a speed assertion


def gap_trace(path: Path, gap_ms: float, head: int = 150, tail_every: int = 0) -> Path:
    """The excerpt with its lines from ``head`` on moved ``gap_ms`` later (``tail_every``: also every later
    line of that index, a second gap of the same length, so the pool idles twice)."""
    lines = []
    for i, text in enumerate(EXCERPT.read_text().splitlines()):
        rec = json.loads(text)
        if i >= head:
            rec["timestamp"] += gap_ms
        if tail_every and i >= tail_every:
            rec["timestamp"] += gap_ms
        lines.append(json.dumps(rec))
    path.write_text("\n".join(lines) + "\n")
    return path


def _fates(r: RunResult) -> list[tuple[object, ...]]:
    return sorted(
        (k, v.status, v.ttft_s, v.finished_s, v.worker, v.degree, v.cached_tokens)
        for k, v in r.collector.records.items()
    )


@pytest.mark.parametrize(
    ("policy", "composition", "controller", "cache", "startup_span_s"),
    [
        ("vertumnus", None, "rules", "queue_aware", None),
        ("vertumnus", None, "rules", "rules", None),  # the paper's scan (the cache default before queue_aware)
        ("vertumnus", "6xCP4+2xCP8", "rules", "queue_aware", None),  # merges during the gap
        ("vertumnus", "6xCP4+2xCP8", "predictive", "queue_aware", None),
        # start-up split checks (every 0.3 s: a grid off the 1-s one) that last through the first gap and end
        # inside the second (at 5000 s; the gaps run ~54-3054 s and ~3087-6087 s after the first arrival)
        ("vertumnus", "6xCP4+2xCP8", "predictive", "queue_aware", 5000.0),
        ("vertumnus-norepl", "10xCP4", "rules", "queue_aware", None),
        ("least-work", "10xCP4", "rules", "queue_aware", None),  # controller off: only cache scans to jump
    ],
)
def test_jumping_an_idle_gap_gives_the_walks_results(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    policy: str,
    composition: str | None,
    controller: str,
    cache: str,
    startup_span_s: float | None,
) -> None:
    trace = gap_trace(tmp_path / "gap.jsonl", 3.0e6, tail_every=250)  # two 3000-s gaps: 600 windows each
    cfg = load_sim_config(None)
    cfg.controller.policy = controller  # type: ignore[assignment]
    cfg.cache.policy = cache  # type: ignore[assignment]
    if startup_span_s is not None:  # the start-up's constants (not config keys)
        monkeypatch.setattr(controller_module, "_STARTUP_SPAN_S", startup_span_s)
        monkeypatch.setattr(controller_module, "_STARTUP_CHECK_INTERVAL_S", 0.3)
    cost = load_cost(cfg)
    wl = load_workload_requests(cfg, str(trace))
    jumped = Simulation(wl.requests, cfg, cost, policy, composition)
    r_jump = jumped.run()
    assert jumped.idle_windows_skipped > 0 or not jumped.cfg.controller.enabled
    monkeypatch.setattr(Simulation, "_idle_tick", lambda self: None)  # the walk: every tick of the gap runs
    walked = Simulation(wl.requests, cfg, cost, policy, composition)
    r_walk = walked.run()
    assert walked.idle_windows_skipped == 0
    assert r_jump.summary["events"] < r_walk.summary["events"]
    assert _fates(r_jump) == _fates(r_walk)
    assert [(x.time_s, x.kind, x.sources, x.targets) for x in r_jump.reconfigs] == [
        (x.time_s, x.kind, x.sources, x.targets) for x in r_walk.reconfigs
    ]
    for key in ("replications", "reclamations", "completed", "mean_ttft_s", "final_composition"):
        assert r_jump.summary[key] == r_walk.summary[key], key
    # the timers' grids are the walk's too (up to float rounding: the jump multiplies what the walk adds)
    cj, cw = jumped.pool.controller, walked.pool.controller
    assert cj.next_window_end == pytest.approx(cw.next_window_end, abs=1e-6)
    assert cj.next_check == pytest.approx(cw.next_check, abs=1e-6)


def _requests_csv(out: Path) -> dict[str, dict[str, str]]:
    with (out / "requests.csv").open() as f:
        return {row["request_id"]: row for row in csv.DictReader(f)}


def test_simulate_a_trace_with_a_timestamp_of_1e12_ms(tmp_path: Path) -> None:
    """One arrival 1e9 s (~32 years) after the rest: the CLI finishes, every request completes, and the late
    request fares exactly as after a gap of 3000 s (the pool reaches the same idle state either way)."""
    runs = {}
    for name, gap_ms in (("huge", 1e12), ("short", 3.0e6)):
        trace = gap_trace(tmp_path / f"{name}.jsonl", gap_ms, head=299)
        out = tmp_path / name
        r = subprocess.run(
            [str(CLI), "simulate", "--trace", str(trace), "--out", str(out), "--no-progress"],
            capture_output=True, text=True, timeout=HANG_GUARD_S,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert "Traceback" not in r.stderr + r.stdout
        s = json.loads((out / "summary.json").read_text())
        assert s["requests"] == s["completed"] == 300
        runs[name] = (s, _requests_csv(out))
    (huge, huge_rows), (short, short_rows) = runs["huge"], runs["short"]
    assert huge["sim_time_s"] > 1e9
    last_h, last_s = huge_rows["t300"], short_rows["t300"]
    assert float(last_h["arrival_s"]) - float(last_s["arrival_s"]) == pytest.approx(1e9 - 3000.0)
    for col in ("worker", "degree", "cached_tokens", "ttft_s", "status"):
        assert last_h[col] == last_s[col] or float(last_h[col]) == pytest.approx(float(last_s[col]), abs=1e-6), col
    del huge_rows["t300"], short_rows["t300"]
    assert huge_rows == short_rows  # everything before the gap is the same run
    assert huge["final_composition"] == short["final_composition"]


def test_timestamp_beyond_the_clock_range_is_a_clear_error(tmp_path: Path) -> None:
    trace = gap_trace(tmp_path / "ns.jsonl", 1e16, head=299)  # e.g. nanoseconds given as ms
    r = subprocess.run(
        [str(CLI), "simulate", "--trace", str(trace), "--out", str(tmp_path / "x")],
        capture_output=True, text=True, timeout=HANG_GUARD_S,
    )  # fmt: skip
    assert r.returncode == 2
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, r.stderr
    assert "trace line 300" in lines[0] and "timestamps are milliseconds" in lines[0]
    assert "Traceback" not in r.stderr + r.stdout
    assert not (tmp_path / "x").exists()
