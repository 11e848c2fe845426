"""What moving costs: each workload started on its start composition and moved, at once, to its best fixed one.

Issue 16 asks the controller to end a run at or below the best fixed composition in hindsight (≤ 1.00×). A
controller that starts elsewhere must reconfigure to get there: the sources drain, the switch takes
``controller.switch_s``, and the moved workers' caches are re-tiled. This benchmark measures that toll with a
clairvoyant, scripted route — no forecast, no decision: the pool starts on the workload's start composition with
the controller off, and at ``--at`` seconds begins every operation that turns the start composition into the
best fixed one (all of them at once, on disjoint workers, through the epoch protocol as the controller would),
then stays there. Its whole-run mean TTFT over the best fixed composition's is the ratio that *moving* alone
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
from vertumnus.controller.lattice import Lattice, LatticeOp
from vertumnus.sim.evaluate import _context, _workload, by_workload, fixed_tasks, merge_replicates, plan, run_tasks
from vertumnus.sim.events import EventKind
from vertumnus.sim.runner import Simulation
from vertumnus.types import ReconfigKind


def route_ops(lattice: Lattice, target: dict[int, int]) -> list[LatticeOp]:
    """Disjoint operations that take the lattice's composition to ``target`` (two degrees, one step apart:
    splits of the larger or merges of the smaller, as many as the difference needs)."""
    if len(lattice.degrees) != 2:
        raise ValueError(f"route_ops handles two degrees, the pool has {list(lattice.degrees)}")
    small, large = sorted(lattice.degrees)
    extra_large = target.get(large, 0) - lattice.composition().get(large, 0)
    kind = ReconfigKind.MERGE if extra_large > 0 else ReconfigKind.SPLIT
    used: set[int] = set()
    out: list[LatticeOp] = []
    for op in lattice.ops(kind):
        if len(out) == abs(extra_large):
            break
        if op.sources[0].degree != (small if kind == ReconfigKind.MERGE else large):
            continue
        ids = {s.worker_id for s in op.sources}
        if ids & used:
            continue
        used |= ids
        out.append(op)
    return out


def run_route(set_path: str, config: str, workload: str, replicate: int, target: str, at: float) -> float:
    """Whole-run mean TTFT of the scripted route (start → ``target`` at ``at`` s, then fixed)."""
    es, cfg, cost = _context(set_path, config)
    start = es.start_of(es.workload(workload))
    gen = _workload(set_path, config, workload, replicate)
    sim = Simulation(gen.requests, cfg, cost, "vertumnus-static", start)
    ctl = sim.pool.controller
    goal = parse_composition(target)

    def move() -> None:
        for i, op in enumerate(route_ops(ctl.lattice, goal)):
            if i:  # later plans get fresh target ids (the first plan reserved its own), as the controller does
                src = op.sources[0].worker_id
                again = ctl.lattice.split_of(src) if op.kind == ReconfigKind.SPLIT else ctl.lattice.merge_of(src)
                assert again is not None
                op = again
            drain = max(sim.pool.scheduler.queue_s(s.worker_id, sim.loop.now) for s in op.sources)
            ctl.epochs.begin(ctl.epochs.next_plan(op, drain), sim.loop.now)

    if parse_composition(start) != goal:
        sim.loop.push(at, EventKind.ENGINE, move)
    res = sim.run()
    assert ctl.lattice.composition() == goal, f"route ended on {ctl.lattice.composition()}, not {goal}"
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
