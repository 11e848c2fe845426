"""Free TCP ports that stay free until their user binds them.

A port chosen by binding port 0 comes from the kernel's ephemeral range, the same range the kernel draws the
source ports of outgoing connections from; between choosing it and the user's own bind (vLLM binds its replay
socket in its engine-core process seconds later; a test's server or Ray node binds its port after start-up) any
connection on the host can take it — on a host running Ray there are many — and the bind fails with "Address
already in use" (seen once in a clean-clone suite: a restarted vLLM engine died at start-up). Ports below the
ephemeral range and above Ray's worker ports (10002-19999 by default) are never handed out by the kernel on its
own, so a randomly drawn one that binds now is very likely still free when its user binds it.
"""

from __future__ import annotations

import contextlib
import random
import socket
from pathlib import Path

PRIVATE_PORTS = (20000, 32768)  # [low, high): above Ray's worker ports, below Linux's default ephemeral range
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
TRIES = 64


def private_ports() -> range:
    """The ports :func:`free_port` draws from: :data:`PRIVATE_PORTS`, cut at the start of the host's ephemeral
    range where Linux states one lower than 32768."""
    lo, hi = PRIVATE_PORTS
    with contextlib.suppress(OSError, ValueError, IndexError):
        hi = min(hi, int(EPHEMERAL_RANGE.read_text().split()[0]))
    return range(lo, max(hi, lo + 1))


def free_port(host: str = "127.0.0.1", rng: random.Random | None = None) -> int:
    """A TCP port free on ``host`` right now, drawn from :func:`private_ports`; the caller binds it soon after.
    Falls back to an OS-chosen (ephemeral) port if :data:`TRIES` random draws all find theirs taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    ports = private_ports()
    pick = rng or random.SystemRandom()
    for _ in range(TRIES):
        port = pick.choice(ports)
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
