"""What moving costs: each workload started on its start composition and moved, at once, to its best fixed one.

Issue 16 asks the controller to end a run at or below the best fixed composition in hindsight (≤ 1.00×). A
controller that starts elsewhere must reconfigure to get there: the sources drain, the switch takes
``controller.switch_s``, and the moved workers' caches are re-tiled. This benchmark measures that toll with a
clairvoyant, scripted route — no forecast, no decision: the pool starts on the workload's start composition with
the controller off, and at ``--at`` seconds begins every operation that turns the start composition into the
best fixed one (all of them at once, on disjoint workers, through the epoch protocol as the controller would:
:class:`vertumnus.sim.prescient.PrescientSteer`, whose run at 0 s is ``make results``' *prescient start*), then
stays there. Its whole-run mean TTFT over the best fixed composition's is the ratio that *moving* alone
costs; where it is above 1.00 no controller that has to move can meet the issue's ≤ 1.00× on that workload
without beating the best fixed composition after the move.

Each workload's best fixed composition is found here by running every reachable one (the evaluation's own
``vertumnus-static`` runs, on the same request streams as ``make results``). Nothing is chosen from these
figures: it is a reference, not a tuning run. Usage::

    .venv/bin/python benchmarks/route_floor.py --set configs/eval/test.yaml --config configs/sim-40gpu-aic.yaml \
        --workloads steady-0.3,steady-0.6 --jobs 2
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

from vertumnus.config import parse_composition
from vertumnus.eval.evaluate import _context, _workload, by_workload, fixed_tasks, merge_replicates, plan, run_tasks
from vertumnus.sim.prescient import PrescientSteer
from vertumnus.sim.runner import Simulation


def run_route(set_path: str, config: str, workload: str, replicate: int, target: str, at: float) -> float:
    """Whole-run mean TTFT of the scripted route (start → ``target`` at ``at`` s, then fixed)."""
    es, cfg, cost = _context(set_path, config)
    start = es.start_of(es.workload(workload))
    gen = _workload(set_path, config, workload, replicate)
    goal = parse_composition(target)
    steer = PrescientSteer(goal, at_s=at)
    sim = Simulation(gen.requests, cfg, cost, "vertumnus-static", start, steer=steer)
    res = sim.run()
    assert sim.pool.lattice.composition() == goal, f"route ended on {sim.pool.lattice.composition()}, not {goal}"
    assert res.summary["completed"] == len(gen.requests), "a request was lost on the route"
    return float(res.summary["mean_ttft_s"])


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", default="configs/eval/test.yaml")
    ap.add_argument("--config", default="configs/sim-40gpu.yaml")
    ap.add_argument("--workloads", default="", help="comma-separated (default: every workload of the set)")
    ap.add_argument("--at", type=float, default=0.5, help="when the route's operations begin (s)")
    ap.add_argument("--jobs", type=int, default=1)
    a = ap.parse_args(argv)
    p = plan(a.set, a.config, "vertumnus", workloads=[n for n in a.workloads.split(",") if n] or None)
    reps = range(p.replicates)
    t0 = time.time()
    ft = fixed_tasks(p, a.set, a.config)
    ordered = by_workload(ft, p.workloads)
    fixed = merge_replicates(dict(zip(ordered, run_tasks(ordered, a.jobs), strict=True)))
    means = {(t.workload, t.composition): d.mean for t, d in fixed.items()}
    best = {n: min(p.compositions, key=lambda c: means[(n, c)]) for n in p.workloads}
    with ProcessPoolExecutor(max_workers=max(1, a.jobs)) as ex:
        routes = {(n, k): ex.submit(run_route, a.set, a.config, n, k, best[n], a.at) for n in p.workloads for k in reps}
        route = {n: sum(routes[(n, k)].result() for k in reps) / len(reps) for n in p.workloads}
    print(f"{a.set} under {a.config}: scripted route start → best fixed at {a.at:g} s ({len(reps)} streams, means)")
    print(f"{'workload':15s} {'start':13s} {'best fixed':13s} {'best mean':>9s} {'route':>7s} {'÷best':>6s}")
    for n in p.workloads:
        b = means[(n, best[n])]
        print(f"{n:15s} {p.starts[n]:13s} {best[n]:13s} {b:9.4f} {route[n]:7.4f} {route[n] / b:6.3f}")
    print(f"({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
