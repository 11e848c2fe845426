"""A real multi-node Ray cluster on this machine, started as an operator would: ``ray start --head --block`` and
``ray start --address ... --block`` per worker node, each in a process group of its own (``start_new_session``) so
that one node can be lost as a host is (SIGKILL of its whole group: raylet, its object store, its workers) while
the others run on. Shared by the tests that need Ray outside the server process (multi-node pool, ``serve run``).

- Auth: token mode with the test's own token in the environment of every ``ray start``, of the server and of the
  probe (Ray 2.60's ``ray start`` refuses token mode without a token; a driver without it is refused).
- Node death: the head's GCS health-checks raylets every 1 s and declares a node dead after 5 missed checks, so a
  lost node is noticed in ~6 s instead of Ray's default ~30 s (GCS settings, not a test-side wait). A node the
  GCS declared dead on its own (a raylet starved past that under heavy load exits) is started again by
  :meth:`RayCluster.ensure_alive`, as an operator (KubeRay) restarts a dead pod; a head whose ``ray start`` gives
  up during startup (Ray's registration deadline, 30 s unless ``REGISTER_ENV`` extends it, passed on a loaded
  machine) likewise (:func:`start_head`, shared with the ``serve run`` test).
- Nodes are told apart by a custom resource naming them (``vt_ray_node_<name>``) and, for the nodes meant to host a
  pool node, the pool's anti-affinity resource (``serving.ray_node_resource``).
- Teardown: every node's group is stopped (SIGINT, then SIGKILL), and any process still mentioning the cluster's
  temp dir is killed, so no Ray process outlives the fixture.

Process-table helpers (``descendants``, ``alive``, ``mentioning``) are here too: the teardown checks use them."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vertumnus.ports import free_port

START_TIMEOUT_S = 420.0  # bound of a wait for a node to register (a failure bound; ~5-20 s on a quiet machine)
STOP_TIMEOUT_S = 120.0
# GCS health checks of raylets (head only): period, timeout, misses before a node is dead
# (~6 s of silence: a lost node is noticed fast, while a live raylet starved for a second or two on a loaded 2-core
# machine is not declared dead — it then exits, and its pool node could not be placed again)
HEALTH_ENV = {
    "RAY_health_check_initial_delay_ms": "1000",
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "2000",
    "RAY_health_check_failure_threshold": "5",
}
# every node: Ray workers at nice 0 (Ray's default 15 lets any nice-0 process starve the rank actors), as
# docs/serving.md tells operators to start their nodes
NODE_ENV = {"RAY_worker_niceness": "0"}
# every `ray start`: how long its registration check waits for the node to appear in the GCS. Ray polls once per
# call for raylet_start_wait_time_s (default 10 s) inside a hard-coded 30-s loop (ray/_private/node.py); on the
# 2-core machine beside two CPU-bound simulations a restarted worker node took longer, three times in a row. A
# longer poll moves that deadline (it is a failure bound: a quiet start registers in ~5 s).
REGISTER_ENV = {"RAY_raylet_start_wait_time_s": "120"}


def tool(name: str) -> str:
    """This interpreter's console script (``ray``, ``serve``), else the one on PATH."""
    mine = Path(sys.executable).parent / name
    found = str(mine) if mine.exists() else shutil.which(name)
    assert found, f"`{name}` not found (install the serve extra: pip install -e '.[serve]')"
    return found


def default_sigint() -> None:
    """preexec_fn: a shell running pytest in the background starts it with SIGINT ignored, which children
    inherit; Python then never raises KeyboardInterrupt, and `serve run` / `ray start --block` stop cleanly only
    on it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _procs() -> dict[int, tuple[int, str]]:
    """pid → (parent pid, state) of every live process (Linux /proc)."""
    out: dict[int, tuple[int, str]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(d.name)] = (int(fields[1]), fields[0])
    return out


def descendants(root: int) -> set[int]:
    procs = _procs()
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        kids.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = [root]
    while todo:
        for k in kids.get(todo.pop(), []):
            if k not in found:
                found.add(k)
                todo.append(k)
    return found


def alive(pids: set[int]) -> set[int]:
    """Those of ``pids`` still running (zombies count as gone)."""
    procs = _procs()
    return {p for p in pids if p in procs and procs[p][1] != "Z"}


def mentioning(text: str) -> set[int]:
    """Live processes whose command line contains ``text``."""
    out: set[int] = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and d.name != str(os.getpid()):
            try:
                if text.encode() in (d / "cmdline").read_bytes():
                    out.add(int(d.name))
            except OSError:
                continue
    return alive(out)


def stop_process(proc: subprocess.Popen[bytes]) -> int:
    """SIGINT, then kill after STOP_TIMEOUT_S; the exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
    return proc.returncode


HEAD_ATTEMPTS = 3


def start_head(
    cmd: Callable[[int], list[str]], log: Path, temp_dir: str, env: dict[str, str], cwd: Path
) -> tuple[subprocess.Popen[bytes], int, list[str]]:
    """``ray start --head --block`` (``cmd(port)``: the command for a GCS port) until it prints "Ray runtime
    started"; the process, its GCS port and the command that ran. Ray gives the head's raylet 30 s to register
    with the GCS (longer with ``REGISTER_ENV`` in ``env``); on a loaded 2-core machine that can pass, and
    ``ray start`` exits ("timed out during startup"). The attempt's leftovers are then killed and the head
    started again on a fresh port, as an operator restarts a head pod, up to HEAD_ATTEMPTS times."""
    for attempt in range(1, HEAD_ATTEMPTS + 1):
        port = free_port()
        argv = cmd(port)
        with log.open("ab") as out:
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                start_new_session=True, preexec_fn=default_sigint,
            )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_S
        while "Ray runtime started" not in log.read_text(errors="replace"):
            if proc.poll() is not None:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"ray head: not within {START_TIMEOUT_S:.0f} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.3)
        else:
            return proc, port, argv
        for pid in descendants(proc.pid) | mentioning(temp_dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        print(f"ray head exited during startup ({proc.returncode}), attempt {attempt}", file=sys.stderr)
    raise RuntimeError(f"ray head did not start ({HEAD_ATTEMPTS} attempts):\n{log.read_text()[-3000:]}")


# the probe: a driver on the cluster answering questions about Ray's own state (GCS node and actor tables) on
# stdin/stdout, so the test process itself never becomes a Ray driver
PROBE = """
import json, sys
import ray
from ray._private import state
ray.init(address=sys.argv[1], namespace="vertumnus", log_to_driver=False)
print("\\nready", flush=True)
for line in sys.stdin:
    q = line.strip()
    if q == "nodes":
        out = [{"id": n["NodeID"], "alive": n["Alive"], "resources": n.get("Resources", {})} for n in ray.nodes()]
    else:  # actors whose name starts with q: name -> {node, pid, state}
        out = {a["Name"]: {"node": a["Address"]["NodeID"], "pid": a["Pid"], "state": a["State"]}
               for a in state.actors().values() if a["Name"].startswith(q)}
    print("\\nanswer " + json.dumps(out), flush=True)
"""


@dataclass
class RayNode:
    name: str
    cmd: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    pids: set[int] = field(default_factory=set)  # every process of the node seen so far (for teardown)
    lost: bool = False  # lost on purpose (lose_node) until restarted: ensure_alive leaves it down


class RayCluster:
    """See module docstring. ``head_cpus`` CPUs on the head (the server's decode actor and spare), then
    :meth:`add_node` per worker node."""

    def __init__(self, root: Path, head_cpus: int = 2) -> None:
        # Ray's socket paths must stay short (AF_UNIX): the temp dir is a fresh one directly under /tmp
        self.temp_dir = tempfile.mkdtemp(prefix="vt-mn-")
        self.root = root
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "RAY_TMPDIR": self.temp_dir}
        self.env.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32), **NODE_ENV, **REGISTER_ENV})
        for k in ("RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS"):
            self.env.pop(k, None)
        self.nodes: dict[str, RayNode] = {}
        self._probe: subprocess.Popen[str] | None = None

        def head(port: int) -> list[str]:
            return [
                *(tool("ray"), "start", "--head", "--block", "--temp-dir", self.temp_dir, "--port", str(port)),
                *("--num-cpus", str(head_cpus), "--num-gpus", "0", "--resources", json.dumps({"vt_ray_node_head": 1})),
                *("--ray-client-server-port", str(free_port()), "--dashboard-agent-listen-port", str(free_port())),
                *("--min-worker-port", "0", "--max-worker-port", "0", "--include-dashboard=false"),
                "--disable-usage-stats",
            ]

        log = root / "ray-head.log"
        proc, self.port, argv = start_head(head, log, self.temp_dir, {**self.env, **HEALTH_ENV}, root)
        self.address = f"127.0.0.1:{self.port}"
        self.nodes["head"] = RayNode("head", argv, log, proc, {proc.pid})

    def _start(self, node: RayNode, env: dict[str, str]) -> None:
        with node.log.open("ab") as out:
            node.proc = subprocess.Popen(
                node.cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=self.root,
                start_new_session=True, preexec_fn=default_sigint,
            )  # fmt: skip
        node.pids.add(node.proc.pid)

    def _wait(self, ready: Any, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready():
            for n in self.nodes.values():
                if n.proc is not None and n.proc.poll() is not None and n.name == "head":
                    raise RuntimeError(f"{what}: the head exited with {n.proc.returncode}:\n{self.logs()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: not within {START_TIMEOUT_S:.0f} s:\n{self.logs()}")
            time.sleep(0.3)

    def add_node(self, name: str, cpus: int, resources: dict[str, float] | None = None) -> None:
        """Start worker node ``name`` (``cpus`` CPU slots, ``resources`` besides its naming resource) and wait
        until the GCS lists it alive."""
        res = {f"vt_ray_node_{name}": 1, **(resources or {})}
        cmd = [
            *(tool("ray"), "start", "--address", self.address, "--block", "--num-cpus", str(cpus)),
            *("--num-gpus", "0", "--resources", json.dumps(res), "--min-worker-port", "0", "--max-worker-port", "0"),
            "--disable-usage-stats",
        ]
        self.nodes[name] = RayNode(name, cmd, self.root / f"ray-{name}.log")
        self.restart_node(name)

    def restart_node(self, name: str, attempts: int = 3) -> None:
        """(Re)start a worker node with its original command and wait until it is alive in the GCS. A
        ``ray start`` that gives up (on a loaded machine its raylet can miss the 30-s registration deadline) is
        started again, as an operator or KubeRay would, up to ``attempts`` times."""
        node = self.nodes[name]
        node.lost = False
        for attempt in range(1, attempts + 1):
            self._start(node, self.env)
            proc = node.proc
            assert proc is not None
            self._wait(lambda p=proc: self.node_alive(name) or p.poll() is not None, f"ray node {name}")  # type: ignore[misc]
            if proc.poll() is None:
                return
            node.pids |= descendants(proc.pid)
            if attempt == attempts:
                raise RuntimeError(f"ray node {name} did not start ({attempts} attempts):\n{self.logs()}")

    def lose_node(self, name: str) -> None:
        """A lost host: SIGKILL of every process of the node (its process group and any descendant that left
        it); nothing is told to the GCS, which finds out by its health checks."""
        node = self.nodes[name]
        assert node.proc is not None and name != "head"
        node.lost = True
        node.pids |= descendants(node.proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.proc.pid, signal.SIGKILL)
        for pid in alive(node.pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        node.proc.wait(timeout=30)

    def ensure_alive(self) -> list[str]:
        """Start again every worker node whose ``ray start`` exited although no test lost it (its raylet was
        declared dead by the GCS, e.g. starved on a loaded machine); the names restarted, to report."""
        down: list[str] = []
        for node in self.nodes.values():
            proc = node.proc
            if node.name == "head" or node.lost or proc is None or proc.poll() is None:
                continue
            print(f"ray node {node.name} exited on its own ({proc.returncode}); starting it again", file=sys.stderr)
            down.append(node.name)
            self.restart_node(node.name)
        return down

    # -- Ray's own state (GCS tables) through the probe ---------------------------------------------------------
    def ask(self, query: str) -> Any:
        if self._probe is None:
            self._probe = subprocess.Popen(
                [sys.executable, "-c", PROBE, self.address],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self.env, text=True,
            )  # fmt: skip
            self._answer("ready")
        assert self._probe.stdin is not None
        self._probe.stdin.write(query + "\n")
        self._probe.stdin.flush()
        return json.loads(self._answer("answer "))

    def _answer(self, prefix: str) -> str:
        """The probe's next line starting with ``prefix`` (Ray may print its own lines on the same stdout)."""
        assert self._probe is not None and self._probe.stdout is not None
        while True:
            line = self._probe.stdout.readline()
            if not line:
                raise RuntimeError(f"the Ray state probe exited ({self._probe.poll()})")
            if line.startswith(prefix):
                return line[len(prefix) :]

    def node_ids(self) -> dict[str, str]:
        """name → Ray node id of every node the GCS lists alive."""
        out: dict[str, str] = {}
        for n in self.ask("nodes"):
            if n["alive"]:
                for key in n["resources"]:
                    if key.startswith("vt_ray_node_"):
                        out[key[len("vt_ray_node_") :]] = n["id"]
        return out

    def node_alive(self, name: str) -> bool:
        return name in self.node_ids()

    def actors(self, prefix: str) -> dict[str, dict[str, Any]]:
        """name → {node, pid, state} of the actors whose name starts with ``prefix`` (the GCS actor table)."""
        return dict(self.ask(prefix))

    def logs(self) -> str:
        return "\n".join(f"== {n.log.name}\n" + n.log.read_text(errors="replace")[-2000:] for n in self.nodes.values()
                         if n.log.exists())  # fmt: skip

    def stop(self) -> set[int]:
        """Stop the probe and every node (workers first, then the head); the processes of this cluster still
        alive after STOP_TIMEOUT_S (then killed)."""
        if self._probe is not None:
            if self._probe.stdin is not None:
                self._probe.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._probe.wait(timeout=60)
            if self._probe.poll() is None:
                self._probe.kill()
        pids: set[int] = set()
        for node in sorted(self.nodes.values(), key=lambda n: n.name == "head"):
            if node.proc is not None:
                node.pids |= descendants(node.proc.pid)
                stop_process(node.proc)
                pids |= node.pids
        deadline = time.monotonic() + STOP_TIMEOUT_S
        left = alive(pids) | mentioning(self.temp_dir)
        while left and time.monotonic() < deadline:
            time.sleep(0.5)
            left = alive(pids) | mentioning(self.temp_dir)
        for pid in left:  # only processes of this cluster
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        return left
