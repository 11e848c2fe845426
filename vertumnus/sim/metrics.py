"""Per-request records and run summaries, collected as a pool listener.

TTFT_i = completion − arrival + T_ext (``slo.t_ext_s``). Attainment counts every request of the workload in its
denominator: a rejected or unfinished request is an SLO miss. TTFT percentiles are over completed requests.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vertumnus.types import CacheOp, CacheOpKind, Placement, PrefillResult, ReconfigKind, ReconfigPlan, Request


@dataclass(slots=True)
class RequestRecord:
    """One request's fate (``worker`` −1 and ``ttft_s`` NaN when it never completed)."""

    request_id: str
    arrival_s: float
    input_len: int
    slo_s: float
    worker: int = -1
    degree: int = 0
    cached_tokens: int = 0
    finished_s: float = float("nan")
    ttft_s: float = float("nan")
    status: str = "pending"  # pending | done | rejected | failed


@dataclass(slots=True)
class ReconfigRecord:
    time_s: float
    kind: str
    sources: tuple[int, ...]
    targets: tuple[int, ...]
    drain_s: float
    switch_s: float


@dataclass(slots=True)
class Collector:
    """PoolListener that records requests, reconfigurations and cache operations."""

    t_ext_s: float
    clock: Any  # () -> float
    records: dict[str, RequestRecord] = field(default_factory=dict)
    reconfigs: list[ReconfigRecord] = field(default_factory=list)
    composition: list[tuple[float, dict[int, int]]] = field(default_factory=list)  # (time, degree -> count)
    degrees: dict[int, int] = field(default_factory=dict)  # live worker id -> degree
    replications: int = 0
    reclamations: int = 0
    reconciles: int = 0
    failed_ops: int = 0
    remaining: int = 0  # requests neither done nor rejected

    def expect(self, requests: list[Request]) -> None:
        """Register the workload (before the run)."""
        for r in requests:
            self.records[r.request_id] = RequestRecord(r.request_id, r.arrival_s, r.input_len, r.slo_s)
        self.remaining = len(requests)

    def set_workers(self, degrees: dict[int, int], now: float) -> None:
        """Initial composition (worker id -> degree)."""
        self.degrees = dict(degrees)
        self._mark(now)

    def _mark(self, now: float) -> None:
        counts: dict[int, int] = {}
        for c in self.degrees.values():
            counts[c] = counts.get(c, 0) + 1
        self.composition.append((now, counts))

    def rejected(self, request: Request) -> None:
        rec = self.records[request.request_id]
        if rec.status == "pending":
            rec.status = "rejected"
            self.remaining -= 1

    # -- PoolListener -------------------------------------------------------------------------------------
    def request_done(self, request: Request, placement: Placement | None, result: PrefillResult | None) -> None:
        rec = self.records.get(request.request_id)
        if rec is None or rec.status != "pending":
            return
        self.remaining -= 1
        if result is None or not result.ok:
            rec.status = "failed"
            return
        rec.status = "done"
        rec.worker = result.worker_id
        rec.degree = placement.degree if placement is not None else self.degrees.get(result.worker_id, 0)
        rec.cached_tokens = result.cached_tokens
        rec.finished_s = result.finished_s
        rec.ttft_s = result.finished_s - request.arrival_s + self.t_ext_s

    def reconfig_done(self, plan: ReconfigPlan, drain_s: float, switch_s: float) -> None:
        now = float(self.clock())
        for g in plan.sources:
            self.degrees.pop(g.worker_id, None)
        for g in plan.targets:
            self.degrees[g.worker_id] = g.degree
        kind = "split" if plan.kind == ReconfigKind.SPLIT else "merge"
        self.reconfigs.append(
            ReconfigRecord(
                now, kind, tuple(g.worker_id for g in plan.sources), tuple(g.worker_id for g in plan.targets),
                drain_s, switch_s,
            )
        )  # fmt: skip
        self._mark(now)

    def cache_op_done(self, op: CacheOp, ok: bool) -> None:
        if not ok:
            self.failed_ops += 1
        elif op.kind == CacheOpKind.REPLICATE:
            self.replications += 1
        elif op.kind == CacheOpKind.RECLAIM:
            self.reclamations += 1
        else:
            self.reconciles += 1

    # -- outputs ------------------------------------------------------------------------------------------
    def arrays(self) -> dict[str, np.ndarray]:
        """Column arrays over all requests in arrival order."""
        recs = sorted(self.records.values(), key=lambda r: (r.arrival_s, r.request_id))
        return {
            "arrival": np.array([r.arrival_s for r in recs]),
            "input_len": np.array([r.input_len for r in recs], dtype=np.int64),
            "slo": np.array([r.slo_s for r in recs]),
            "cached": np.array([r.cached_tokens for r in recs], dtype=np.int64),
            "ttft": np.array([r.ttft_s for r in recs]),
            "degree": np.array([r.degree for r in recs], dtype=np.int64),
        }

    def write_csv(self, path: Path) -> None:
        """requests.csv: one row a request."""
        recs = sorted(self.records.values(), key=lambda r: (r.arrival_s, r.request_id))
        with path.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(
                [
                    "request_id",
                    "arrival_s",
                    "input_tokens",
                    "slo_s",
                    "worker",
                    "degree",
                    "cached_tokens",
                    "finished_s",
                    "ttft_s",
                    "status",
                ]
            )
            for r in recs:
                w.writerow(
                    [
                        r.request_id,
                        f"{r.arrival_s:.6f}",
                        r.input_len,
                        f"{r.slo_s:.4f}",
                        r.worker,
                        r.degree,
                        r.cached_tokens,
                        f"{r.finished_s:.6f}",
                        f"{r.ttft_s:.6f}",
                        r.status,
                    ]
                )


def summarize(arr: dict[str, np.ndarray]) -> dict[str, Any]:
    """TTFT statistics, SLO attainment (token-weighted and plain) and token prefix hit rate."""
    ttft, L, slo = arr["ttft"], arr["input_len"], arr["slo"]
    n = len(ttft)
    done = ~np.isnan(ttft)
    met = done & (np.nan_to_num(ttft, nan=np.inf) <= slo)
    t = ttft[done]

    def pct(q: float) -> float | None:
        return float(np.percentile(t, q)) if len(t) else None

    total_tokens = float(L.sum())
    return {
        "requests": int(n),
        "completed": int(done.sum()),
        "mean_ttft_s": float(t.mean()) if len(t) else None,
        "p50_ttft_s": pct(50),
        "p90_ttft_s": pct(90),
        "p99_ttft_s": pct(99),
        "max_ttft_s": float(t.max()) if len(t) else None,
        "slo_attainment_token_weighted": float(L[met].sum() / total_tokens) if total_tokens else None,
        "slo_attainment": float(met.mean()) if n else None,
        "prefix_hit_rate_tokens": float(arr["cached"][done].sum() / L[done].sum()) if done.any() else None,
    }


def per_interval(arr: dict[str, np.ndarray], width_s: float) -> dict[str, np.ndarray]:
    """Mean TTFT, token hit rate and request count per ``width_s`` interval of arrival time.

    Intervals with arrivals, in order; a run of empty intervals is one row (NaN means, count 0) starting where
    the gap starts, so a step plot draws the same gaps and a trace with a days-long idle gap costs no memory.
    """
    arrival, ttft = arr["arrival"], arr["ttft"]
    if not len(arrival):
        z = np.zeros(0)
        return {"start": z, "mean_ttft": z, "hit_rate": z, "count": z}
    bins = (arrival // width_s).astype(np.int64)
    occupied = np.unique(bins)
    rows = np.union1d(occupied, occupied[:-1] + 1)  # each occupied interval, plus the start of the gap after it
    idx = np.searchsorted(rows, bins)
    nb = len(rows)
    done = ~np.isnan(ttft)
    cnt = np.bincount(idx[done], minlength=nb).astype(np.float64)
    s_ttft = np.bincount(idx[done], weights=ttft[done], minlength=nb)
    s_hit = np.bincount(idx[done], weights=arr["cached"][done], minlength=nb)
    s_len = np.bincount(idx[done], weights=arr["input_len"][done], minlength=nb)
    with np.errstate(invalid="ignore", divide="ignore"):
        return {
            "start": rows * width_s,
            "mean_ttft": np.where(cnt > 0, s_ttft / np.maximum(cnt, 1), np.nan),
            "hit_rate": np.where(s_len > 0, s_hit / np.maximum(s_len, 1), np.nan),
            "count": cnt,
        }
