"""Where the pool nodes of the Ray-hosted torch engine are: their placement groups as last read, waiting until a
lost node's group is placed again, and the ``vertumnus_pool_node_placed`` gauge.

The placement groups are read from the GCS in a thread (never on the event loop), every ``PLACEMENT_POLL_S``;
/v1/pool, the metrics and the restart of a failed worker read the result (vertumnus/serving/ray_recovery.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily

from vertumnus.serving.hosting import NodePlacement, RayHosting

log = logging.getLogger("vertumnus.serving")

PLACEMENT_POLL_S = 0.5  # how often the pool nodes' placement groups are read (restart wait, /v1/pool, metrics)


class PlacementWatch:
    """The pool nodes' placement groups (:attr:`placements`, refreshed every poll while :meth:`run` runs)."""

    def __init__(self, hosting: RayHosting) -> None:
        self.hosting = hosting
        self.placements: list[NodePlacement] = []

    async def run(self) -> None:
        """Keep :attr:`placements` current (GCS calls in a thread: never on the event loop)."""
        while True:
            try:
                now = await asyncio.to_thread(self.hosting.placements)
            except Exception:  # logged; the next poll tries again
                log.debug("reading the placement groups failed", exc_info=True)
            else:
                if now != self.placements:
                    if self.placements:
                        log.warning(
                            "pool nodes' placement: %s",
                            ", ".join(f"{p.node}: {p.state.lower()} on {(p.ray_node_id or '-')[:12]}" for p in now),
                        )
                    self.placements = now
            await asyncio.sleep(PLACEMENT_POLL_S)

    async def until_placed(self, node: int) -> None:
        """Return once pool node ``node``'s placement group is placed (its Ray node alive): at once normally,
        after the node is back (or replaced) when it was lost. No bound: a worker whose node is gone stays
        FAILED — visibly, in /v1/pool's ``ray_nodes`` and /health — until Ray can place its group again."""
        told = False
        while True:
            # read now, not the last poll's: the worker's failure can arrive before the poll saw its node go
            fresh = await asyncio.to_thread(self.hosting.placements)
            p = fresh[node] if node < len(fresh) else None
            if p is not None and p.placed:
                return
            if not told and p is not None:
                log.warning("pool node %d is not placed (%s): its workers restart once it is", node, p.state.lower())
                told = True
            await asyncio.sleep(PLACEMENT_POLL_S)

    def placed(self, node: int) -> bool:
        """Whether pool node ``node`` is placed as of the last poll (True before the first: unknown yet)."""
        return node >= len(self.placements) or self.placements[node].placed


class PlacementCollector:
    """``vertumnus_pool_node_placed{node}``: 1 while pool node n's placement group is placed on a live Ray node,
    0 while it is not (its Ray node lost, Ray rescheduling the group); read at scrape time."""

    def __init__(self, watch: PlacementWatch) -> None:
        self._watch = watch

    def collect(self) -> Iterator[GaugeMetricFamily]:
        g = GaugeMetricFamily(
            "vertumnus_pool_node_placed",
            "1 while the pool node's placement group is placed on a live Ray node, else 0.",
            labels=["node"],
        )
        for p in self._watch.placements:
            g.add_metric([str(p.node)], 1.0 if p.placed else 0.0)
        yield g
