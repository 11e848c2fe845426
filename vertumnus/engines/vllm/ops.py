"""Cache operations on vLLM workers (DESIGN.md §3, docs/vllm.md).

vLLM has no API to import or delete individual prefix blocks, so:

- **replicate / reconcile** = run the prefix on the destination as a prefill with ``max_tokens=1``. By default
  the destination recomputes it (``vllm.replication: recompute``); with ``transfer`` and a KV connector
  (``kv_role: kv_both``) the source first exports the prefix (a prefill with ``do_remote_decode``) and the
  destination's prefill carries the returned ``kv_transfer_params``, so its connector loads the KV instead of
  computing it. Either way the prefill asks vLLM to report reused blocks too (``kv_cache_report_mode=full``),
  and the op is confirmed only by the destination's KV events: the STORED report with the op id is sent once
  the whole path is visible in the destination's block mirror. Not confirmed within ``vllm.confirm_timeout_s``
  after the prefill (evicted at once, say) → ``cache_op_failed``.
- **reclaim** = logical: the destination stops reporting the prefix (REMOVED with the op id, at once), so the
  scheduler stops routing reuse there; vLLM keeps the blocks until its LRU evicts them. Counted as
  ``logical_reclaims`` / ``logically_reclaimed_blocks``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from vertumnus.engines.vllm.worker import REMOTE_DECODE_PARAMS, Item, VllmWorker, call
from vertumnus.types import CacheOp, CacheOpKind

if TYPE_CHECKING:
    from vertumnus.engines.vllm.data_plane import VllmDataPlane

log = logging.getLogger("vertumnus.vllm")


def execute(plane: VllmDataPlane, op: CacheOp) -> None:
    """Start ``op`` (never calls the pool synchronously)."""
    dst = plane.workers.get(op.dst_worker)
    if dst is None or dst.failed or dst.stopped or dst.blocks is None:
        plane.soon(plane.events.cache_op_failed, op.op_id, "destination worker is not running", what=f"op {op.op_id}")
        return
    if op.kind == CacheOpKind.RECLAIM:
        plane.soon(_reclaim, plane, dst, op, what=f"reclaim op {op.op_id}", workers=(dst,))
        return
    tokens = path_tokens(plane, op.keys)
    if tokens is None:
        plane.counters["ops_without_tokens"] += 1
        reason = "the prefix's token ids are no longer known"
        plane.soon(plane.events.cache_op_failed, op.op_id, reason, what=f"op {op.op_id}")
        return
    plane.enqueue(dst, Item(lambda: _copy(plane, dst, op, tokens), op_id=op.op_id))


def path_tokens(plane: VllmDataPlane, keys: tuple[int, ...]) -> np.ndarray | None:
    """Token ids of the prefix ``keys`` from any block index that remembers them."""
    for index in plane.indexes.values():
        got = index.path_tokens(keys)
        if got is not None:
            return got
    return None


def _reclaim(plane: VllmDataPlane, dst: VllmWorker, op: CacheOp) -> None:
    assert dst.blocks is not None
    keys = op.keys[op.first_missing :]
    dst.blocks.reclaim(op.op_id, keys)
    plane.counters["logical_reclaims"] += 1
    plane.counters["logically_reclaimed_blocks"] += len(keys)


def expect(plane: VllmDataPlane, dst: VllmWorker, op: CacheOp) -> None:
    """Wait for ``op``'s path to become visible at ``dst`` (may confirm at once)."""
    assert dst.blocks is not None
    dst.blocks.expect_path(op.op_id, op.keys)


def watch(plane: VllmDataPlane, dst: VllmWorker, op_id: int) -> None:
    """After the op's prefill: fail it if the events have not confirmed it in time."""
    plane.soon(
        _timeout,
        plane,
        dst,
        op_id,
        what=f"confirmation timeout of op {op_id}",
        workers=(dst,),
        delay=plane.v.confirm_timeout_s,
    )


def _timeout(plane: VllmDataPlane, dst: VllmWorker, op_id: int) -> None:
    if dst.blocks is not None and dst.blocks.forget(op_id):
        plane.counters["ops_unconfirmed"] += 1
        plane.events.cache_op_failed(op_id, f"KV events did not confirm the copy within {plane.v.confirm_timeout_s} s")


async def _copy(plane: VllmDataPlane, dst: VllmWorker, op: CacheOp, tokens: np.ndarray) -> None:
    """Replicate / reconcile by a prefill of the prefix at ``dst`` (see module docstring)."""
    assert dst.blocks is not None
    expect(plane, dst, op)
    if op.op_id not in dst.blocks.expect:
        return  # already resident and reported
    ids = tokens.tolist()
    params = None
    v = plane.v
    if v.replication == "transfer" and v.kv_connector and v.kv_role == "kv_both" and op.src_worker is not None:
        src = plane.workers.get(op.src_worker)
        if src is not None and src.ready and not src.failed:
            try:
                out = await call(src.actor.prefill.remote(f"export-{op.op_id}", ids, dict(REMOTE_DECODE_PARAMS)))
                params = out.get("kv_transfer_params")
                plane.counters["transfer_exports"] += 1
            except Exception as e:  # the destination then recomputes the prefix
                plane.counters["transfer_export_failures"] += 1
                log.warning("export of op %d from worker %d failed (%s); recomputing", op.op_id, src.worker_id, e)
    try:
        await call(dst.actor.prefill.remote(f"copy-{op.op_id}", ids, params, True))
    except Exception as e:
        dst.blocks.forget(op.op_id)
        plane.events.cache_op_failed(op.op_id, f"copy prefill failed: {e}")
        return
    plane.counters["copy_prefills"] += 1
    watch(plane, dst, op.op_id)
