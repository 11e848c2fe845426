"""Tune the queue_aware replication policy on the cache ablation's TUNING set (never the test set).

Runs ``norepl`` once per point and ``queue_aware`` once per value of one ``cache.*`` key, then prints, per value,
the issue's verdict per (workload, KV size, mode): ΔP90 at the highest load where ``norepl`` meets the SLO, the
worst ΔP90 over all loads, and the pass count. Example::

    .venv/bin/python -m vertumnus.bench.cache_tune --key cache.copy_gain_s --values 0.02,0.05,0.1 --jobs 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, replace
from typing import Any

from vertumnus.eval.cache_eval import (
    METRICS,
    CacheEvalResult,
    CacheTask,
    _context,
    _requests,
    run_config,
    verdicts,
)
from vertumnus.eval.cache_report import CONFIG, TUNING_SET
from vertumnus.sim.runner import run_policy


def _run(task: CacheTask, key: str | None, value: float | None) -> dict[str, Any]:
    es, cfg, cost = _context(task.set_path, task.config)
    gen = _requests(task.set_path, task.config, task.workload, task.load, task.replicate)
    run_cfg = run_config(es, cfg, task)
    if key is not None and task.policy != "norepl":
        section, name = key.split(".", 1)
        sub = getattr(run_cfg, section)
        setattr(sub, name, type(getattr(sub, name))(value))
    s = run_policy(gen.requests, run_cfg, cost, "vertumnus").summary
    return {k: s.get(k) for k in METRICS}


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
    es, cfg, cost = _context(a.set, a.config)
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
    with ProcessPoolExecutor(max_workers=max(1, a.jobs)) as ex:
        futs = {ex.submit(_run, t, k, v): (t, v) for (t, k, v) in jobs}
        for f in as_completed(futs):
            out[futs[f]] = f.result()
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
            at = "n/a" if x.p90_at_slo_load is None else f"{100 * x.p90_at_slo_load:+.1f}%"
            print(
                f"  {x.workload:15s} {x.gpu:11s} {x.mode:10s} top {x.slo_load}  dP90 {at:>7s}  "
                f"worst {100 * x.worst_p90:+.1f}%  lost {x.lost}  {'pass' if x.passed else 'FAIL'}"
            )
    print(f"({len(jobs)} runs, {time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
