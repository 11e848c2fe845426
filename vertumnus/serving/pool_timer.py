"""The pool's clock on the server's event loop: window ends (controller) and cache scans, and each predictive
decision run in a worker thread.

The predictive replay (~20 ms at 64 workers) runs in a thread, not on the event loop that serves requests: the
timer hands it over and applies its result back on the loop, where every pool call runs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from vertumnus.controller.controller import PendingDecision
from vertumnus.pool import PrefillPool

log = logging.getLogger("vertumnus.serving")

TICK_MAX_S = 0.25  # a submit may move the next timer earlier: re-checked at least this often


class PoolTimer:
    """Runs ``pool.on_timer`` when due and each deferred predictive decision; ``on_tick`` after every tick."""

    def __init__(self, pool: PrefillPool, clock: Callable[[], float], on_tick: Callable[[], None]) -> None:
        self.pool = pool
        self.clock = clock
        self.on_tick = on_tick
        pool.controller.defer_decisions = True  # taken by the timer, decided in a thread (module docstring)
        self._timer: asyncio.Task[None] | None = None
        self._decision: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._timer = asyncio.create_task(self._loop(), name="vertumnus-controller-timer")

    def stop(self) -> None:
        """Cancel the timer and a decision in flight (idempotent)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._decision is not None:
            self._decision.cancel()
            self._decision = None

    async def _loop(self) -> None:
        """Window ends (controller) and cache scans; re-checks at least every ``TICK_MAX_S`` because a submit may
        move the next timer earlier."""
        while True:
            delay = min(max(self.pool.next_timer() - self.clock(), 0.0), TICK_MAX_S)
            await asyncio.sleep(delay)
            try:
                self.pool.on_timer(self.clock())
            except Exception:  # a policy bug must not stop the server; it is logged and retried next tick
                log.exception("pool timer failed")
            job = self.pool.controller.take_pending() if self.pool.controller.pending is not None else None
            if job is not None:
                self._decision = asyncio.create_task(self._decide(job), name="vertumnus-predictive-decision")
            self.on_tick()

    async def _decide(self, job: PendingDecision) -> None:
        """One predictive decision: the replay in a worker thread (it reads only the snapshot in ``job``), then
        acted on here, on the loop, where every pool call runs. The GIL still interleaves the thread with the
        loop (switch interval 5 ms), so a request waits at most a few ms behind a decision, not its whole
        duration."""
        ctl = self.pool.controller
        try:
            decision = await asyncio.to_thread(ctl.decide, job)
            ctl.finish(job, decision, self.clock())
        except Exception:  # logged; the controller takes the next decision at the next window end
            log.exception("predictive decision failed")
            ctl.abandon(job)
