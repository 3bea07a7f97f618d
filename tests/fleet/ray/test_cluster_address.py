"""An address where no Ray head listens is refused at once, in one line naming the setting (``ray.init``
would retry it for minutes, a warning every few seconds)."""

from __future__ import annotations

import socket
import time

import pytest

from fastlight.fleet.ray.cluster import check_reachable


def test_a_closed_port_is_refused_in_one_line():
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        with pytest.raises(ConnectionError) as info:
            check_reachable(address)
        msg = str(info.value)
        assert "\n" not in msg
        assert msg.startswith(f"--data.fleet.init_args.address {address}: nothing accepts connections there")
    assert time.monotonic() - start < 5.0  # refused by the kernel, not waited out


def test_a_listening_head_and_addresses_ray_resolves_pass():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        check_reachable(f"127.0.0.1:{server.getsockname()[1]}")
    for address in ("auto", "local", "localhost"):  # Ray's own forms: left to ray.init
        check_reachable(address)
