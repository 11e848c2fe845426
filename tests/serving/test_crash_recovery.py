"""A real crash of a rank process (SIGKILL of a ``ray::RankActor`` found through Ray's actor table), on a
server of its own (a crash damages the shared one): the pool is one CP4 worker, so the crash leaves no worker
that can serve. The accepted requests wait (re-placed, FCFS) and are all answered, once and correctly, after
the restart; meanwhile /health and /ready say 503 with the reason, /live 200, and new requests get 503 at once;
then 200 again. Before: the restart collided with the crashed actor's still-registered name
(``ActorAlreadyExistsError``), the worker stayed FAILED, requests hung and /health kept answering 200.

Also here: a tokenizer whose vocabulary exceeds the model's is a start-up error (before: accepted, and one
request with an id past the model's vocabulary failed every worker it was re-placed on), and out-of-vocabulary
prompt ids are a 400 that never reaches a worker.

The outage is *made* observable, not hoped for: every worker is held at START (serving.test_hooks), which also
holds a restarting worker once its ranks are back, until the test releases it. The recovery time is measured
once without holds (printed; docs/serving.md "Failures and recovery" has the figure)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from server_harness import REPO, TEST_CONFIG, WAIT_S, Server, complete_greedy, merge
from serving_reference import generate, tokenizer

from vertumnus.serving.tokenizer import EOS

pytestmark = pytest.mark.slow

# the GCS actor table of the server's cluster (the server's local cluster has no dashboard, which
# ray.util.state.list_actors needs; the table is what that API reads): rank actor name -> pid of the live ones
PIDS = """
import json, sys
import ray
from ray._private import state
ray.init(address=sys.argv[1], namespace="vertumnus", log_to_driver=False)
print("ready", flush=True)
for line in sys.stdin:
    prefix = line.strip()
    alive = {a["Name"]: a["Pid"] for a in state.actors().values()
             if a["ActorClassName"] == "RankActor" and a["State"] == "ALIVE" and a["Name"].startswith(prefix)}
    print(json.dumps(alive), flush=True)
"""


class RankPids:
    """A process connected to the server's Ray cluster that lists the live rank actors' pids on demand."""

    def __init__(self, server: Server) -> None:
        env = {**os.environ, "RAY_AUTH_MODE": "token"}  # the server's local cluster uses ~/.ray/auth_token
        self.prefix = f"vertumnus-{server.proc.pid}-rank-"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", PIDS, server.ray_address],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"

    def by_rank(self) -> dict[int, tuple[str, int]]:
        """rank -> (actor name, pid) of every live rank actor of the server."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(self.prefix + "\n")
        self.proc.stdin.flush()
        alive: dict[str, int] = json.loads(self.proc.stdout.readline())
        return {int(name[len(self.prefix) :].split(".")[0]): (name, pid) for name, pid in alive.items()}

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def crash(server_factory: Any) -> Server:
    """One CP4 worker over the 4 rank slots; no controller, no replication (nothing moves on its own)."""
    return server_factory(
        {"pool": {"initial_composition": "1xCP4"}, "controller": {"enabled": False}, "cache": {"replication": False}}
    )


@pytest.fixture
def pids(crash: Server) -> Any:
    p = RankPids(crash)
    yield p
    p.close()


def _prompts(tag: str, n: int, words: int) -> list[str]:
    return [f"{tag} {i}: " + " ".join(f"w{(i * 11 + j) % 89}" for j in range(words + 20 * i)) for i in range(n)]


async def _until(h: httpx.AsyncClient, path: str, pred: Any, what: str) -> Any:
    deadline = time.monotonic() + WAIT_S
    while True:
        body = (await h.get(path)).json()
        if pred(body):
            return body
        assert time.monotonic() < deadline, f"not within {WAIT_S:.0f} s: {what}; {path}: {body}"
        await asyncio.sleep(0.02)


def test_rank_actors_run_at_the_servers_priority(crash: Server, pids: RankPids) -> None:
    """Ray starts its workers at nice 15 by default; the rank actors are the engine, so the cluster the server
    starts runs them at nice 0 (otherwise any nice-0 CPU-bound process starves a replacement rank's start)."""
    ranks = pids.by_rank()
    assert sorted(ranks) == [0, 1, 2, 3]
    assert {r: os.getpriority(os.PRIO_PROCESS, pid) for r, (_, pid) in ranks.items()} == {r: 0 for r in ranks}
    assert os.getpriority(os.PRIO_PROCESS, crash.proc.pid) == 0


def test_sigkill_of_a_rank_of_the_only_worker_is_recovered_and_health_tells_the_truth(
    crash: Server, pids: RankPids
) -> None:
    cfg = crash.cfg.model
    tok = tokenizer(cfg)
    prompts = _prompts("crash", 5, 150)
    expected = [generate(cfg, tok.encode(p), 4, [EOS]) for p in prompts]
    counters = crash.counters()
    (before,) = crash.get("/v1/pool")["workers"]
    assert before["degree"] == 4 and before["state"] == "active"
    old = pids.by_rank()
    assert sorted(old) == [0, 1, 2, 3]

    async def run() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with httpx.AsyncClient(base_url=crash.url, timeout=60, headers=crash.admin) as h:
            crash.hold(at="start")
            traffic = asyncio.create_task(complete_greedy(crash, prompts, 4))
            await _until(
                h,
                "/v1/pool",
                lambda p: p["placed"] == len(prompts) and p["workers"][0]["running"],
                "every request placed on the CP4, its first prefill running (held at its start)",
            )
            os.kill(old[2][1], signal.SIGKILL)  # rank 2's process: a crash, not ray.kill
            seen["failed"] = await _until(
                h,
                "/v1/pool",
                lambda p: p["workers"][0]["state"] == "failed" and p["backlog"] == len(prompts),
                "the worker FAILED, every accepted request waiting for it (re-placed)",
            )
            await _until(
                h,
                "/v1/test/holds",
                lambda s: {"worker": before["id"], "request": "restart"} in s["waiting"],
                "the restart's ranks back (held before the worker is assigned again)",
            )
            for path in ("/health", "/ready", "/live"):
                r = await h.get(path)
                seen[path] = (r.status_code, r.json())
            r = await h.post("/v1/completions", json={"model": "vertumnus-tiny", "prompt": "hi", "max_tokens": 2})
            seen["new"] = (r.status_code, r.json(), r.headers.get("retry-after"))
            seen["ranks_back"] = pids.by_rank()
            crash.release()
            seen["answers"] = await traffic
            r = await h.get("/health")
            seen["health_after"] = (r.status_code, r.json())
        return seen

    seen = asyncio.run(run())
    status, body = seen["/health"]
    assert status == 503 and body["status"] == "unavailable", body
    assert body["reason"].startswith("no prefill worker can serve, restarting (worker 0: a rank process died")
    assert seen["/ready"] == seen["/health"]
    assert seen["/live"] == (200, {"status": "alive"})
    status, err, retry = seen["new"]
    assert (status, err["error"]["code"], retry) == (503, "no_worker_available", "5")
    assert "Traceback" not in json.dumps(err) and "pid" not in json.dumps(body)
    # the crashed rank came back under a fresh name (the crashed actor's may still be registered); the idle
    # survivors answered the restart's probe and were kept (regrouped, not restarted)
    back = seen["ranks_back"]
    assert back[2][0] == f"{old[2][0]}.1" and back[2][1] != old[2][1], (old, back)
    assert {r: back[r] for r in (0, 1, 3)} == {r: old[r] for r in (0, 1, 3)}, (old, back)
    # every accepted request answered, correctly, exactly once; nothing failed
    assert [a.choices[0].token_ids for a in seen["answers"]] == expected
    assert counters.delta("vertumnus_requests_total", 'outcome="ok"') == len(prompts)
    assert counters.delta("vertumnus_requests_total", 'outcome="error"') == 0
    assert counters.delta("vertumnus_requests_total", 'outcome="unavailable"') == 1
    assert counters.delta("vertumnus_worker_failures_total") == 1
    assert seen["health_after"] == (200, {"status": "ok"})
    (after,) = crash.get("/v1/pool")["workers"]
    assert after["state"] == "active" and after["epoch"] > before["epoch"] and after["ranks"] == [0, 1, 2, 3]


def test_recovery_time_after_sigkill_of_each_rank_without_holds(crash: Server, pids: RankPids) -> None:
    """No hold: SIGKILL one rank (a different one each round), poll /health until it has been 503 and is 200
    again, then a request is answered correctly. The figure goes to docs/serving.md; not asserted (no timed
    assertions)."""
    cfg = crash.cfg.model
    tok = tokenizer(cfg)
    times: list[float] = []
    for victim in (0, 3):
        ranks = pids.by_rank()
        t0 = time.monotonic()
        os.kill(ranks[victim][1], signal.SIGKILL)
        deadline = t0 + WAIT_S
        saw_503 = False
        while True:
            code = httpx.get(crash.url + "/health", timeout=60).status_code
            saw_503 = saw_503 or code == 503
            if saw_503 and code == 200:
                break
            assert time.monotonic() < deadline, "the pool did not recover"
            time.sleep(0.05)
        prompt = f"after the crash of rank {victim}"
        (answer,) = asyncio.run(complete_greedy(crash, [prompt], 4))
        times.append(time.monotonic() - t0)
        assert answer.choices[0].token_ids == generate(cfg, tok.encode(prompt), 4, [EOS])
    print(f"\nrecovery after SIGKILL (kill -> first answer): {', '.join(f'{t:.1f} s' for t in times)}")
    print("".join(line for line in crash.log_text().splitlines(keepends=True) if "restarted under epoch" in line))


def test_prompt_ids_outside_the_vocabulary_are_a_400_that_reaches_no_worker(crash: Server) -> None:
    counters = crash.counters()
    r = httpx.post(
        crash.url + "/v1/completions",
        json={"model": "vertumnus-tiny", "prompt": [1, 2, 700], "max_tokens": 2},
        timeout=60,
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_token_ids"
    assert counters.delta("vertumnus_worker_failures_total") == 0
    assert all(w["state"] == "active" for w in crash.get("/v1/pool")["workers"])


def _big_tokenizer(d: Path, size: int) -> None:
    """A word-level Hugging Face tokenizer of ``size`` ids (nothing downloaded)."""
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[UNK]": 0, "</s>": 1, **{f"w{i}": i + 2 for i in range(size - 2)}}
    t = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    t.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=t, unk_token="[UNK]", eos_token="</s>").save_pretrained(d)


def test_a_tokenizer_larger_than_the_model_vocabulary_is_a_start_up_error(tmp_path: Path) -> None:
    tok_dir = tmp_path / "tok"
    _big_tokenizer(tok_dir, 1062)
    data = merge(yaml.safe_load(TEST_CONFIG.read_text()), {"serving": {"tokenizer": str(tok_dir)}})
    cfg_path = tmp_path / "server.yaml"
    cfg_path.write_text(yaml.safe_dump(data))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    cmd = [sys.executable, "-m", "vertumnus.cli.main", "serve", "--config", str(cfg_path), "--port", "0"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    assert proc.stdout is not None
    out: list[str] = []
    for line in proc.stdout:  # until it exits (fixed) or serves (before: nothing was checked)
        out.append(line)
        if line.startswith("Vertumnus is serving"):
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=120)
            pytest.fail("the server started with a tokenizer larger than the model's vocabulary:\n" + "".join(out))
    assert proc.wait(timeout=120) != 0
    text = "".join(out)
    assert "has a vocabulary of 1062 token ids, the model 'vertumnus-tiny' only 512" in text, text
    assert "Traceback" not in text and "Ray cluster" not in text, text  # refused before Ray starts
