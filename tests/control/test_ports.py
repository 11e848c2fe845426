"""vertumnus.ports: free ports drawn from below the kernel's ephemeral range (where no outgoing connection takes
them between the choice and the user's bind)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest

from vertumnus import ports


def test_a_free_port_lies_below_the_ephemeral_range_and_binds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stated = tmp_path / "ip_local_port_range"
    stated.write_text("25000\t60999\n")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE", stated)
    assert ports.private_ports() == range(20000, 25000)  # cut where this host's ephemeral range starts
    port = ports.free_port("127.0.0.1", random.Random(7))
    assert 20000 <= port < 25000
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # free: the caller can bind it
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE", tmp_path / "absent")
    assert ports.private_ports() == range(20000, 32768)  # no statement: below Linux's default


def test_a_taken_draw_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        monkeypatch.setattr(ports, "private_ports", lambda: range(taken, taken + 1))
        # every draw is the held port: after the tries the OS picks one
        port = ports.free_port("127.0.0.1", random.Random(1))
        assert port != taken
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
