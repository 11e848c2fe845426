"""The rule policy's side of the controller (``controller.policy: rules``): the window's ρ / long-share signal
(:mod:`vertumnus.controller.rules`), one operation at a time, after ``persist_windows`` windows.

Operation choice among topology-compatible moves of the decided direction (all participants ACTIVE):
  1. smallest predicted drain time = max q_w(now) over the participating workers (they drain in parallel);
  2. then the least expected KV-reconciliation traffic (``cache.reconcile_traffic(plan)``), evaluated only
     for the moves tied on (1);
  3. then the lowest source worker id (deterministic).
A merge of two degree-C siblings is admitted only if the merged composition still has D_k ≤ θ_up·K', with
K' = K − 2κ_C + κ_{2C}.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from vertumnus.controller.params import RulesParams
from vertumnus.controller.rules import Direction, WindowReport
from vertumnus.types import ReconfigKind

if TYPE_CHECKING:
    from vertumnus.controller.controller import Controller


class RulesPolicy:
    """Thresholds on the window's utilisation and long share; no split checks between windows."""

    name = "rules"
    first_arrival: float | None = None  # (no forecast: the arrivals are not logged)

    def __init__(self, ctl: Controller, params: RulesParams) -> None:
        self.ctl = ctl
        self.params = params

    def observe(self, arrival_s: float, input_len: int, cached_tokens: int) -> None:
        """Nothing to log: the window account has the request."""

    def window_end(self, report: WindowReport, now: float, queue_s: Callable[[int], float]) -> None:
        ctl = self.ctl
        chosen = None
        if report.signal != Direction.NONE:
            kind = ReconfigKind.SPLIT if report.signal == Direction.SPLIT else ReconfigKind.MERGE
            chosen = ctl.choose(kind, report.demand_s, queue_s)
        direction = report.signal if chosen is not None else Direction.NONE
        if ctl.account.persist(report, direction, self.params.persist_windows) and chosen is not None:
            ctl.account.acted(report)
            ctl.epochs.begin(ctl.plan(chosen), now)

    def check(self, now: float) -> None:
        """Never scheduled (the rule policy decides at window ends only)."""
