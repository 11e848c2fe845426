"""Mooncake-format JSONL traces -> :class:`~vertumnus.types.Request` lists.

One request a line: ``timestamp`` (ms from trace start), ``input_length``, ``output_length`` (tokens) and
``hash_ids`` (one id per 512-token block; equal ids at equal positions = reusable prefix blocks). Malformed lines
are collected as :class:`ParseIssue` (line number + reason) and skipped, or raise :class:`TraceError` in strict
mode; reading never crashes on bad input.

Only *full* 512-token blocks get block keys (a partial last block is never a reusable cache block), chained with
:func:`~vertumnus.cache.block_keys.keys_from_hash_ids`, once per request at load time.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from vertumnus.cache.block_keys import keys_from_hash_ids
from vertumnus.config import VertumnusConfig
from vertumnus.types import Request

TRACE_BLOCK_TOKENS = 512  # Mooncake hash ids cover 512-token blocks
# Longest simulated span: at 2**32 s (~136 years) a float64 clock still resolves ~1 µs, so TTFTs and the window
# grid stay exact; beyond it a timestamp is a unit mistake (µs or ns given as ms), not a workload.
MAX_SPAN_S = float(2**32)


class TraceError(ValueError):
    """A trace cannot be used (missing file, strict-mode parse error, empty after filtering)."""


@dataclass(slots=True, frozen=True)
class TraceRecord:
    """One parsed trace line (times in seconds)."""

    line: int
    timestamp_s: float
    input_len: int
    output_len: int
    hash_ids: tuple[int, ...]


@dataclass(slots=True, frozen=True)
class ParseIssue:
    """A malformed line: 1-based line number and what is wrong with it."""

    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


def _int_field(obj: dict[str, object], name: str, minimum: int) -> int:
    v = obj.get(name)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or int(v) != v:
        raise ValueError(f"{name!r} must be an integer, got {v!r}")
    if v < minimum:
        raise ValueError(f"{name!r} must be ≥ {minimum}, got {v!r}")
    return int(v)


def parse_line(text: str, line: int) -> TraceRecord:
    """Parse one JSONL line; raises ValueError with the reason on malformed input."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise ValueError("expected a JSON object")
    ts = obj.get("timestamp")
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) or ts < 0:
        raise ValueError(f"'timestamp' must be a non-negative number of ms, got {ts!r}")
    input_len = _int_field(obj, "input_length", 1)
    output_len = _int_field(obj, "output_length", 0) if "output_length" in obj else 1
    hids = obj.get("hash_ids", [])
    if not isinstance(hids, list) or any(isinstance(h, bool) or not isinstance(h, int) for h in hids):
        raise ValueError("'hash_ids' must be a list of integers")
    return TraceRecord(line, float(ts) / 1000.0, input_len, output_len, tuple(hids))


def parse_lines(lines: Iterable[str], strict: bool = False) -> tuple[list[TraceRecord], list[ParseIssue]]:
    """Parse JSONL text lines (blank lines are ignored). Records come back sorted by time (stable)."""
    records: list[TraceRecord] = []
    issues: list[ParseIssue] = []
    for no, raw in enumerate(lines, start=1):
        text = raw.strip()
        if not text:
            continue
        try:
            records.append(parse_line(text, no))
        except ValueError as e:
            issue = ParseIssue(no, str(e))
            if strict:
                raise TraceError(f"malformed trace {issue} (--strict)") from None
            issues.append(issue)
    records.sort(key=lambda r: r.timestamp_s)  # stable: equal timestamps keep file order
    return records, issues


def read_trace(path: str | Path, strict: bool = False) -> tuple[list[TraceRecord], list[ParseIssue]]:
    """Read a Mooncake JSONL trace file."""
    p = Path(path)
    if not p.is_file():
        raise TraceError(f"trace file not found: {p}")
    with p.open(encoding="utf-8", errors="replace") as f:
        try:
            return parse_lines(f, strict=strict)
        except TraceError as e:
            raise TraceError(f"{p}: {e}") from None


def parse_slice(text: str) -> tuple[float, float]:
    """``"START:END"`` in seconds (either side may be empty) -> (start, end)."""
    parts = text.split(":")
    if len(parts) != 2:
        raise ValueError(f"bad --slice {text!r}; expected START:END in seconds, e.g. 60:360")
    try:
        start = float(parts[0]) if parts[0].strip() else 0.0
        end = float(parts[1]) if parts[1].strip() else math.inf
    except ValueError:
        raise ValueError(f"bad --slice {text!r}; expected START:END in seconds, e.g. 60:360") from None
    if start < 0 or end <= start:
        raise ValueError(f"bad --slice {text!r}: need 0 ≤ START < END")
    return start, end


def time_scale(records: Sequence[TraceRecord], rate_scale: float | None, target_rps: float | None) -> float:
    """The factor arrival times are *divided* by: ``rate_scale`` itself, or the one reaching ``target_rps``."""
    if rate_scale is not None and target_rps is not None:
        raise ValueError("give either --rate-scale or --target-rps, not both")
    if rate_scale is not None:
        if not rate_scale > 0:
            raise ValueError(f"--rate-scale must be > 0, got {rate_scale}")
        return rate_scale
    if target_rps is not None:
        if not target_rps > 0:
            raise ValueError(f"--target-rps must be > 0, got {target_rps}")
        span = records[-1].timestamp_s - records[0].timestamp_s if records else 0.0
        if span <= 0:
            raise ValueError("--target-rps needs a trace spanning a positive duration")
        return target_rps / (len(records) / span)
    return 1.0


def build_requests(
    records: Sequence[TraceRecord],
    cfg: VertumnusConfig,
    rate_scale: float | None = None,
    target_rps: float | None = None,
    slice_s: tuple[float, float] | None = None,
    prefix: str = "t",
    origin_s: float | None = None,
) -> list[Request]:
    """Slice (trace seconds), shift to start at 0, compress time and attach per-request SLOs.

    τ_i = slo.base_s + slo.per_token_s × L_i. Request ids are ``{prefix}{line}`` so results point back at the
    trace line. ``origin_s``: the trace time that becomes 0 (default: the first kept request's), so generated
    workloads keep their phase boundaries.
    """
    if cfg.cache.block_tokens != TRACE_BLOCK_TOKENS:
        raise ValueError(
            f"trace hash ids cover {TRACE_BLOCK_TOKENS}-token blocks; cache.block_tokens is {cfg.cache.block_tokens}"
        )
    recs = list(records)
    if slice_s is not None:
        lo, hi = slice_s
        recs = [r for r in recs if lo <= r.timestamp_s < hi]
    if not recs:
        raise TraceError("no requests left in the trace (empty file or --slice outside the trace)")
    scale = time_scale(recs, rate_scale, target_rps)
    t0 = recs[0].timestamp_s if origin_s is None else origin_s
    base, per_tok = cfg.slo.base_s, cfg.slo.per_token_s
    last = max(recs, key=lambda r: r.timestamp_s)
    span = (last.timestamp_s - t0) / scale
    if span > MAX_SPAN_S:
        raise TraceError(
            f"trace line {last.line}: timestamp {last.timestamp_s * 1000:.6g} ms puts an arrival {span:.3g} s after "
            f"the first, beyond the simulator's {MAX_SPAN_S:.3g} s (~136 years); timestamps are milliseconds"
        )
    out: list[Request] = []
    for r in recs:
        full = r.input_len // TRACE_BLOCK_TOKENS
        out.append(
            Request(
                request_id=f"{prefix}{r.line}",
                arrival_s=(r.timestamp_s - t0) / scale,
                input_len=r.input_len,
                block_keys=keys_from_hash_ids(r.hash_ids[:full]),
                output_len=max(1, r.output_len),
                slo_s=base + per_tok * r.input_len,
            )
        )
    return out
