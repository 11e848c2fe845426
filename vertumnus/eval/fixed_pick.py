"""Every composition's record across a set, and the fixed composition a tuning-set search would pick.

The per-workload verdict compares the policy with the best fixed composition *in hindsight* — a different one
on different workloads, which no operator can run. What an operator can run instead of the controller is one
fixed composition chosen beforehand on the workloads they have seen. So the report also asks, across a set's
workloads (the same ratios as the verdict, mean TTFT ÷ the workload's best fixed composition's)::

    standing(x) = geometric mean and worst of mean_x(w) / min_c mean_c(w)   over the workloads w

for the policy and for every fixed composition c, and picks on the *tuning* set the fixed composition with the
lowest geometric mean (then the lowest worst; then the first listed) — the fixed baseline a search would choose —
to set against the policy on the *test* set. Adaptivity pays out of sample where the policy's test-set standing
is below that pick's (both figures). Pure arithmetic on finished runs, plus :func:`tuning_pick`, which runs the
tuning set's fixed compositions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

from vertumnus.eval.digest import geometric_mean, json_finite
from vertumnus.eval.fmt import ratio
from vertumnus.eval.tasks import Task, fixed_tasks, merge_replicates, plan, run_tasks
from vertumnus.eval.verdict import EvalResult


@dataclass(slots=True, frozen=True)
class Standing:
    """One policy or fixed composition across a set's workloads."""

    name: str
    geomean: float  # geometric mean over the workloads of its mean TTFT ÷ the best fixed composition's
    worst: float  # the largest of those ratios
    worst_workload: str
    at_best: int  # workloads where its mean TTFT is at or below the best fixed composition's

    def beats(self, other: Standing) -> bool:
        """Lower on both the geometric mean and the worst workload."""
        return self.geomean < other.geomean and self.worst < other.worst


def standings(
    means: Mapping[str, Mapping[str, float]], fixed: Sequence[str], others: Sequence[str] = ()
) -> list[Standing]:
    """The standing of every name of ``others`` (e.g. the policy) and of ``fixed`` (in that order), from
    ``means[workload][name]`` (mean TTFT, s; ``inf`` for a run that completed nothing). The best fixed composition
    of a workload is the lowest mean among ``fixed``. ValueError without workloads or fixed compositions, or
    where a mean is missing."""
    if not means or not fixed:
        raise ValueError("standings need at least one workload and one fixed composition")
    best: dict[str, float] = {}
    for w, row in means.items():
        missing = [n for n in (*others, *fixed) if n not in row]
        if missing:
            raise ValueError(f"workload {w!r} has no mean TTFT for {', '.join(missing)}")
        best[w] = min(row[c] for c in fixed)
    out = []
    for name in (*others, *fixed):
        ratios = {w: ratio(means[w][name], best[w]) for w in means}
        worst_w = max(ratios, key=lambda w: ratios[w])
        geo = geometric_mean(list(ratios.values()))
        at_best = sum(means[w][name] <= best[w] for w in means)
        out.append(Standing(name, geo, ratios[worst_w], worst_w, at_best))
    return out


def result_standings(res: EvalResult) -> list[Standing]:
    """The policy's standing, then every fixed composition's, on an evaluation's workloads."""
    if not res.workloads:
        raise ValueError("the evaluation has no workloads")
    fixed = list(res.workloads[0].fixed)
    means = {w.name: {res.policy: w.policy.mean, **{c: d.mean for c, d in w.fixed.items()}} for w in res.workloads}
    return standings(means, fixed, (res.policy,))


def stream_ratios_to(res: EvalResult, name: str) -> tuple[float, ...]:
    """Per request stream k, the geometric mean over the workloads of the policy's mean TTFT on stream k ÷ fixed
    composition ``name``'s on stream k (paired: the same requests). Empty with one stream, or where some run
    lacks per-stream means of the same count. Independent of which composition is each workload's best."""
    if not res.workloads:
        raise ValueError("the evaluation has no workloads")
    pairs = [(w.policy.per_stream, w.fixed[name].per_stream) for w in res.workloads]
    n = len(pairs[0][0])
    if n < 2 or any(len(a) != n or len(b) != n for a, b in pairs):
        return ()
    return tuple(geometric_mean([ratio(a[k], b[k]) for a, b in pairs]) for k in range(n))


def pick(fixed_standings: Sequence[Standing]) -> Standing:
    """The fixed composition a search on these standings chooses: lowest geometric mean, then lowest worst, then
    the first listed."""
    if not fixed_standings:
        raise ValueError("nothing to pick from")
    return min(fixed_standings, key=lambda s: (s.geomean, s.worst))


@dataclass(slots=True, frozen=True)
class TuningPick:
    """The fixed composition picked on a tuning set, and the standings it was picked from."""

    set_source: str
    chosen: Standing
    fixed: list[Standing]


def tuning_pick(
    set_path: str,
    config: str,
    jobs: int = 1,
    progress: Callable[[int, int, Task], None] | None = None,
    replicates: int | None = None,
) -> TuningPick:
    """Run every fixed composition on every workload of the (tuning) set under ``config`` and pick one
    (:func:`pick`). No controller runs: the choice reads the fixed compositions only. ``replicates``: request
    streams per run instead of the set's. ValueError on a set or config that cannot run (before any run)."""
    p = plan(set_path, config, "vertumnus", replicates=replicates)
    tasks = fixed_tasks(p, set_path, config)
    merged = merge_replicates(dict(zip(tasks, run_tasks(tasks, jobs, progress), strict=True)))
    means: dict[str, dict[str, float]] = {}
    for t, d in merged.items():
        means.setdefault(t.workload, {})[t.composition] = d.mean
    fixed = standings(means, p.compositions)
    return TuningPick(p.eval_set.source, pick(fixed), fixed)


def standings_json(res: EvalResult, tuned: TuningPick | None = None) -> dict[str, object]:
    """The standings (and the tuning set's pick, where given) for ``evaluation.json``; infinities as None."""
    out: dict[str, object] = {"standings": [asdict(s) for s in result_standings(res)]}
    if tuned is not None:
        out["tuning_pick"] = {
            "set": tuned.set_source,
            "chosen": asdict(tuned.chosen),
            "fixed": [asdict(s) for s in tuned.fixed],
        }
    finite: dict[str, object] = json_finite(out)
    return finite
