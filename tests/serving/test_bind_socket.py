"""The server's listening socket holds its port from the first moment of start-up (vertumnus/serving/launcher.py).

``vertumnus serve`` binds its port before it starts Ray, which opens ports of its own for tens of seconds; a
socket that is only bound with SO_REUSEADDR lets another SO_REUSEADDR socket bind and listen on the same port
(the test suite once found a Ray agent's metrics endpoint answering on the server's port)."""

from __future__ import annotations

import errno
import socket

import pytest

from vertumnus.serving.launcher import bind_socket


def _reuseaddr_socket() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    return s


def test_the_port_is_held_against_sockets_that_reuse_addresses() -> None:
    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    try:
        for host in ("127.0.0.1", "0.0.0.0"):  # the same address and the wildcard both collide
            other = _reuseaddr_socket()
            try:
                with pytest.raises(OSError) as e:
                    other.bind((host, port))
                    other.listen(1)
                assert e.value.errno == errno.EADDRINUSE
            finally:
                other.close()
        # a client connecting during start-up waits in the backlog instead of being refused
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    finally:
        sock.close()


def test_a_port_in_use_is_a_clear_error() -> None:
    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    try:
        with pytest.raises(ValueError, match=f"cannot listen on 127.0.0.1:{port}: Address already in use"):
            bind_socket("127.0.0.1", port)
    finally:
        sock.close()
