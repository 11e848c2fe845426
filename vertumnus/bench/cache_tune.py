"""Tune the queue_aware replication policy on the cache ablation's TUNING set (never the test set).

Runs ``norepl`` once per point and ``queue_aware`` once per value of one ``cache.*`` key, then prints, per value,
the ablation's verdict per (workload, KV size, mode): ΔP90 at the highest load where ``norepl`` meets the SLO, the
worst ΔP90 over all loads, and the pass count. Example::

    .venv/bin/python -m vertumnus.bench.cache_tune --key cache.copy_gain_s --values 0.02,0.05,0.1 --jobs 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from typing import Any

from vertumnus.eval.cache_eval import (
    CacheEvalResult,
    CacheTask,
    cache_context,
    run_task,
    verdicts,
)
from vertumnus.eval.cache_report import CONFIG, TUNING_SET
from vertumnus.eval.fmt import signed_pct
from vertumnus.eval.parallel import run_parallel


def _run(job: tuple[CacheTask, str | None, float | None]) -> dict[str, Any]:
    task, key, value = job
    return run_task(task, key, value)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", default=TUNING_SET)
    ap.add_argument("--config", default=CONFIG)
    ap.add_argument("--key", default=None, help="a cache.* key to vary (default: the config as it is)")
    ap.add_argument("--values", default="", help="comma-separated values of --key")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--dump", default="", help="also write every run's summary to this JSON file")
    ap.add_argument("--replicates", type=int, default=0, help="request streams per point (default: the set's)")
    a = ap.parse_args(argv)
    if "test" in a.set.rsplit("/", 1)[-1]:
        print("refusing to tune on a test set", file=sys.stderr)
        return 2
    values: list[float | None] = [float(v) for v in a.values.split(",") if v] if a.key else [None]
    es, cfg, cost = cache_context(a.set, a.config)
    reps = range(a.replicates or es.replicates)
    # stream-major (workload, load, replicate) so consecutive runs share _requests' cached stream
    points = [(w.name, gpu, load, mode, k) for w in es.workloads for load in es.loads for k in reps
              for gpu in es.memory.gpus for mode in ("fixed", "controller")]  # fmt: skip
    base = [(CacheTask(a.set, a.config, w, g, x, m, "norepl", k), None, None) for (w, g, x, m, k) in points]
    jobs: list[tuple[CacheTask, str | None, float | None]] = list(base)
    jobs += [(CacheTask(a.set, a.config, w, g, x, m, "queue_aware", k), a.key, v)
             for v in values for (w, g, x, m, k) in points]  # fmt: skip
    out: dict[tuple[CacheTask, float | None], dict[str, Any]] = {}
    t0 = time.time()
    for (t, _, v), r in zip(jobs, run_parallel(jobs, _run, a.jobs), strict=True):
        out[(t, v)] = r
    if a.dump:
        with open(a.dump, "w") as fh:
            json.dump([{"task": asdict(t), "value": v, "summary": r} for (t, v), r in out.items()], fh)
    caps = es.capacities(cfg.cache.bytes_per_block)
    for v in values:
        res = CacheEvalResult(es.name, a.config, cost.profile.source, caps, cfg.cache.bytes_per_block,
                              cfg.slo.target_attainment)  # fmt: skip
        for (t, vv), r in out.items():
            if t.policy == "norepl" or vv == v:
                res.runs[t] = r
                if t.policy != "norepl":  # verdicts() walks every policy; only queue_aware is printed
                    res.runs[replace(t, policy="rules")] = r
        vs = [x for x in verdicts(res, es.loads, [w.name for w in es.workloads]) if x.policy == "queue_aware"]
        print(f"== {a.key or 'as configured'} = {v}: pass {sum(x.passed for x in vs)}/{len(vs)}")
        for x in vs:
            at = signed_pct(x.p90_at_slo_load)
            print(
                f"  {x.workload:15s} {x.gpu:11s} {x.mode:10s} top {x.slo_load}  dP90 {at:>7s}  "
                f"worst {signed_pct(x.worst_p90)}  lost {x.lost}  {'pass' if x.passed else 'FAIL'}"
            )
    print(f"({len(jobs)} runs, {time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
