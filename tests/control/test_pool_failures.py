"""Re-placement after worker failures (vertumnus/pool.py): a request whose prefill was running on two workers
when each of them failed fails alone, with a clear error, instead of being re-placed onto the rest of the pool
(a request that breaks workers must not take them all down in turn); requests that were only queued there are
re-placed however often their worker fails."""

from __future__ import annotations

from test_pool import Rig, req

from vertumnus.pool import MAX_FAILED_RUNS


class Errors:
    def __init__(self) -> None:
        self.errors: dict[str, str | None] = {}

    def request_done(self, request, placement, result) -> None:  # type: ignore[no-untyped-def]
        self.errors[request.request_id] = result.error

    def reconfig_done(self, plan, drain_s, switch_s) -> None:  # type: ignore[no-untyped-def]
        pass

    def cache_op_done(self, op, ok) -> None:  # type: ignore[no-untyped-def]
        pass


def _where(rig: Rig, rid: str) -> int:
    (wid,) = [w for w, q in rig.plane.queues.items() if any(j.request.request_id == rid for j in q)]
    return wid


def test_a_request_running_on_two_failed_workers_fails_alone_and_is_not_retried() -> None:
    assert MAX_FAILED_RUNS == 2
    rig = Rig("4xCP4", nodes=2)
    errors = Errors()
    rig.pool.add_listener(errors)
    rig.ack_all()
    for rid in ("poison", "q0", "q1", "q2", "q3", "q4", "q5"):
        rig.pool.submit(req(rid, 4096))
    first = _where(rig, "poison")
    rig.pool.prefill_started(first, "poison", rig.clock.t)
    rig.pool.worker_failed(first, "rank died", rig.clock.t)  # strike 1: re-placed like the others
    assert rig.done.requests == []
    second = _where(rig, "poison")
    assert second != first
    queued_there = sorted(j.request.request_id for j in rig.plane.queues[second] if j.request.request_id != "poison")
    rig.pool.prefill_started(second, "poison", rig.clock.t)
    rig.pool.worker_failed(second, "rank died", rig.clock.t)  # strike 2: fails alone
    assert rig.done.requests == [("poison", second, False)]
    assert errors.errors["poison"] == (
        "the prefill failed on 2 workers (each failed while running it); it is not retried on the rest of the pool"
    )
    assert all(j.request.request_id != "poison" for q in rig.plane.queues.values() for j in q)
    # what was only queued on the failed workers is re-placed, never struck
    placed = sorted(j.request.request_id for q in rig.plane.queues.values() for j in q)
    assert placed == ["q0", "q1", "q2", "q3", "q4", "q5"] and set(queued_there) <= set(placed)
    for entry in rig.plane.log:
        if entry[0] == "restart":  # ("restart", worker, epoch)
            rig.ack(entry[1], entry[2])
    assert {w.worker_id: w.state for w in rig.pool.snapshot().workers}[second] == "ACTIVE"
    for wid in list(rig.plane.queues):
        while rig.plane.queues[wid]:
            rig.run_next(wid)
    assert sorted(r for r, _, ok in rig.done.requests if ok) == placed
    assert len(rig.done.requests) == 7  # every request answered exactly once


def test_strikes_are_per_request_and_a_completion_clears_them() -> None:
    """One failure while running, then a completion elsewhere: a later failure during its next run of the
    same id would be a fresh start (the id is gone from the pool once it completed)."""
    rig = Rig("4xCP4", nodes=2)
    rig.ack_all()
    rig.pool.submit(req("a", 4096))
    w0 = _where(rig, "a")
    rig.pool.prefill_started(w0, "a", rig.clock.t)
    rig.pool.worker_failed(w0, "rank died", rig.clock.t)
    w1 = _where(rig, "a")
    rig.run_next(w1)
    assert rig.done.requests == [("a", w1, True)]
    rig.pool.submit(req("a", 4096))  # the same id again (a client reusing X-Request-Id): no strike left
    w2 = _where(rig, "a")
    rig.pool.prefill_started(w2, "a", rig.clock.t)
    rig.pool.worker_failed(w2, "rank died", rig.clock.t)
    assert rig.done.requests == [("a", w1, True)]  # re-placed again, not failed
    rig.run_next(_where(rig, "a"))
    assert [ok for _, _, ok in rig.done.requests] == [True, True]
