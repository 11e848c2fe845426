"""Out-of-sample evaluation: a policy against every fixed composition of the lattice on each workload of a set.

Per workload: the policy (``vertumnus`` by default: whatever controller the config selects) starts from the
workload's stated composition; ``vertumnus-static`` runs on every reachable composition (controller off, same
routing and cache manager). From those per-run numbers (:func:`derive`):

- best fixed in hindsight: the fixed composition with the lowest whole-run mean TTFT (ties: name);
- per-phase oracle: per phase, the fixed composition with the lowest mean TTFT over the requests arriving in
  that phase; its whole-run figure is the request-weighted mean of those per-phase means (an idealised bound:
  it switches for free and every phase starts from that composition's own history);
- ratios of the policy's mean TTFT to the best fixed, to its own start composition held fixed, to the oracle;
- the prescient start (:mod:`vertumnus.eval.prescient`): the start composition moved at t = 0 to the best fixed
  one with the pool's own operations, then held — a reference, not a criterion: its ratio to the best fixed is the
  start-up cost no controller that only converges to the best fixed composition avoids (its runs follow the fixed
  ones, which name the target; a workload that starts on its best fixed composition needs none);
- the clairvoyant controller (:mod:`vertumnus.eval.clairvoyant`): the policy with the predictive controller's
  forecast replaced by the requests that will arrive — a reference, not a criterion: its ratio to the best fixed
  is what the controller still pays with a perfect forecast, and the policy's ratio to it what the forecast's
  error costs (run only for a policy whose config selects the predictive controller);
- the "done when" flags: mean ≤ 1.00× best fixed, ≤ 1.02× start held fixed, P90 ≤ best fixed's P90,
  token-weighted SLO attainment ≥ best fixed's, zero lost requests (rejected + failed + unfinished).

Runs are independent tasks (a process pool with ``jobs`` > 1); each task regenerates its workload from the set
file, so only small digests cross process boundaries. A set with ``replicates: R`` runs every task on R request
streams; :func:`mean_digest` folds them into one digest per (workload, policy, composition) before anything above
is derived, so every figure is a mean over the streams and all policies are compared on the same streams. The
digests keep each stream's whole-run mean, so the verdict also gives the ratio to the best fixed composition per
stream (paired: the same requests on both sides) and its geometric mean over the workloads per stream — how far
the headline figure moves from one stream to the next.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from vertumnus.eval.digest import RunDigest
from vertumnus.eval.tasks import (
    Plan,
    Task,
    by_workload,
    clairvoyant_tasks,
    fixed_tasks,
    generated,
    merge_replicates,
    plan,
    policy_tasks,
    prescient_tasks,
    run_tasks,
)
from vertumnus.eval.verdict import EvalResult, Overrides, WorkloadResult, derive


def run_prescient(
    p: Plan,
    set_path: str,
    config: str,
    fixed: Mapping[tuple[str, str], RunDigest],
    jobs: int = 1,
    progress: Callable[[int, int, Task], None] | None = None,
) -> dict[str, RunDigest]:
    """Run :func:`prescient_tasks` (after the fixed runs, which name each target); merged digests by workload."""
    return run_perworkload(p, prescient_tasks(p, set_path, config, fixed), jobs, progress)


def run_clairvoyant(
    p: Plan,
    set_path: str,
    config: str,
    policy: str,
    jobs: int = 1,
    progress: Callable[[int, int, Task], None] | None = None,
) -> dict[str, RunDigest]:
    """Run :func:`clairvoyant_tasks`; merged digests by workload (empty: no predictive controller)."""
    return run_perworkload(p, clairvoyant_tasks(p, set_path, config, policy), jobs, progress)


def run_perworkload(
    p: Plan, tasks: Sequence[Task], jobs: int = 1, progress: Callable[[int, int, Task], None] | None = None
) -> dict[str, RunDigest]:
    """Run tasks of one kind (at most one per workload and replicate): their replicates merged, by workload."""
    ordered = by_workload(tasks, p.workloads)
    merged = merge_replicates(dict(zip(ordered, run_tasks(ordered, jobs, progress), strict=True)))
    return {t.workload: d for t, d in merged.items()}


def assemble(
    p: Plan,
    config: str,
    policy: str,
    policy_runs: Mapping[str, RunDigest],
    fixed_runs: Mapping[tuple[str, str], RunDigest],
    overrides: Overrides = (),
    prescient_runs: Mapping[str, RunDigest] | None = None,
    clairvoyant_runs: Mapping[str, RunDigest] | None = None,
) -> EvalResult:
    """Verdicts from finished runs (``fixed_runs`` keyed by (workload, composition); ``prescient_runs`` and
    ``clairvoyant_runs`` by workload, None: none run)."""
    res = EvalResult(p.eval_set.name, p.eval_set.source, config, p.cost.profile.source, policy, overrides,
                     replicates=p.replicates)  # fmt: skip
    for n in p.workloads:
        spec = p.eval_set.workload(n)
        gen = generated(p.eval_set.source, config, n)
        layout = [
            {"label": ph.label, "start_s": lo, "end_s": hi, "load": ph.load, "load_end": ph.load_end,
             "long_share": ph.long_share, "long_end": ph.long_end, "rps": r0, "rps_end": r1}
            for ph, (lo, hi), (r0, r1) in zip(gen.phases, gen.bounds, gen.rates, strict=True)
        ]  # fmt: skip
        fixed = {c: fixed_runs[(n, c)] for c in p.compositions}
        pre = prescient_runs.get(n) if prescient_runs is not None else None
        clv = clairvoyant_runs.get(n) if clairvoyant_runs is not None else None
        verdict = derive(policy_runs[n], fixed, p.starts[n], [ph.label for ph in gen.phases], pre, clv)
        res.workloads.append(WorkloadResult(n, spec.pattern, p.starts[n], len(gen.requests), gen.duration_s, layout,
                                            policy_runs[n], fixed, verdict))  # fmt: skip
    return res


def evaluate_against(
    base: EvalResult,
    set_path: str,
    config: str,
    policy: str,
    overrides: Overrides,
    jobs: int = 1,
    progress: Callable[[int, int, Task], None] | None = None,
) -> EvalResult:
    """``policy`` with ``overrides`` on ``base``'s workloads and request streams, judged against ``base``'s fixed
    runs (none is run again; no prescient starts): an ablation beside an evaluation of the same set and config."""
    p = plan(set_path, config, policy, workloads=[w.name for w in base.workloads], replicates=base.replicates)
    pol = run_perworkload(p, policy_tasks(p, set_path, config, policy, overrides), jobs, progress)
    fixed = {(w.name, c): d for w in base.workloads for c, d in w.fixed.items()}
    return assemble(p, config, policy, pol, fixed, overrides)


def evaluate(
    set_path: str,
    config: str,
    policy: str = "vertumnus",
    start: str | None = None,
    jobs: int = 1,
    workloads: Iterable[str] | None = None,
    progress: Callable[[int, int, Task], None] | None = None,
    replicates: int | None = None,
) -> EvalResult:
    """Evaluate ``policy`` on the set under ``config`` (see the module docstring); ``replicates`` overrides the
    set's request streams per run."""
    p = plan(set_path, config, policy, start, workloads, replicates)
    ft = fixed_tasks(p, set_path, config)
    pt = policy_tasks(p, set_path, config, policy)
    tasks = by_workload([*pt, *ft], p.workloads)
    merged = merge_replicates(dict(zip(tasks, run_tasks(tasks, jobs, progress), strict=True)))
    pol = {t.workload: merged[t] for t in pt if t.replicate == 0}
    fixed = {(t.workload, t.composition): merged[t] for t in ft if t.replicate == 0}
    pre = run_prescient(p, set_path, config, fixed, jobs, progress)
    clv = run_clairvoyant(p, set_path, config, policy, jobs, progress)
    return assemble(p, config, policy, pol, fixed, prescient_runs=pre, clairvoyant_runs=clv)
