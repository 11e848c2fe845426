"""Rank processes of one world and the TCP store they rendezvous on.

The store is hosted in the driver process, so it outlives any rank: restarted ranks rendezvous on the same
store under a new generation prefix (``gen{g}/``). Ranks are started from a forkserver that has already
imported torch and the rank code (start-up in milliseconds instead of seconds per rank); ``spawn`` works too.
Each rank has its own command queue; all ranks share one reply queue.
"""

from __future__ import annotations

import os
import threading
import traceback
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as tmp

from vertumnus.engines.torch import messages as m
from vertumnus.engines.torch.messages import Command, RankSpec, Shutdown
from vertumnus.engines.torch.rank_worker import RankWorker
from vertumnus.types import WorkerGroup

# Imported once by the forkserver; every rank is forked with these already loaded.
FORKSERVER_PRELOAD = ["torch", "torch.distributed", "vertumnus.engines.torch.launcher"]


def _entry(
    spec: RankSpec,
    host: str,
    port: int,
    generation: int,
    group: WorkerGroup | None,
    epoch: int,
    cmd_q: Any,
    reply_q: Any,
    driver_pid: int,
) -> None:
    _exit_with_driver(driver_pid)
    rank_main(spec, host, port, generation, group, epoch, cmd_q, reply_q)


def _exit_with_driver(driver_pid: int) -> None:
    """Never outlive the driver (a killed test run must not leave ranks behind on a shared machine)."""

    def watch() -> None:
        ev = threading.Event()
        while not ev.wait(1.0):
            try:
                os.kill(driver_pid, 0)
            except ProcessLookupError:
                os._exit(1)

    threading.Thread(target=watch, name="driver-watch", daemon=True).start()


def rank_main(
    spec: m.RankSpec,
    host: str,
    port: int,
    generation: int,
    group: WorkerGroup | None,
    epoch: int,
    cmd_q: Any,
    reply_q: Any,
) -> None:
    """Process entry point: build the rank, join the world, take ``group``, then run commands until Shutdown.

    Any exception is reported as :class:`RankFailed` and ends the process (its groups are unusable anyway).
    """
    worker_id = group.worker_id if group else None
    try:
        w = RankWorker(spec)
        w.connect(host, port, generation)
        reply_q.put(m.Ready(spec.rank, generation, os.getpid()))
        if group is not None:  # a restarted worker (generation > 0) also reports its empty cache
            for r in w.step(m.Assign(group, epoch)) if generation > 0 else w.assign(group, epoch):
                reply_q.put(r)
        while True:
            cmd = cmd_q.get()
            if isinstance(cmd, m.Shutdown):
                break
            worker_id = w.group.worker_id if w.group else None
            for r in w.step(cmd):
                if isinstance(r, m.PrefillDone) and w.device.type != "cpu":  # host memory crosses processes
                    r.logits = None if r.logits is None else r.logits.cpu()
                    r.kv = None if r.kv is None else r.kv.cpu()
                reply_q.put(r)
        dist.destroy_process_group()
    except BaseException:
        reply_q.put(m.RankFailed(spec.rank, worker_id, traceback.format_exc(limit=8)))
        raise SystemExit(1) from None


class RankProcesses:
    """Starts, messages and stops rank processes."""

    def __init__(self, start_method: str = "forkserver", host: str = "127.0.0.1") -> None:
        self.ctx: Any = tmp.get_context(start_method)
        if start_method == "forkserver":
            self.ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
        self.host = host
        self.store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False)
        self.port = int(self.store.port)
        self.replies = self.ctx.Queue()
        self._cmd: dict[int, Any] = {}
        self._procs: dict[int, Any] = {}

    def spawn(self, spec: RankSpec, generation: int, group: WorkerGroup | None, epoch: int) -> None:
        """Start global rank ``spec.rank`` (replacing a dead process of that rank)."""
        old = self._procs.get(spec.rank)
        assert old is None or not old.is_alive(), f"rank {spec.rank} is still running"
        q = self.ctx.Queue()
        p = self.ctx.Process(
            target=_entry,
            name=f"vertumnus-rank{spec.rank}",
            daemon=True,
            args=(spec, self.host, self.port, generation, group, epoch, q, self.replies, os.getpid()),
        )
        p.start()
        self._cmd[spec.rank] = q
        self._procs[spec.rank] = p

    def send(self, rank: int, cmd: Command) -> None:
        self._cmd[rank].put(cmd)

    def alive(self, rank: int) -> bool:
        p = self._procs.get(rank)
        return p is not None and p.is_alive()

    def pid(self, rank: int) -> int | None:
        p = self._procs.get(rank)
        return None if p is None else p.pid

    def ranks(self) -> list[int]:
        return sorted(self._procs)

    def kill(self, rank: int) -> None:
        p = self._procs.get(rank)
        if p is not None and p.is_alive():
            p.kill()
            p.join(5.0)

    def close(self, timeout_s: float = 10.0) -> None:
        """Ask every live rank to shut down, then kill what is left."""
        for rank, p in self._procs.items():
            if p.is_alive():
                self._cmd[rank].put(Shutdown())
        for p in self._procs.values():
            p.join(timeout_s)
        for rank in list(self._procs):
            self.kill(rank)
        self._procs.clear()
        self._cmd.clear()
