"""The Kubernetes emulator when a client hangs up before its answer (a timed-out or killed
controller): no traceback on stderr, and it keeps serving."""

from __future__ import annotations

import socket
import struct
import time
from urllib.parse import urlsplit

import httpx
import pytest

from healer_dev.k8s_emulator import KubernetesEmulator


def test_a_client_that_hung_up_leaves_no_traceback(capfd: pytest.CaptureFixture[str]) -> None:
    with KubernetesEmulator() as emu:
        emu.inject_delay("GET", r"^/api/v1/nodes$", 0.3)
        address = urlsplit(emu.host)
        with socket.create_connection((address.hostname, address.port)) as client:
            client.sendall(b"GET /api/v1/nodes HTTP/1.1\r\nHost: x\r\n\r\n")
            # Close with a reset (linger 0), as a killed process's socket does: the answer can't go.
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        time.sleep(0.6)  # the emulator writes its answer after the delay, to a reset socket
        assert httpx.get(f"{emu.host}/api/v1/nodes", timeout=5).status_code == 200
    err = capfd.readouterr().err
    assert "Traceback" not in err, err
    assert "BrokenPipeError" not in err and "ConnectionResetError" not in err
