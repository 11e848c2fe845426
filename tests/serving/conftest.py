"""Fixtures of the serving tests (the server and its helpers: server_harness.py).

Servers: ``server_factory`` (module-scoped: a module's own servers) and ``shared_server`` (one per session).
Modules on the shared server take the function-scoped ``shared`` fixture, never ``shared_server`` directly: it
gives every test the same starting state whatever ran before (no holds, nothing in flight, every worker ACTIVE,
the initial layout CP2 on ranks 0-1 + CP1 on rank 2 + CP1 on rank 3, restored by admin reconfigurations when an
earlier test left another). Counters on a shared server are compared as deltas (``Server.counters``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from server_harness import Server, restore_canonical, start_server, stop_server


@pytest.fixture(scope="module")
def server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """``server_factory(overrides)`` starts one server for the module; all are stopped at module end."""
    started: list[Server] = []

    def make(overrides: dict[str, Any] | None = None) -> Server:
        s = start_server(tmp_path_factory.mktemp("server"), overrides)
        started.append(s)
        return s

    yield make
    for s in started:
        stop_server(s.proc)


@pytest.fixture(scope="session")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The server test_server_e2e.py and test_server_reconfig_faults.py share (use ``shared``): controller off
    (the composition changes only when a test orders it) and no scan-driven replication (a prefix is where the
    test put it; reconciliation after a split is then the only copy path, and it shares its export/import code
    with replication). Started once per session."""
    overrides = {"controller": {"enabled": False}, "cache": {"replication": False}}
    s = start_server(tmp_path_factory.mktemp("shared-server"), overrides)
    yield s
    stop_server(s.proc)


@pytest.fixture
def shared(shared_server: Server) -> Iterator[Server]:
    """The shared server in its starting state for this test (module docstring); every hold is released after
    the test, also when it failed while holding."""
    shared_server.release()
    restore_canonical(shared_server)
    yield shared_server
    shared_server.release()
