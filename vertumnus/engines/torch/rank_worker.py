"""One long-lived rank of the torch CP engine: model weights, its share of the worker's KV blocks, and the
process groups of every aligned block of every allowed degree.

Usable without Ray or the data plane::

    w = RankWorker(spec)                           # loads weights (seed or safetensors directory)
    w.connect("127.0.0.1", store_port, generation=0)   # joins the world, creates all groups (collective)
    replies = w.assign(group, epoch)               # becomes a rank of `group` (EpochAck)
    replies = w.step(RunPrefill(...))              # one command = one engine step

A Ray actor hosts exactly this object and forwards ``step`` calls;
:func:`vertumnus.engines.torch.launcher.rank_main` is the process loop used by
:class:`~vertumnus.engines.torch.data_plane.TorchDataPlane`.

Group creation order (identical on every rank, required by ``dist.new_group``): for each node, for each
degree > 1 ascending, for each aligned block j of that degree: ranks [j·C, (j+1)·C) of the node.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from vertumnus.cp.attention import chunk_attention
from vertumnus.cp.block_index import BlockIndex
from vertumnus.cp.comm import Comm, DistComm, LocalComm
from vertumnus.cp.cp_forward import cp_prefill, gather_prefix
from vertumnus.cp.model import ReferenceModel
from vertumnus.cp.weights import load_weights
from vertumnus.engines.torch import messages as m
from vertumnus.types import CacheReport, CacheReportKind, WorkerGroup

GroupKey = tuple[int, int, int]  # (node, first node-local rank, degree)


class RankWorker:
    """State and step function of one rank (see module docstring)."""

    def __init__(self, spec: m.RankSpec) -> None:
        self.spec = spec
        if spec.device == "cpu":
            torch.set_num_threads(spec.threads)
            self.device = torch.device("cpu")
        else:
            self.device = torch.device("cuda", spec.rank % torch.cuda.device_count())
            torch.cuda.set_device(self.device)
        self.node, self.local_rank = divmod(spec.rank, spec.gpus_per_node)
        self.model = ReferenceModel(load_weights(spec.model), self.device)
        self.attend = chunk_attention(spec.attn_impl, self.device)
        dm = self.model.dims
        self._block_like = torch.empty(
            (dm.num_layers, 2, dm.num_kv_heads, spec.block_tokens, dm.head_dim),
            dtype=dm.torch_dtype,
            device=self.device,
        )
        self.generation = -1
        self._store_addr = ("127.0.0.1", 0)
        self.groups: dict[GroupKey, dist.ProcessGroup] = {}
        self.group: WorkerGroup | None = None
        self.epoch = -1
        self.comm: Comm = LocalComm()
        self.index = BlockIndex(1, spec.capacity_blocks, spec.retain)
        self.blocks: dict[int, torch.Tensor] = {}  # tensors of the blocks this rank owns
        self._handlers: dict[type, Any] = {
            m.RunPrefill: self._prefill,
            m.Park: self._park,
            m.Activate: self._activate,
            m.Assign: self._assign_cmd,
            m.ExportBlocks: self._export,
            m.ImportBlocks: self._import,
            m.RemoveBlocks: self._remove,
            m.ListBlocks: self._list,
            m.Regroup: self._regroup,
        }

    # -- world and groups ----------------------------------------------------------------------------------

    def connect(self, host: str, port: int, generation: int) -> None:
        """Join the world of ``generation`` (store hosted by the driver) and create every group, in order."""
        sp = self.spec
        self._store_addr = (host, port)
        timeout = timedelta(seconds=sp.timeout_s)
        store = dist.TCPStore(host, port, is_master=False, timeout=timeout)
        backend = "gloo" if sp.device == "cpu" else "nccl"
        dist.init_process_group(
            backend,
            store=dist.PrefixStore(f"gen{generation}", store),
            rank=sp.rank,
            world_size=sp.world_size,
            timeout=timeout,
        )
        self.generation = generation
        self.groups = {}
        for node in range(sp.world_size // sp.gpus_per_node):
            for degree in sorted(sp.degrees):
                if degree == 1:
                    continue
                for first in range(0, sp.gpus_per_node, degree):
                    ranks = [node * sp.gpus_per_node + first + i for i in range(degree)]
                    pg = dist.new_group(ranks)  # collective over the world: same order everywhere
                    if sp.rank in ranks:
                        self.groups[(node, first, degree)] = pg
        if self.group is not None:
            self.comm = self._comm_for(self.group)

    def _regroup(self, cmd: m.Regroup) -> list[m.Reply]:
        host, port = self._store_addr
        if dist.is_initialized():  # not after a failed connect / regroup: the rank joins the new world anyway
            dist.destroy_process_group()
        self.connect(host, port, cmd.generation)
        return [m.Ready(self.spec.rank, cmd.generation, os.getpid())]

    def _comm_for(self, group: WorkerGroup) -> Comm:
        assert group.node == self.node and group.first_rank <= self.local_rank < group.first_rank + group.degree
        if group.degree == 1:
            return LocalComm()
        pg = self.groups[(group.node, group.first_rank, group.degree)]
        return DistComm(pg, self.local_rank - group.first_rank, group.degree)

    def assign(self, group: WorkerGroup, epoch: int) -> list[m.Reply]:
        """Become a rank of ``group`` with an empty cache (start-up, restart)."""
        self.group, self.epoch = group, epoch
        self.comm = self._comm_for(group)
        self.index = BlockIndex(group.degree, self.spec.capacity_blocks, self.spec.retain)
        self.blocks = {}
        return [m.EpochAck(group.worker_id, self.spec.rank, epoch)]

    def _assign_cmd(self, cmd: m.Assign) -> list[m.Reply]:
        out = self.assign(cmd.group, cmd.epoch)
        if self.comm.rank == 0:
            out.append(m.Reports(cmd.group.worker_id, [CacheReport(cmd.group.worker_id, CacheReportKind.CLEARED)]))
        return out

    # -- steps ---------------------------------------------------------------------------------------------

    def step(self, cmd: m.Command) -> list[m.Reply]:
        """Execute one command (an engine step) and return the replies for the driver."""
        return self._handlers[type(cmd)](cmd)  # type: ignore[no-any-return]

    def _check(self, worker_id: int) -> WorkerGroup:
        g = self.group
        assert g is not None and g.worker_id == worker_id, (
            f"rank {self.spec.rank}: command for worker {worker_id}, rank belongs to {g}"
        )
        return g

    def _leader(self) -> bool:
        return self.comm.rank == 0

    def _prefill(self, cmd: m.RunPrefill) -> list[m.Reply]:
        t0, c0 = time.perf_counter(), time.process_time()
        g = self._check(cmd.worker_id)
        bt = self.spec.block_tokens
        ids = torch.tensor(cmd.token_ids, dtype=torch.long)
        keys = list(cmd.block_keys)
        assert len(keys) == ids.numel() // bt, "block keys do not match the prompt"
        # Reuse a leading run of held blocks; keep ≥ 1 token uncached (its logits start decode).
        reuse = self.index.match(keys, min(cmd.max_reuse_blocks, (ids.numel() - 1) // bt))
        self.index.touch(keys[:reuse], reuse=True)
        prefix = gather_prefix(self.comm, self.index, self.blocks, keys[:reuse], self._block_like)
        out = cp_prefill(self.model, self.comm, ids[reuse * bt :], prefix, self.attend)
        added_list, evicted = self.index.add_path(keys, reuse)
        added = set(added_list)
        for k in evicted:
            self.blocks.pop(k, None)
        me = self.comm.rank
        for i, k in enumerate(keys[reuse:], start=reuse):
            if k in added and self.index.owner(k) == me:
                off = (i - reuse) * bt
                self.blocks[k] = out.new_kv[:, :, :, off : off + bt].clone()
        reports: list[CacheReport] = []
        kv = None
        if self._leader():
            if evicted:
                reports.append(CacheReport(g.worker_id, CacheReportKind.REMOVED, tuple(evicted)))
            end = self.index.match(keys)
            if end > reuse:
                reports.append(
                    CacheReport(
                        g.worker_id, CacheReportKind.STORED, tuple(keys[reuse:end]), keys[reuse - 1] if reuse else None
                    )
                )
            if cmd.return_kv:
                kv = out.new_kv if prefix is None else torch.cat([prefix, out.new_kv], dim=3)
        return [
            m.PrefillDone(
                g.worker_id,
                me,
                cmd.request_id,
                reuse * bt,
                time.perf_counter() - t0,
                out.logits,
                kv,
                reports,
                self.epoch,
                time.process_time() - c0,
            )
        ]

    def _park(self, cmd: m.Park) -> list[m.Reply]:
        self._check(cmd.worker_id)
        return [m.Parked(cmd.worker_id, self.comm.rank)]

    def _activate(self, cmd: m.Activate) -> list[m.Reply]:
        """Split or merge in place: weights and this rank's blocks stay; only metadata and the group change.

        Every rank of the target contributes the rows of the blocks it owns (owner renumbered to its rank in
        the target); the union is the target's index (duplicates after a merge keep one copy: the one on the
        canonical rank, else the lowest). No block moves, and no cache report is sent: the cache manager
        derives the same per-rank layout from the plan (:mod:`vertumnus.cache.reconfigure`).
        """
        src = self.group
        assert src is not None and any(s.worker_id == src.worker_id for s in cmd.sources)
        target = cmd.target
        new_rank = self.local_rank - target.first_rank
        old_rank = self.comm.rank
        mine = [(k, p, d, 0, t, h) for k, p, d, o, t, h in self.index.rows() if o == old_rank]
        self.group, self.epoch = target, cmd.epoch
        self.comm = self._comm_for(target)
        parts = self.comm.all_gather_object((new_rank, mine))
        self.index, drop = BlockIndex.merge(parts, target.degree, self.spec.capacity_blocks, self.spec.retain)
        for k in drop.get(new_rank, ()):
            self.blocks.pop(k, None)
        assert set(self.blocks) == {k for k, *_ in self.index.rows() if self.index.owner(k) == new_rank}
        return [m.EpochAck(target.worker_id, self.spec.rank, cmd.epoch)]

    def _export(self, cmd: m.ExportBlocks) -> list[m.Reply]:
        self._check(cmd.worker_id)
        keys = tuple(k for k in cmd.keys if k in self.blocks)
        blocks = torch.stack([self.blocks[k] for k in keys]).cpu() if keys else None
        return [m.Exported(cmd.op_id, cmd.worker_id, self.comm.rank, keys, blocks)]

    def _import(self, cmd: m.ImportBlocks) -> list[m.Reply]:
        g = self._check(cmd.worker_id)
        path = list(cmd.path)
        provided = dict(zip(cmd.keys, cmd.blocks, strict=True)) if cmd.blocks is not None else {}
        added, evicted = self.index.add_path(path, cmd.first_missing, only=set(cmd.available))
        for k in evicted:
            self.blocks.pop(k, None)
        me = self.comm.rank
        for k in added:
            if self.index.owner(k) == me:
                self.blocks[k] = provided[k].to(self.device).clone()
        error = None
        if self.index.match(path) < len(path):
            missing = len(path) - self.index.match(path)
            error = f"worker {g.worker_id} still lacks {missing} block(s) of the path after the import"
            for k in self.index.remove(added):
                self.blocks.pop(k, None)
        reports: list[CacheReport] = []
        if self._leader():
            if evicted:
                reports.append(CacheReport(g.worker_id, CacheReportKind.REMOVED, tuple(evicted)))
            if error is None:
                fm = cmd.first_missing
                reports.append(
                    CacheReport(
                        g.worker_id, CacheReportKind.STORED, tuple(path[fm:]), path[fm - 1] if fm else None, cmd.op_id
                    )
                )
        return [m.OpDone(cmd.op_id, g.worker_id, me, reports, error)]

    def _remove(self, cmd: m.RemoveBlocks) -> list[m.Reply]:
        g = self._check(cmd.worker_id)
        removed = self.index.remove(cmd.keys)
        for k in removed:
            self.blocks.pop(k, None)
        reports = []
        if self._leader():
            keys = tuple(dict.fromkeys([*cmd.keys, *removed]))
            reports.append(CacheReport(g.worker_id, CacheReportKind.REMOVED, keys, op_id=cmd.op_id))
        return [m.OpDone(cmd.op_id, g.worker_id, self.comm.rank, reports)]

    def _list(self, cmd: m.ListBlocks) -> list[m.Reply]:
        self._check(cmd.worker_id)
        me = self.comm.rank
        keys = tuple(k for k, _p, _d, owner, *_ in self.index.rows() if owner == me)
        assert set(keys) == set(self.blocks), f"rank {self.spec.rank}: index and stored tensors disagree"
        return [m.BlockList(cmd.token, cmd.worker_id, me, keys)]
