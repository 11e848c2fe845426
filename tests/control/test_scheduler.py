"""Scheduler scenarios with exact expectations (calibrated H200 profile; DESIGN.md §1).

Pool used throughout: worker 0 = CP8 (node 0), workers 1 and 2 = CP4 (node 1, ranks 0-3 and 4-7).
Predicted times quoted in comments come from configs/profiles/qwen3-30b-a3b-h200.yaml.
"""

from __future__ import annotations

import pytest

from vertumnus.config import DEFAULT_PROFILE, REPO_ROOT, config_from_dict
from vertumnus.cost_model import CostModel
from vertumnus.scheduler import RequestRejected, Scheduler
from vertumnus.types import PrefixMatch, Request, WorkerState

COST = CostModel.from_file(REPO_ROOT / DEFAULT_PROFILE)
NO_MATCH = PrefixMatch(0, {})


def make(
    lam: float = 0.1, beta: float = 1.0, kv: int = 2048, max_len: int = 131072, price_pending: bool = False
) -> Scheduler:
    cfg = config_from_dict(
        {
            "pool": {"nodes": 2, "gpus_per_node": 8, "degrees": [4, 8], "kv_capacity_blocks_per_rank": kv,
                     "max_model_len": max_len},
            "scheduler": {"beta": beta, "lam": lam},
            "cache": {"price_pending": price_pending},
        }
    )  # fmt: skip
    s = Scheduler(cfg, COST)
    s.add_worker(0, 8, 0, WorkerState.ACTIVE, 1)
    s.add_worker(1, 4, 1, WorkerState.ACTIVE, 1)
    s.add_worker(2, 4, 1, WorkerState.ACTIVE, 1)
    return s


def req(rid: str, n: int, keys: tuple[int, ...] = ()) -> Request:
    return Request(rid, 0.0, n, keys)


def test_long_uncached_request_picks_cp8_when_idle() -> None:
    s = make(lam=0.1)
    # 64K tokens: E8 = 1.2788 s, E4 = 1.8450 s; J8 = 1.1 × 1.2788 = 1.4067 < J4 = 1.8450.
    p = s.place(req("a", 65536), NO_MATCH, 0.0)
    assert p is not None and p.worker_id == 0 and p.degree == 8
    assert p.predicted_s == COST.predict(8, 65536, 0)
    assert p.cost == pytest.approx(1.1 * COST.predict(8, 65536, 0))
    assert p.cached_tokens == 0 and p.uncached_tokens == 65536 and p.queue_s == 0.0
    assert p.preferred_degree == 8 and p.epoch == 1


def test_short_request_picks_cp4_when_lambda_positive() -> None:
    # 16K tokens: E8 = 0.28759 < E4 = 0.31454, but with λ = 0.1: J8 = 0.31634 > J4 → the lower CP4 (id 1).
    p = make(lam=0.1).place(req("a", 16384), NO_MATCH, 0.0)
    assert p is not None and (p.worker_id, p.preferred_degree) == (1, 4)
    p0 = make(lam=0.0).place(req("a", 16384), NO_MATCH, 0.0)
    assert p0 is not None and p0.worker_id == 0


def _fill(s: Scheduler, worker: int, n: int) -> float:
    """Reserve n uncached 8K-token requests at one worker (others DRAINING meanwhile); returns their Σ Ê."""
    others = [w for w in s.worker_ids() if w != worker]
    for w in others:
        s.set_state(w, WorkerState.DRAINING)
    for k in range(n):
        p = s.place(req(f"fill{worker}-{k}", 8192), NO_MATCH, 0.0)
        assert p is not None and p.worker_id == worker
    for w in others:
        s.set_state(w, WorkerState.ACTIVE)
    return n * COST.predict(s.table.info(worker).degree, 8192, 0)


@pytest.mark.parametrize(("fillers", "winner"), [(1, 1), (2, 1), (3, 2)])
def test_cached_prefix_on_busy_worker_until_queue_outweighs_benefit(fillers: int, winner: int) -> None:
    # Request: 32K tokens, 48 of its 64 blocks held by worker 1 (CP4). Worker 2 (CP4) is idle, worker 0 off.
    #   at 1: P = 24576, R = 8192: E4 = 0.05 + a·8192 + b·24576 + (c·8192 + α·W(8192, 24576))/4 = 0.295890 s
    #   at 2: P = 0,     R = 32768: E4 = 0.701888 s
    # Crossover: worker 1 wins while q_1 < 0.701888 − 0.295890 = 0.405998 s (same degree: no λ term).
    # Each 8K filler adds E4(8192, 0) = 0.166918 s: q_1 = 0.1669 / 0.3338 (1 wins), 0.5008 (2 wins).
    s = make(lam=0.1)
    s.set_state(0, WorkerState.DRAINING)
    q1 = _fill(s, 1, fillers)
    s.set_state(0, WorkerState.DRAINING)
    crossover = COST.predict(4, 32768, 0) - COST.predict(4, 8192, 24576)
    assert crossover == pytest.approx(0.405998, abs=1e-6)
    assert (q1 < crossover) == (winner == 1)
    p = s.place(req("x", 32768), PrefixMatch(48, {1: 48}), 0.0)
    assert p is not None and p.worker_id == winner
    if winner == 1:
        assert (p.cached_tokens, p.uncached_tokens, p.queue_s) == (24576, 8192, pytest.approx(q1))
    else:
        assert (p.cached_tokens, p.queue_s) == (0, 0.0)


def test_simultaneous_arrivals_do_not_share_an_idle_worker() -> None:
    s = make(lam=0.0)
    s.set_state(0, WorkerState.DRAINING)
    # Two 32K requests at t = 0, both CP4 idle: the first reserves 0.7019 s at worker 1, the second then sees
    # J_1 = 0.7019 + 0.7019 > J_2 = 0.7019 and takes worker 2.
    a = s.place(req("a", 32768), NO_MATCH, 0.0)
    b = s.place(req("b", 32768), NO_MATCH, 0.0)
    assert a is not None and b is not None
    assert (a.worker_id, b.worker_id) == (1, 2)
    assert b.queue_s == 0.0
    assert s.queue_s(1, 0.0) == pytest.approx(COST.predict(4, 32768, 0))


def test_non_active_workers_are_never_chosen() -> None:
    s = make(lam=0.0)
    for st in (WorkerState.DRAINING, WorkerState.PARKED, WorkerState.SWITCHING, WorkerState.FAILED):
        s.set_state(0, st)
        s.set_state(1, st)
        # 64K tokens and worker 0 holds the whole prefix: it would win by far if it were eligible.
        p = s.place(req(f"r{st.name}", 65536), PrefixMatch(128, {0: 128, 1: 128}), 0.0)
        assert p is not None and p.worker_id == 2
        s.release(p.request_id)
    s.set_state(2, WorkerState.FAILED)
    assert s.place(req("none", 100), NO_MATCH, 0.0) is None


def test_rejections_are_typed_and_capacity_waits_are_none() -> None:
    # Admission is the caller's (the pool checks once per placement attempt); place assumes it.
    s = make(kv=16, max_len=100_000)  # capacity: CP8 = 128 blocks (65536 tokens), CP4 = 64 blocks
    with pytest.raises(RequestRejected) as e:
        s.check_admissible(req("long", 100_001))
    assert (e.value.reason, e.value.limit, e.value.needed) == ("too_long", 100_000, 100_001)
    with pytest.raises(RequestRejected) as e:
        s.check_admissible(req("big", 70_000))  # ⌈70000/512⌉ = 137 blocks > 128
    assert (e.value.reason, e.value.limit, e.value.needed) == ("no_capacity_fit", 128, 137)
    assert "137 KV blocks" in str(e.value)
    with pytest.raises(RequestRejected) as e:
        s.check_admissible(req("empty", 0))
    assert e.value.reason == "empty"
    # 40000 tokens = 79 blocks: only the CP8 fits; once it is reserved, the next one waits (None).
    first = s.place(req("fits", 40_000), NO_MATCH, 0.0)
    assert first is not None and first.worker_id == 0
    assert s.table.free_blocks[s.table.index[0]] == 128 - 79
    assert s.place(req("waits", 40_000), NO_MATCH, 0.0) is None
    s.release("fits")
    again = s.place(req("waits", 40_000), NO_MATCH, 0.0)
    assert again is not None and again.worker_id == 0


def test_queue_counts_only_the_remaining_part_of_the_running_request() -> None:
    s = make(lam=0.0)
    s.set_state(1, WorkerState.DRAINING)
    s.set_state(2, WorkerState.DRAINING)
    a = s.place(req("a", 65536), NO_MATCH, 10.0)
    b = s.place(req("b", 8192), NO_MATCH, 10.0)
    assert a is not None and b is not None
    ea, eb = a.predicted_s, b.predicted_s
    assert s.queue_s(0, 10.0) == pytest.approx(ea + eb)
    assert s.started("a", 0, 10.0)
    assert not s.started("a", 1, 10.0)  # a report from another worker is stale
    assert s.queue_s(0, 10.5) == pytest.approx(ea + eb - 0.5)
    assert s.queue_s(0, 10.0 + 5 * ea) == pytest.approx(eb)  # overran its prediction: never below the queue
    s.release("a")
    assert s.queue_s(0, 20.0) == pytest.approx(eb)
    s.release("b")
    t = s.table
    i = t.index[0]
    assert (t.reserved_s[i], t.free_blocks[i], t.outstanding[i]) == (0.0, 8 * 2048, 0)


def test_prefix_is_capped_at_one_token_below_the_prompt() -> None:
    s = make(lam=0.0)
    p = s.place(req("a", 1024, (11, 12)), PrefixMatch(2, {2: 2}), 0.0)  # fully held: P = 1023, R = 1
    assert p is not None and p.worker_id == 2
    assert (p.cached_tokens, p.uncached_tokens) == (1023, 1)
    assert p.predicted_s == COST.predict(4, 1, 1023)
    assert s.table.outstanding[s.table.index[2]] == 0  # both blocks reused: nothing uncached outstanding


def test_preferred_degree_ignores_the_queue() -> None:
    s = make(lam=0.1)
    _fill(s, 0, 20)  # CP8 holds 20 × 0.176 s of work
    p = s.place(req("x", 65536), NO_MATCH, 0.0)
    assert p is not None and p.degree == 4 and p.preferred_degree == 8


def test_rows_stay_sorted_by_degree_then_id_across_joins_and_leaves() -> None:
    s = make()
    s.add_worker(7, 4, 0, WorkerState.ACTIVE, 2)
    s.add_worker(5, 8, 1, WorkerState.ACTIVE, 2)
    assert s.worker_ids() == [1, 2, 7, 0, 5]
    p = s.place(req("a", 100), NO_MATCH, 0.0)
    assert p is not None and p.worker_id == 1
    assert s.remove_worker(1) == [s.tickets["a"]]
    assert s.worker_ids() == [2, 7, 0, 5]
    assert s.table.free_blocks.tolist() == [4 * 2048, 4 * 2048, 8 * 2048, 8 * 2048]


def test_an_explicit_placement_cost_policy_sets_beta_and_lambda() -> None:
    from vertumnus.scheduler import PlacementCostPolicy

    base = make(lam=0.1)
    s = Scheduler(config_from_dict({"scheduler": {"lam": 0.1}}), COST, PlacementCostPolicy(1.0, 0.0))
    for wid, deg in ((0, 8), (1, 4)):
        s.add_worker(wid, deg, wid, WorkerState.ACTIVE, 1)
    p = s.place(req("a", 16384), NO_MATCH, 0.0)  # λ = 0 from the policy: CP8 (see the λ test above)
    assert p is not None and p.worker_id == 0
    assert base.lam == 0.1 and s.lam == 0.0
    with pytest.raises(ValueError, match="beta ≥ 1"):
        PlacementCostPolicy(0.5, 0.0)


def test_a_nearly_full_worker_holding_the_prefix_is_charged_only_the_blocks_it_lacks() -> None:
    # kv = 16 per rank: CP4 capacity 64 blocks, CP8 128. A running 50-block prefill fills worker 1 (CP4) to
    # 14 free blocks; it finished its predicted time long ago, so q_1 = 0 by t = 100.
    s = make(kv=16, lam=0.0)
    for w in (0, 2):
        s.set_state(w, WorkerState.DRAINING)
    busy = s.place(req("busy", 50 * 512), NO_MATCH, 0.0)
    assert busy is not None and busy.worker_id == 1 and s.started("busy", 1, 0.0)
    for w in (0, 2):
        s.set_state(w, WorkerState.ACTIVE)
    t, i1 = s.table, s.table.index[1]
    assert (t.free_blocks[i1], s.queue_s(1, 100.0)) == (14, 0.0)
    # 60 blocks, the first 50 held by worker 1: it lacks 10 ≤ 14 free blocks, so it is eligible, and reusing
    # 25600 tokens it beats the idle workers (E4(5120, 25600) < E4(30720, 0) and E8(30720, 0)).
    p = s.place(req("x", 60 * 512), PrefixMatch(50, {1: 50}), 100.0)
    assert p is not None and (p.worker_id, p.cached_tokens, p.uncached_tokens) == (1, 25600, 5120)
    assert p.predicted_s == COST.predict(4, 5120, 25600)
    assert (t.free_blocks[i1], t.outstanding[i1]) == (4, 50 + 10)  # charged only the 10 blocks it computes
    s.release("x")
    assert (t.free_blocks[i1], t.outstanding[i1]) == (14, 50)
    # Without the prefix the same request needs all 60 blocks there: worker 1 is not eligible.
    q = s.place(req("y", 60 * 512), NO_MATCH, 100.0)
    assert q is not None and q.worker_id != 1


def test_a_held_prefix_never_makes_a_prompt_larger_than_the_worker_eligible() -> None:
    # 70 blocks, 60 of them held by the CP4 worker 1 (capacity 64): only 10 are missing, but the whole prompt
    # must be resident during its prefill. Only the CP8 (128 blocks) can take it.
    s = make(kv=16, lam=0.0)
    p = s.place(req("x", 70 * 512), PrefixMatch(60, {1: 60}), 0.0)
    assert p is not None and (p.worker_id, p.cached_tokens) == (0, 0)
    s.set_state(0, WorkerState.DRAINING)
    assert s.place(req("y", 70 * 512), PrefixMatch(60, {1: 60}), 0.0) is None  # waits for the CP8


@pytest.mark.parametrize("price_pending", [False, True])
def test_a_pending_prefix_is_priced_with_its_reconciliation_when_configured(price_pending: bool) -> None:
    # 32K tokens. Worker 2 (CP4) was just split off and is assigned the first 48 blocks pending (the other half
    # of their KV on its sibling's ranks); nobody holds them validly. Unpriced, every worker is a miss and the
    # CP8 wins (as for any uncached 32K prompt). Priced: E_4(32K − 24K, 24K) + 48 blocks × 48 MiB / 400 GB/s
    # beats any miss.
    s = make(price_pending=price_pending)
    p = s.place(req("x", 32768), PrefixMatch(48, {}, {2: 48}), 0.0)
    assert p is not None
    if not price_pending:
        assert (p.worker_id, p.cached_tokens) == (0, 0)
        return
    copy_s = 48 * (512 * 48 * 2 * 4 * 128 * 2) / 400e9
    assert (p.worker_id, p.cached_tokens) == (2, 48 * 512)
    assert p.predicted_s == pytest.approx(COST.predict(4, 32768 - 48 * 512, 48 * 512) + copy_s)
