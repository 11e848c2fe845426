"""The Ray actor hosting one rank of the torch CP engine (:class:`~vertumnus.engines.torch.rank_worker.RankWorker`).

Threaded actor with two lanes: ``step`` / ``connect`` (one at a time — the driver never sends a rank two
commands at once, so every rank of a worker executes the same command sequence) and ``watch``, a call that
only returns when the actor shuts down: the driver keeps one ``watch`` in flight per rank, so the death of the
actor process (``ray.kill``, OOM, node loss) surfaces at once as a failed ObjectRef, even while the rank is
idle.

KV hand-off: a finished prefill's KV (``PrefillDone.kv`` on the worker's first rank) is put into the Ray object
store *by the rank* and only its ObjectRef travels back, so the KV goes rank → object store → decode actor
without passing through the server process.
"""

from __future__ import annotations

import os
import threading
import traceback
from typing import Any

import ray

from vertumnus.engines.torch.messages import Command, PrefillDone, RankFailed, RankSpec, Ready, Reply
from vertumnus.engines.torch.rank_worker import RankWorker
from vertumnus.types import WorkerGroup


class RankActor:
    """Ray actor body (the data plane wraps it with ``ray.remote(max_concurrency=2)``)."""

    def __init__(self, spec: RankSpec) -> None:
        os.environ.setdefault("OMP_NUM_THREADS", str(spec.threads))
        self.spec = spec
        self.worker = RankWorker(spec)
        self._closed = threading.Event()

    def pid(self) -> int:
        return os.getpid()

    def connect(self, host: str, port: int, generation: int) -> Ready | RankFailed:
        """Join the world of ``generation`` (collective: every rank of the world must call it)."""
        try:
            self.worker.connect(host, port, generation)
        except Exception:
            return RankFailed(self.spec.rank, None, traceback.format_exc(limit=6))
        return Ready(self.spec.rank, generation, os.getpid())

    def assign(self, group: WorkerGroup, epoch: int) -> list[Reply]:
        return self.worker.assign(group, epoch)

    def step(self, cmd: Command) -> tuple[list[Reply], Any]:
        """One engine step. Returns (replies, ObjectRef of the exported KV or None). An exception inside the
        rank (e.g. a collective whose peer died) becomes a RankFailed reply; the rank then needs a Regroup."""
        try:
            replies = self.worker.step(cmd)
        except Exception:
            wid = self.worker.group.worker_id if self.worker.group is not None else None
            return [RankFailed(self.spec.rank, wid, traceback.format_exc(limit=6))], None
        kv_ref = None
        for r in replies:
            if isinstance(r, PrefillDone) and r.kv is not None:
                kv_ref = ray.put(r.kv.cpu())
                r.kv = None
        return replies, kv_ref

    def watch(self) -> bool:
        """Blocks until :meth:`close`; an error instead of True means the actor died."""
        self._closed.wait()
        return True

    def close(self) -> None:
        self._closed.set()
