"""The evaluation's runs as tasks: one simulation each (a workload of a set, a policy, a start or fixed
composition, a request stream), the validated plan they come from, and the fold of their replicate streams.

Each task regenerates its workload from the set file, so only small digests cross process boundaries."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

from vertumnus.config import VertumnusConfig, parse_composition
from vertumnus.cost_model import CostModel
from vertumnus.eval.clairvoyant import clairvoyant_forecaster
from vertumnus.eval.digest import PHASE_KEYS, SUMMARY_KEYS, RunDigest, mean_digest
from vertumnus.eval.eval_set import EvalSet, load_eval_set
from vertumnus.eval.parallel import run_parallel
from vertumnus.eval.phase_stats import phase_summaries
from vertumnus.eval.prescient import PrescientSteer
from vertumnus.eval.protocol import Generated
from vertumnus.eval.verdict import Overrides, best_fixed
from vertumnus.sim.inputs import load_cost, load_sim_config
from vertumnus.sim.policies import all_compositions, check_policy, normalise_composition
from vertumnus.sim.runner import run_policy
from vertumnus.types import Request

STATIC = "vertumnus-static"


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
    clairvoyant: bool = False  # the clairvoyant reference of ``policy`` (vertumnus.eval.clairvoyant)


@lru_cache(maxsize=4)
def context(set_path: str, config: str) -> tuple[EvalSet, VertumnusConfig, CostModel]:
    cfg = load_sim_config(config)
    return load_eval_set(set_path), cfg, load_cost(cfg)


@lru_cache(maxsize=2)
def generated(set_path: str, config: str, name: str, replicate: int = 0) -> Generated:
    # The workload is defined by the base config (its cost model and pool size set the rates); overrides only
    # change how the policy runs, so a sensitivity sweep compares runs on identical requests.
    es, cfg, cost = context(set_path, config)
    return es.generate(name, cfg, cost, replicate)


def workload_requests(set_path: str, config: str, name: str, replicate: int = 0) -> list[Request]:
    """The requests of one workload of a set on request stream ``replicate`` (as every run of it sees them)."""
    return list(generated(set_path, config, name, replicate).requests)


def run_task(task: Task) -> RunDigest:
    """Run one task (in this process or a pool worker)."""
    _, cfg, cost = context(task.set_path, task.config)
    gen = generated(task.set_path, task.config, task.workload, task.replicate)
    run_cfg = apply_overrides(cfg, task.overrides)
    hooks = [PrescientSteer(parse_composition(task.target)).hook] if task.target else []
    forecaster = clairvoyant_forecaster if task.clairvoyant else None
    result = run_policy(gen.requests, run_cfg, cost, task.policy, task.composition, forecaster=forecaster,
                        hooks=hooks)  # fmt: skip
    summary = {k: result.summary.get(k) for k in SUMMARY_KEYS}
    phases = [{k: s.get(k) for k in PHASE_KEYS} for s in phase_summaries(result.arrays, gen.bounds)]
    return RunDigest(task.policy, task.composition, summary, phases)


def run_tasks(
    tasks: Sequence[Task], jobs: int = 1, progress: Callable[[int, int, Task], None] | None = None
) -> list[RunDigest]:
    """Run tasks in order (jobs = 1) or on a process pool; results in task order."""
    return run_parallel(tasks, run_task, jobs, progress)


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
    es, cfg, cost = context(set_path, config)
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
