"""Out-of-sample evaluation: a policy against every fixed composition of the lattice on each workload of a set.

Per workload: the policy (``vertumnus`` by default: whatever controller the config selects) starts from the
workload's stated composition; ``vertumnus-static`` runs on every reachable composition (controller off, same
routing and cache manager). From those per-run numbers (:func:`derive`):

- best fixed in hindsight: the fixed composition with the lowest whole-run mean TTFT (ties: name);
- per-phase oracle: per phase, the fixed composition with the lowest mean TTFT over the requests arriving in
  that phase; its whole-run figure is the request-weighted mean of those per-phase means (an idealised bound:
  it switches for free and every phase starts from that composition's own history);
- ratios of the policy's mean TTFT to the best fixed, to its own start composition held fixed, to the oracle;
- the prescient start (:mod:`vertumnus.sim.prescient`): the start composition moved at t = 0 to the best fixed
  one with the pool's own operations, then held — a reference, not a criterion: its ratio to the best fixed is the
  start-up cost no controller that only converges to the best fixed composition avoids (its runs follow the fixed
  ones, which name the target; a workload that starts on its best fixed composition needs none);
- the clairvoyant controller (:mod:`vertumnus.sim.clairvoyant`): the policy with the predictive controller's
  forecast replaced by the requests that will arrive — a reference, not a criterion: its ratio to the best fixed
  is what the controller still pays with a perfect forecast, and the policy's ratio to it what the forecast's
  error costs (run only for a policy whose config selects the predictive controller);
- the issue's "done when" flags: mean ≤ 1.00× best fixed, ≤ 1.02× start held fixed, P90 ≤ best fixed's P90,
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

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from typing import Any

from vertumnus.config import VertumnusConfig, format_composition, parse_composition
from vertumnus.controller.lattice import Lattice
from vertumnus.cost_model import CostModel
from vertumnus.eval.eval_set import EvalSet, load_eval_set
from vertumnus.eval.phase_stats import phase_summaries
from vertumnus.eval.protocol import Generated, mean_of_runs
from vertumnus.sim.inputs import load_cost, load_sim_config
from vertumnus.sim.policies import check_policy, normalise_composition
from vertumnus.sim.prescient import PrescientSteer
from vertumnus.sim.runner import run_policy
from vertumnus.types import Request

STATIC = "vertumnus-static"
MEAN_VS_BEST = 1.00  # done when: whole-run mean TTFT ≤ 1.00× the best fixed composition's
MEAN_VS_START = 1.02  # ... and ≤ 1.02× the start composition held fixed
SUMMARY_KEYS = (
    "requests", "completed", "mean_ttft_s", "p50_ttft_s", "p90_ttft_s", "p99_ttft_s", "max_ttft_s",
    "slo_attainment_token_weighted", "slo_attainment", "prefix_hit_rate_tokens", "rejected", "failed", "unfinished",
    "reconfigurations", "splits", "merges", "replications", "reclamations", "initial_composition",
    "final_composition", "sim_wall_s", "sim_cpu_s",
)  # fmt: skip
PHASE_KEYS = ("requests", "completed", "mean_ttft_s", "p90_ttft_s", "slo_attainment_token_weighted")
Overrides = tuple[tuple[str, Any], ...]  # (dotted config key, value): e.g. (("controller.theta_up", 0.7),)


# -- digests of runs ---------------------------------------------------------------------------------------------
@dataclass(slots=True)
class RunDigest:
    """What the evaluation keeps of one run."""

    policy: str
    composition: str  # the start (or fixed) composition
    summary: dict[str, Any]
    phases: list[dict[str, Any]]  # PHASE_KEYS per phase
    # Whole-run mean TTFT of each request stream the digest folds (:func:`mean_digest`); empty for one run.
    stream_means: tuple[float, ...] = ()

    @property
    def per_stream(self) -> tuple[float, ...]:
        """Mean TTFT per request stream (inf: a stream that completed nothing); one run: its own mean."""
        return self.stream_means or (self.mean,)

    @property
    def lost(self) -> int:
        s = self.summary
        return int(sum(s.get(k) or 0 for k in LOST_KEYS))

    @property
    def mean(self) -> float:
        return _num(self.summary.get("mean_ttft_s"))

    @property
    def p90(self) -> float:
        return _num(self.summary.get("p90_ttft_s"))

    @property
    def slo(self) -> float:
        v = self.summary.get("slo_attainment_token_weighted")
        return 0.0 if v is None else float(v)


LOST_KEYS = ("rejected", "failed", "unfinished")


def mean_digest(runs: Sequence[RunDigest]) -> RunDigest:
    """One digest for the replicate runs of one (workload, policy, composition).

    Each numeric figure is its mean over the runs; request counts and lost requests (rejected, failed,
    unfinished) are sums, so nothing lost on any stream disappears in a mean; a figure some run lacks (no
    completed request) is None; text (compositions) is the first run's. ``summary["replicates"]`` = len(runs);
    ``stream_means`` keeps each run's mean TTFT in order, for the per-stream (paired) ratios."""
    if not runs:
        raise ValueError("mean_digest needs at least one run")
    first = runs[0]
    if any(len(r.phases) != len(first.phases) for r in runs):
        raise ValueError("replicate runs have different phase counts")
    counts = ("requests", "completed", *LOST_KEYS)
    summary = {**mean_of_runs([r.summary for r in runs], counts), "replicates": len(runs)}
    phases = [mean_of_runs([r.phases[k] for r in runs], counts) for k in range(len(first.phases))]
    streams = tuple(m for r in runs for m in r.per_stream)
    return RunDigest(first.policy, first.composition, summary, phases, streams)


def _num(v: Any) -> float:
    """A TTFT statistic; no completed request at all counts as infinitely slow."""
    return math.inf if v is None else float(v)


@dataclass(slots=True)
class PhaseOracle:
    """One phase: the policy against the best fixed composition of that phase."""

    phase: int
    label: str
    requests: int
    policy_mean: float
    best: str
    best_mean: float

    @property
    def ratio(self) -> float:
        if self.requests == 0:
            return math.nan  # an empty phase (load 0) has no verdict
        return _ratio(self.policy_mean, self.best_mean)


@dataclass(slots=True)
class Verdict:
    """Derived figures of one workload (see the module docstring)."""

    best_fixed: str
    best_mean: float
    start: str
    start_mean: float
    oracle_mean: float
    ratio_best: float
    ratio_start: float
    ratio_oracle: float
    phases: list[PhaseOracle]
    flags: dict[str, bool]
    prescient_mean: float = math.nan  # the prescient start's mean TTFT (nan: not run)
    prescient_ratio: float = math.nan  # ... ÷ the best fixed composition's
    # Per request stream k: the policy's mean TTFT on stream k ÷ the best fixed composition's (the one chosen on
    # the means) on the same stream k — paired, since both ran the same requests. Empty: stream counts differ.
    stream_ratios: tuple[float, ...] = ()
    clairvoyant_mean: float = math.nan  # the clairvoyant controller's mean TTFT (nan: not run)
    clairvoyant_ratio: float = math.nan  # ... ÷ the best fixed composition's

    @property
    def passed(self) -> bool:
        return all(self.flags.values())


def _ratio(a: float, b: float) -> float:
    if math.isinf(a) and math.isinf(b):
        return 1.0
    return a / b if b > 0 else math.inf


def best_fixed(fixed: Mapping[str, RunDigest]) -> str:
    """The fixed composition with the lowest whole-run mean TTFT (ties: name)."""
    return min(fixed, key=lambda n: (fixed[n].mean, n))


def derive(
    policy: RunDigest,
    fixed: Mapping[str, RunDigest],
    start: str,
    labels: Sequence[str] | None = None,
    prescient: RunDigest | None = None,
    clairvoyant: RunDigest | None = None,
) -> Verdict:
    """Best fixed, per-phase oracle, ratios and done-when flags from the per-run numbers alone; ``prescient``:
    the prescient start's run (None: not run, or — when the start is the best fixed composition — that run);
    ``clairvoyant``: the clairvoyant controller's run (None: not run)."""
    if start not in fixed:
        raise ValueError(f"start composition {start} has no fixed run (have {sorted(fixed)})")
    best_name = best_fixed(fixed)
    best = fixed[best_name]
    phases: list[PhaseOracle] = []
    total_n, weighted = 0, 0.0
    for k, ph in enumerate(policy.phases):
        means = {n: _num(r.phases[k].get("mean_ttft_s")) for n, r in fixed.items()}
        name = min(means, key=lambda n: (means[n], n))
        n_req = int(ph.get("requests", 0))
        phases.append(PhaseOracle(k, labels[k] if labels else str(k), n_req, _num(ph.get("mean_ttft_s")), name,
                                  means[name]))  # fmt: skip
        if n_req:
            total_n += n_req
            weighted += n_req * means[name]
    oracle = weighted / total_n if total_n else math.nan
    start_mean = fixed[start].mean
    flags = {
        "mean<=best": policy.mean <= MEAN_VS_BEST * best.mean,
        "mean<=1.02*start": policy.mean <= MEAN_VS_START * start_mean,
        "p90<=best": policy.p90 <= best.p90,
        "slo>=best": policy.slo >= best.slo,
        "lost==0": policy.lost == 0,
    }
    if prescient is None and start == best_name:
        prescient = best  # already there: nothing to move
    pre = prescient.mean if prescient is not None else math.nan
    ps, bs = policy.per_stream, best.per_stream
    streams = tuple(_ratio(a, b) for a, b in zip(ps, bs, strict=True)) if len(ps) == len(bs) else ()
    clv = clairvoyant.mean if clairvoyant is not None else math.nan
    return Verdict(best_name, best.mean, start, start_mean, oracle, _ratio(policy.mean, best.mean),
                   _ratio(policy.mean, start_mean), _ratio(policy.mean, oracle), phases, flags, pre,
                   _ratio(pre, best.mean) if prescient is not None else math.nan, streams, clv,
                   _ratio(clv, best.mean) if clairvoyant is not None else math.nan)  # fmt: skip


@dataclass(slots=True)
class WorkloadResult:
    """One workload: its layout, the policy's run, every fixed run and the verdict."""

    name: str
    pattern: str
    start: str
    requests: int
    duration_s: float
    phases: list[dict[str, Any]]  # label, bounds, load, long share, req/s
    policy: RunDigest
    fixed: dict[str, RunDigest]
    verdict: Verdict


@dataclass(slots=True)
class EvalResult:
    """A whole set under one config."""

    set_name: str
    set_source: str
    config: str
    profile: str
    policy: str
    overrides: Overrides
    workloads: list[WorkloadResult] = field(default_factory=list)
    replicates: int = 1  # request streams each figure is the mean over

    def geomean(self, attr: str) -> float:
        """Geometric mean of a verdict ratio over the workloads (``ratio_best``, ``ratio_start``, ...)."""
        return geometric_mean([getattr(w.verdict, attr) for w in self.workloads])

    def stream_geomeans(self) -> tuple[float, ...]:
        """Per request stream k, the geometric mean over the workloads of ``Verdict.stream_ratios[k]`` — the
        spread of the headline ``geomean("ratio_best")`` across the streams; empty where a workload lacks them."""
        per = [w.verdict.stream_ratios for w in self.workloads]
        if not per or any(len(r) != len(per[0]) or not r for r in per):
            return ()
        return tuple(geometric_mean([r[k] for r in per]) for k in range(len(per[0])))

    @property
    def passed(self) -> int:
        return sum(w.verdict.passed for w in self.workloads)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "set": self.set_name, "set_source": self.set_source, "config": self.config, "profile": self.profile,
            "policy": self.policy, "overrides": dict(self.overrides), "replicates": self.replicates,
            "geomean_ratio_best": self.geomean("ratio_best"), "geomean_ratio_start": self.geomean("ratio_start"),
            "geomean_ratio_oracle": self.geomean("ratio_oracle"),
            "geomean_clairvoyant_ratio": self.geomean("clairvoyant_ratio"),
            "geomean_ratio_best_per_stream": list(self.stream_geomeans()),
            "passed": self.passed, "workloads": [],
        }  # fmt: skip
        for w in self.workloads:
            d = asdict(w)
            d["verdict"]["passed"] = w.verdict.passed
            d["policy"]["lost"] = w.policy.lost
            for r in d["fixed"].values():
                r["lost"] = sum(r["summary"].get(k) or 0 for k in LOST_KEYS)
            out["workloads"].append(d)
        return json_finite(out)


def geometric_mean(vals: Sequence[float]) -> float:
    """Geometric mean of positive ratios; inf when there are none, or one is not positive or infinite."""
    if not vals or any(not (v > 0) or math.isinf(v) for v in vals):
        return math.inf
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def json_finite(x: Any) -> Any:
    """``x`` for JSON, which has no infinity: inf / nan become None (in dicts, lists and tuples too)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: json_finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_finite(v) for v in x]
    return x


# -- tasks -------------------------------------------------------------------------------------------------------
def all_compositions(cfg: VertumnusConfig) -> list[str]:
    """Every reachable composition of the pool's lattice, most small-degree workers first."""
    lat = Lattice(cfg.pool.nodes, cfg.pool.gpus_per_node, cfg.pool.degrees)
    return [format_composition(lat.as_dict(c)) for c in sorted(lat.reachable(), reverse=True)]


def apply_overrides(cfg: VertumnusConfig, overrides: Overrides) -> VertumnusConfig:
    """A validated copy of ``cfg`` with dotted keys set (ValueError naming a bad key or value)."""
    if not overrides:
        return cfg
    data = cfg.model_dump()
    for key, value in overrides:
        parts = key.split(".")
        node = data
        for p in parts[:-1]:
            if not isinstance(node.get(p), dict):
                raise ValueError(f"unknown config key {key!r}")
            node = node[p]
        if parts[-1] not in node:
            raise ValueError(f"unknown config key {key!r}")
        node[parts[-1]] = value
    try:
        return VertumnusConfig.model_validate(data)
    except Exception as e:  # pydantic ValidationError: one line naming the problem
        raise ValueError(f"bad override {dict(overrides)}: {str(e).splitlines()[-1].strip()}") from None


@dataclass(slots=True, frozen=True)
class Task:
    """One simulation: workload ``workload`` of the set, ``policy`` started from / fixed on ``composition``."""

    set_path: str
    config: str
    workload: str
    policy: str
    composition: str
    overrides: Overrides = ()
    replicate: int = 0  # request stream (eval_set module docstring)
    target: str = ""  # a prescient start from ``composition`` to this composition ("": none)
    clairvoyant: bool = False  # the clairvoyant reference of ``policy`` (vertumnus.sim.clairvoyant)


@lru_cache(maxsize=4)
def _context(set_path: str, config: str) -> tuple[EvalSet, VertumnusConfig, CostModel]:
    cfg = load_sim_config(config)
    return load_eval_set(set_path), cfg, load_cost(cfg)


@lru_cache(maxsize=2)
def _workload(set_path: str, config: str, name: str, replicate: int = 0) -> Generated:
    # The workload is defined by the base config (its cost model and pool size set the rates); overrides only
    # change how the policy runs, so a sensitivity sweep compares runs on identical requests.
    es, cfg, cost = _context(set_path, config)
    return es.generate(name, cfg, cost, replicate)


def workload_requests(set_path: str, config: str, name: str, replicate: int = 0) -> list[Request]:
    """The requests of one workload of a set on request stream ``replicate`` (as every run of it sees them)."""
    return list(_workload(set_path, config, name, replicate).requests)


def run_task(task: Task) -> RunDigest:
    """Run one task (in this process or a pool worker)."""
    _, cfg, cost = _context(task.set_path, task.config)
    gen = _workload(task.set_path, task.config, task.workload, task.replicate)
    run_cfg = apply_overrides(cfg, task.overrides)
    steer = PrescientSteer(parse_composition(task.target)) if task.target else None
    result = run_policy(gen.requests, run_cfg, cost, task.policy, task.composition, steer=steer,
                        clairvoyant=task.clairvoyant)  # fmt: skip
    summary = {k: result.summary.get(k) for k in SUMMARY_KEYS}
    phases = [{k: s.get(k) for k in PHASE_KEYS} for s in phase_summaries(result.arrays, gen.bounds)]
    return RunDigest(task.policy, task.composition, summary, phases)


def run_tasks(
    tasks: Sequence[Task], jobs: int = 1, progress: Callable[[int, int, Task], None] | None = None
) -> list[RunDigest]:
    """Run tasks in order (jobs = 1) or on a process pool; results in task order."""
    out: list[RunDigest | None] = [None] * len(tasks)
    if jobs <= 1:
        for i, t in enumerate(tasks):
            out[i] = run_task(t)
            if progress:
                progress(i + 1, len(tasks), t)
    else:
        with ProcessPoolExecutor(max_workers=jobs) as ex:
            futures = {ex.submit(run_task, t): i for i, t in enumerate(tasks)}
            for done, fut in enumerate(as_completed(futures), start=1):
                i = futures[fut]
                out[i] = fut.result()
                if progress:
                    progress(done, len(tasks), tasks[i])
    return [r for r in out if r is not None]


# -- the evaluation ----------------------------------------------------------------------------------------------
@dataclass(slots=True)
class Plan:
    """The validated inputs of an evaluation."""

    eval_set: EvalSet
    cfg: VertumnusConfig
    cost: CostModel
    workloads: list[str]
    starts: dict[str, str]
    compositions: list[str]
    replicates: int  # request streams per run: the set's, unless the caller overrode it


def plan(set_path: str, config: str, policy: str, start: str | None = None,
         workloads: Iterable[str] | None = None, replicates: int | None = None) -> Plan:  # fmt: skip
    """Load and check everything before any run: set, config, policy, compositions (ValueError on a problem).
    ``replicates``: request streams per run instead of the set's ``replicates``."""
    check_policy(policy)
    if replicates is not None and not 1 <= replicates <= 20:
        raise ValueError(f"replicates must be 1-20, got {replicates}")
    es, cfg, cost = _context(set_path, config)
    names = list(workloads) if workloads else [w.name for w in es.workloads]
    for n in names:
        es.workload(n)
    comps = all_compositions(cfg)
    starts = {}
    for n in names:
        text = start or es.start_of(es.workload(n))
        try:
            starts[n] = normalise_composition(text, cfg)
        except ValueError as e:
            raise ValueError(f"bad composition for workload {n!r}: {e}") from None
        if starts[n] not in comps:
            raise ValueError(f"composition {starts[n]} is not reachable in the lattice ({', '.join(comps)})")
    for n in names:
        es.trace_paths(es.workload(n).traces)
    return Plan(es, cfg, cost, names, starts, comps, replicates or es.replicates)


def fixed_tasks(p: Plan, set_path: str, config: str) -> list[Task]:
    """``vertumnus-static`` on every composition, every workload, every replicate (stream-major per workload)."""
    reps = range(p.replicates)
    return [Task(set_path, config, n, STATIC, c, (), k) for n in p.workloads for k in reps for c in p.compositions]


def policy_tasks(p: Plan, set_path: str, config: str, policy: str, overrides: Overrides = ()) -> list[Task]:
    """``policy`` from each workload's start composition, every replicate."""
    reps = range(p.replicates)
    return [Task(set_path, config, n, policy, p.starts[n], overrides, k) for n in p.workloads for k in reps]


def prescient_tasks(p: Plan, set_path: str, config: str, fixed: Mapping[tuple[str, str], RunDigest]) -> list[Task]:
    """The prescient start of every workload whose start is not its best fixed composition, every replicate
    (``fixed``: the merged fixed runs, keyed by (workload, composition))."""
    out = []
    for n in p.workloads:
        best = best_fixed({c: fixed[(n, c)] for c in p.compositions})
        if best != p.starts[n]:
            out += [Task(set_path, config, n, STATIC, p.starts[n], (), k, best) for k in range(p.replicates)]
    return out


def run_prescient(
    p: Plan,
    set_path: str,
    config: str,
    fixed: Mapping[tuple[str, str], RunDigest],
    jobs: int = 1,
    progress: Callable[[int, int, Task], None] | None = None,
) -> dict[str, RunDigest]:
    """Run :func:`prescient_tasks` (after the fixed runs, which name each target); merged digests by workload."""
    return run_per_workload(p, prescient_tasks(p, set_path, config, fixed), jobs, progress)


def has_clairvoyant(p: Plan, policy: str) -> bool:
    """Whether ``policy`` runs the predictive controller under the plan's config (what the clairvoyant
    reference replaces the forecast of)."""
    cc = p.cfg.controller
    return policy in ("vertumnus", "vertumnus-norepl") and cc.enabled and cc.policy == "predictive"


def clairvoyant_tasks(p: Plan, set_path: str, config: str, policy: str) -> list[Task]:
    """``policy``'s clairvoyant reference on every workload and replicate (none where it has no predictive
    controller)."""
    if not has_clairvoyant(p, policy):
        return []
    return [replace(t, clairvoyant=True) for t in policy_tasks(p, set_path, config, policy)]


def run_clairvoyant(
    p: Plan,
    set_path: str,
    config: str,
    policy: str,
    jobs: int = 1,
    progress: Callable[[int, int, Task], None] | None = None,
) -> dict[str, RunDigest]:
    """Run :func:`clairvoyant_tasks`; merged digests by workload (empty: no predictive controller)."""
    return run_per_workload(p, clairvoyant_tasks(p, set_path, config, policy), jobs, progress)


def run_per_workload(
    p: Plan, tasks: Sequence[Task], jobs: int = 1, progress: Callable[[int, int, Task], None] | None = None
) -> dict[str, RunDigest]:
    """Run tasks of one kind (at most one per workload and replicate): their replicates merged, by workload."""
    ordered = by_workload(tasks, p.workloads)
    merged = merge_replicates(dict(zip(ordered, run_tasks(ordered, jobs, progress), strict=True)))
    return {t.workload: d for t, d in merged.items()}


def merge_replicates(digests: Mapping[Task, RunDigest]) -> dict[Task, RunDigest]:
    """Fold the replicate runs of each task into one :func:`mean_digest`, keyed by the task with replicate 0."""
    groups: dict[Task, list[tuple[int, RunDigest]]] = {}
    for t, d in digests.items():
        groups.setdefault(replace(t, replicate=0), []).append((t.replicate, d))
    return {t: mean_digest([d for _, d in sorted(runs, key=lambda x: x[0])]) for t, runs in groups.items()}


def by_workload(tasks: Sequence[Task], order: Sequence[str]) -> list[Task]:
    """Tasks of one workload and stream next to each other (a pool worker's cache holds two streams)."""
    rank = {n: i for i, n in enumerate(order)}
    return sorted(tasks, key=lambda t: (rank[t.workload], t.replicate))


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
        gen = _workload(p.eval_set.source, config, n)
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
    pol = run_per_workload(p, policy_tasks(p, set_path, config, policy, overrides), jobs, progress)
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
