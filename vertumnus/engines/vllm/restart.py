"""Engine restarts: reconfiguration and failure recovery on vLLM workers (docs/vllm.md).

vLLM fixes ``prefill_context_parallel_size`` when an engine starts, so a split or merge cannot regroup ranks in
place as the torch engine does. Once the plan's sources are parked (drained at a step boundary), ``activate``:

1. stops the sources' engines (graceful shutdown, then the actors are killed) — their GPUs / CPU slots free;
2. reports each source's cache CLEARED (the sources are still tracked until commit, so the metadata the cache
   manager would hand to the targets is empty: no pending blocks are promised that no engine holds);
3. starts one engine per target on the target's ranks (same bundles, same devices) and acks ``plan.epoch`` on
   every rank once it serves — the pool then commits and schedules the targets;
4. records stop and start seconds (:class:`~vertumnus.engines.vllm.worker.RestartRecord`).

The switch stage therefore lasts an engine start-up (tens of seconds), not < 1 s; the caches of the
participating workers start empty.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from vertumnus.engines.vllm.worker import RestartRecord
from vertumnus.types import CacheReport, CacheReportKind, ReconfigPlan, WorkerGroup

if TYPE_CHECKING:
    from vertumnus.engines.vllm.data_plane import VllmDataPlane

log = logging.getLogger("vertumnus.vllm")


async def activate(plane: VllmDataPlane, plan: ReconfigPlan) -> None:
    """Stop the sources' engines, announce their caches cleared, start the targets' engines (each acks
    ``plan.epoch`` once it serves); record the restart time."""
    t0 = plane.clock()
    sources = [w for s in plan.sources if (w := plane.workers.pop(s.worker_id, None)) is not None]
    for w in sources:
        for it in w.queue:
            if it.op_id is not None:
                plane.events.cache_op_failed(it.op_id, "worker retired by a reconfiguration")
        w.queue.clear()
    await asyncio.gather(*(w.stop() for w in sources))
    for s in plan.sources:  # their KV is gone with their engines; the merged / split metadata starts empty
        plane.events.cache_report(CacheReport(s.worker_id, CacheReportKind.CLEARED))
    t1 = plane.clock()
    await asyncio.gather(*(plane.launch(t, plan.epoch) for t in plan.targets))
    rec = RestartRecord(
        plan.epoch, tuple(s.worker_id for s in plan.sources), tuple(t.worker_id for t in plan.targets),
        t1 - t0, plane.clock() - t1,
    )  # fmt: skip
    plane.restarts.append(rec)
    log.info(
        "reconfiguration to epoch %d: %d engine(s) stopped in %.2f s, %d started in %.2f s (restart %.2f s)",
        plan.epoch, len(sources), rec.stop_s, len(plan.targets), rec.start_s, rec.total_s,
    )  # fmt: skip


async def restart(plane: VllmDataPlane, group: WorkerGroup, epoch: int) -> None:
    """Bring a FAILED worker back under ``epoch`` with a fresh engine (backing off on repeated failures)."""
    old = plane.workers.pop(group.worker_id, None)
    if old is not None:
        await old.stop()
    n = plane.failures.get(group.worker_id, 0)
    if n > 1:  # repeated failures: back off (1, 2, 4, ... ≤ 60 s) instead of spinning on a broken engine
        await asyncio.sleep(min(2.0 ** (n - 2), 60.0))
    plane.counters["restarts"] += 1
    await plane.launch(group, epoch)
