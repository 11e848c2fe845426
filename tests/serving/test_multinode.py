"""The pool across several Ray nodes, on a real multi-node Ray cluster on this machine (tests/serving/ray_cluster.py:
``ray start --head`` plus two ``ray start --address`` worker nodes, each in its own process group, token auth).

``vertumnus serve --address <head>`` runs a pool of 2 nodes × 2 CPU rank slots with
``serving.ray_node_resource: vertumnus_pool_node``; each worker node offers one unit of it, the head none. Shown:

1. placement, from Ray's own state (the GCS node and actor tables): pool node k's ranks all on one Ray node, the two
   pool nodes on distinct worker nodes, no rank on the head; /v1/pool's ``engine_stats.ray_nodes`` says the same;
2. a split and a merge on a pool node away from the head while a request stream is answered throughout;
3. a lost node: SIGKILL of every process of the Ray node hosting pool node 1 while its worker runs one prefill and
   has more queued (made so by holding every worker at START). Its worker goes FAILED, the held requests are
   re-placed on pool node 0 and every request is answered exactly once and correctly; the cache manager no
   longer lists the lost worker's blocks; /v1/pool and /metrics show the node unplaced. Then ``ray start`` again:
   Ray places the pool node's group on the new node, its worker returns ACTIVE under a new epoch with ranks on
   the new Ray node, and serves;
4. fewer Ray nodes than ``pool.nodes``: ``vertumnus serve`` exits at once with an error naming the resource.

Teardown stops the server and every node and checks that no process of the cluster is left."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from ray_cluster import RayCluster
from server_harness import WAIT_S, Server, complete_greedy, launch_server, start_server, stop_server
from serving_reference import generate, tokenizer

from vertumnus.serving.tokenizer import EOS

pytestmark = pytest.mark.slow

MARK = "vertumnus_pool_node"
POOL = {
    "pool": {"nodes": 2, "gpus_per_node": 2, "degrees": [1, 2], "initial_composition": "2xCP2"},
    "controller": {"enabled": False},  # the composition changes only when the test orders it
    "cache": {"replication": False},
    "serving": {"cpu_slots": 4, "ray_node_resource": MARK},
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    """Head (2 CPUs: the server's decode actor and a spare; no pool resource) + worker nodes a and b (2 CPU
    slots and one unit of the pool resource each)."""
    c = RayCluster(tmp_path_factory.mktemp("ray-cluster"), head_cpus=2)
    try:
        c.add_node("a", 2, {MARK: 1})
        c.add_node("b", 2, {MARK: 1})
        yield c
    finally:
        left = c.stop()
        assert not left, f"processes of the cluster still alive after stop: {sorted(left)}"


@pytest.fixture(autouse=True)
def nodes_up(cluster: RayCluster) -> None:
    """Every worker node up before each test (one an earlier test lost is back, one the GCS declared dead on its
    own under load is started again): a test starts from the cluster the module set up, not from what the last
    one left."""
    for name, node in cluster.nodes.items():
        if node.lost:
            cluster.restart_node(name)
    cluster.ensure_alive()


@pytest.fixture(scope="module")
def server(cluster: RayCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(tmp_path_factory.mktemp("multinode-server"), POOL, address=cluster.address, env=cluster.env)
    yield s
    stop_server(s.proc)


def _rank_nodes(cluster: RayCluster, server: Server) -> dict[int, str]:
    """global rank → Ray node id of the live rank actors (the GCS actor table)."""
    prefix = f"vertumnus-{server.proc.pid}-rank-"
    return {
        int(name[len(prefix) :].split(".")[0]): a["node"]
        for name, a in cluster.actors(prefix).items()
        if a["state"] == "ALIVE"
    }


def _until(pred: Any, what: str, probe: Any) -> Any:
    deadline = time.monotonic() + WAIT_S
    while True:
        got = probe()
        if pred(got):
            return got
        assert time.monotonic() < deadline, f"not within {WAIT_S:.0f} s: {what}; last: {got}"
        time.sleep(0.05)


class Stream:
    """Sequential completions in a thread until stopped: a request stream answered throughout."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.answers: list[tuple[str, list[int]]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        c = openai.OpenAI(base_url=self.server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
        i = 0
        while not self._stop.is_set():
            prompt = f"stream {i}: " + " ".join(f"s{(i * 7 + j) % 53}" for j in range(40))
            try:
                r = c.completions.create(
                    model="vertumnus-tiny", prompt=prompt, max_tokens=3, temperature=0,
                    extra_body={"return_token_ids": True},
                )  # fmt: skip
                self.answers.append((prompt, list(r.choices[0].token_ids)))  # type: ignore[attr-defined]
            except Exception as e:  # every failure is a test failure, reported below
                self.errors.append(f"{type(e).__name__}: {e}")
            i += 1
        c.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=WAIT_S)


def test_pool_nodes_map_to_distinct_ray_nodes_and_split_merge_away_from_the_head_while_serving(
    cluster: RayCluster, server: Server
) -> None:
    ids = cluster.node_ids()
    pool = server.get("/v1/pool")
    placed = pool["engine_stats"]["ray_nodes"]
    assert [p["state"] for p in placed] == ["created", "created"], placed
    hosts = [p["ray_node_id"] for p in placed]
    assert sorted(hosts) == sorted([ids["a"], ids["b"]]), (placed, ids)  # distinct worker nodes, not the head
    ranks = _rank_nodes(cluster, server)
    assert ranks == {0: hosts[0], 1: hosts[0], 2: hosts[1], 3: hosts[1]}, (ranks, hosts)
    assert sorted((w["node"], w["degree"], w["ranks"]) for w in pool["workers"]) == [(0, 2, [0, 1]), (1, 2, [2, 3])]

    cfg = server.cfg.model
    tok = tokenizer(cfg)
    stream = Stream(server)
    try:
        _until(lambda n: n >= 2, "the stream answers", lambda: len(stream.answers))
        (w1,) = [w for w in server.get("/v1/pool")["workers"] if w["node"] == 1]
        server.reconfigure("split", w1["id"])
        split = server.get("/v1/pool")
        assert sorted((w["degree"], w["ranks"]) for w in split["workers"] if w["node"] == 1) == [(1, [2]), (1, [3])]
        n_split = len(stream.answers)
        _until(lambda n: n >= n_split + 2, "the stream answers after the split", lambda: len(stream.answers))
        (left,) = [w for w in server.get("/v1/pool")["workers"] if w["ranks"] == [2]]
        server.reconfigure("merge", left["id"])
        merged = server.get("/v1/pool")
        (back,) = [w for w in merged["workers"] if w["node"] == 1]
        assert (back["degree"], back["ranks"], back["state"]) == (2, [2, 3], "active")
        assert back["epoch"] > w1["epoch"]
        n_merge = len(stream.answers)
        _until(lambda n: n >= n_merge + 2, "the stream answers after the merge", lambda: len(stream.answers))
    finally:
        stream.stop()
    assert not stream.errors, stream.errors
    for prompt, ids_out in stream.answers:  # every answer the reference model's
        assert ids_out == generate(cfg, tok.encode(prompt), 3, [EOS]), prompt
    assert _rank_nodes(cluster, server) == ranks  # split / merge in place: no rank moved


def _prompts(tag: str, n: int) -> list[str]:
    return [f"{tag} {i}: " + " ".join(f"w{(i * 13 + j) % 97}" for j in range(60 + 10 * i)) for i in range(n)]


def test_losing_a_ray_node_replaces_its_requests_and_its_workers_return_when_it_is_back(
    cluster: RayCluster, server: Server
) -> None:
    cfg = server.cfg.model
    tok = tokenizer(cfg)
    server.wait_pool(lambda p: all(w["state"] == "active" for w in p["workers"]) and p["inflight"] == 0, "settled")
    hosts = [p["ray_node_id"] for p in server.get("/v1/pool")["engine_stats"]["ray_nodes"]]
    lost = next(name for name, i in cluster.node_ids().items() if i == hosts[1])
    # warm both workers, so that the worker about to be lost holds cached blocks the cache manager must then
    # forget: with every worker held at QUEUE, the first request queues (held) on one worker, the second goes to
    # the other (equal idle workers, the first one's queue is longer)
    asyncio.run(_one_on_each(server, _prompts("warm", 2)))
    before = {w["node"]: w for w in server.get("/v1/pool")["workers"]}
    assert before[1]["cached_blocks"] > 0 and before[0]["cached_blocks"] > 0, before
    counters = server.counters()

    prompts = _prompts("lost", 6)
    expected = [generate(cfg, tok.encode(p), 3, [EOS]) for p in prompts]

    async def run() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        server.hold(at="start")  # every worker: a running prefill stays running, the rest queue behind it
        traffic = asyncio.create_task(complete_greedy(server, prompts, 3))

        def spread(p: dict[str, Any]) -> bool:
            by = {w["node"]: w for w in p["workers"]}
            return p["placed"] == len(prompts) and all(by[n]["running"] for n in (0, 1)) and by[1]["queued"] >= 2

        seen["placed"] = await asyncio.to_thread(
            server.wait_pool, spread, "all placed, a prefill running on each node and more queued on node 1"
        )
        cluster.lose_node(lost)
        seen["failed"] = await asyncio.to_thread(
            server.wait_pool,
            lambda p: (
                [w["state"] for w in p["workers"] if w["node"] == 1] == ["failed"]
                and p["engine_stats"]["ray_nodes"][1]["ray_node_id"] is None
            ),
            "pool node 1's worker FAILED and its placement group unplaced",
        )
        seen["metrics"] = server.get("/metrics")
        seen["health"] = httpx.get(server.url + "/health", timeout=60).status_code
        server.release()
        seen["answers"] = await traffic
        return seen

    seen = asyncio.run(run())
    failed = seen["failed"]
    (gone,) = [w for w in failed["workers"] if w["node"] == 1]
    assert gone["cached_blocks"] == 0 and gone["queued"] == 0 and gone["running"] is None, gone
    assert failed["engine_stats"]["ray_nodes"][1]["state"] in ("rescheduling", "pending"), failed["engine_stats"]
    assert failed["engine_stats"]["ray_nodes"][0] == {"node": 0, "ray_node_id": hosts[0], "state": "created"}
    assert 'vertumnus_pool_node_placed{node="1"} 0.0' in seen["metrics"]
    assert 'vertumnus_pool_node_placed{node="0"} 1.0' in seen["metrics"]
    assert 'vertumnus_workers{degree="2",state="failed"} 1.0' in seen["metrics"]
    assert seen["health"] == 200  # pool node 0 serves on
    # every request answered exactly once, correctly: one completed prefill each, nothing failed
    assert [a.choices[0].token_ids for a in seen["answers"]] == expected
    assert counters.delta("vertumnus_requests_total", 'outcome="ok"') == len(prompts)
    assert counters.delta("vertumnus_requests_total", 'outcome="error"') == 0
    assert counters.delta("vertumnus_prefill_seconds_count", 'degree="2"') == len(prompts)
    assert counters.delta("vertumnus_worker_failures_total") == 1

    # the node comes back: `ray start` again on the same host (a new Ray node id, one unit of the resource)
    cluster.restart_node(lost)
    back, new_id = _until_back(cluster, server, lost)
    assert new_id != hosts[1]
    (w1,) = [w for w in back["workers"] if w["node"] == 1]
    assert (w1["degree"], w1["ranks"]) == (2, [2, 3]) and w1["epoch"] > before[1]["epoch"]
    ranks = _rank_nodes(cluster, server)
    assert ranks == {0: hosts[0], 1: hosts[0], 2: new_id, 3: new_id}, (ranks, hosts, new_id)
    assert 'vertumnus_pool_node_placed{node="1"} 1.0' in server.get("/metrics")
    # and serves: hold pool node 0 so that the request goes to the returned worker
    (w0,) = [w for w in back["workers"] if w["node"] == 0]
    server.hold([w0["id"]], at="queue")
    blocker = asyncio.run(_one_on_held(server, w0["id"]))
    assert blocker == "ok"


def _until_back(cluster: RayCluster, server: Server, lost: str) -> tuple[dict[str, Any], str]:
    """/v1/pool once pool node 1 is placed on the restarted Ray node ``lost`` and every worker is ACTIVE, and that
    node's id. Should the node exit again on its own (see :meth:`RayCluster.ensure_alive`), it is started again and
    the wait goes on for the new node: what is tested is the pool's return to a node that is back."""
    deadline, again = time.monotonic() + WAIT_S, 0
    while True:
        if cluster.ensure_alive():
            again += 1
            assert again <= 2, f"the Ray node {lost} keeps exiting:\n{cluster.logs()}"
            deadline = time.monotonic() + WAIT_S
        node_id = cluster.node_ids().get(lost)
        pool = server.get("/v1/pool")
        placed = pool["engine_stats"]["ray_nodes"][1]["ray_node_id"]
        if node_id is not None and placed == node_id and all(w["state"] == "active" for w in pool["workers"]):
            return pool, node_id
        assert time.monotonic() < deadline, (
            f"not within {WAIT_S:.0f} s: pool node 1 placed on the new Ray node {node_id} and its worker ACTIVE "
            f"again; pool: {pool}\n{cluster.logs()}"
        )
        time.sleep(0.25)


async def _one_on_each(server: Server, prompts: list[str]) -> None:
    """Hold every worker at QUEUE, send ``prompts`` (one per worker), wait until each worker has one queued,
    release. A queued job keeps its whole predicted time in q_w (a running one's decays with the clock), so each
    prompt after the first sees the workers already given one as longer queues, however late it is placed."""
    server.hold(at="queue")
    traffic = asyncio.create_task(complete_greedy(server, prompts, 2))
    await asyncio.to_thread(
        server.wait_pool,
        lambda p: p["placed"] == len(prompts) and all(w["queued"] == 1 for w in p["workers"]),
        "one request queued (held) on each worker",
    )
    server.release()
    await traffic


async def _one_on_held(server: Server, held: int) -> str:
    """With worker ``held`` held at QUEUE: one request queues on it, the next goes to the other (lower queue)
    and is answered while the first waits; then release and both are answered."""
    first = asyncio.create_task(complete_greedy(server, ["queued behind the hold"], 2))
    await asyncio.to_thread(
        server.wait_pool,
        lambda p: any(w["id"] == held and w["queued"] == 1 for w in p["workers"]),
        "the first request queued on the held worker",
    )
    (r,) = await complete_greedy(server, ["served by the returned node " + "x " * 30], 2)
    server.release()
    await first
    return "ok" if r.choices[0].finish_reason in ("stop", "length") else "bad"


def test_fewer_ray_nodes_than_pool_nodes_is_a_clear_error_at_start(cluster: RayCluster, tmp_path: Path) -> None:
    """pool.nodes 3 on a cluster with two Ray nodes offering the resource: exit at once, no traceback, the
    missing resource named (not a placement group waiting forever)."""
    over = {**POOL, "pool": {**POOL["pool"], "nodes": 3, "initial_composition": "3xCP2"}}
    over["serving"] = {**POOL["serving"], "cpu_slots": 6}
    proc, _, log, _ = launch_server(tmp_path, over, address=cluster.address, env=cluster.env)
    rc = proc.wait(timeout=WAIT_S)
    text = log.read_text(errors="replace")
    assert rc != 0, text
    assert "Traceback" not in text, text
    assert "pool.nodes=3 needs 3 alive Ray nodes, each offering the resource 'vertumnus_pool_node'" in text, text
    assert "the cluster has 2" in text, text
