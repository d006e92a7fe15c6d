"""A metrics server process on this machine: a binary started on a free loopback port, polled until
it answers, stopped on exit.

``healer rules test`` starts a throwaway Prometheus this way (:mod:`healer.sources.scratch`), and the
development tools (``healer_dev``: the demo, the benchmarks, the tests' Prometheus and
VictoriaMetrics) build on the same pieces, so there is one start-and-poll shape.

Errors: :class:`~healer.errors.BinaryNotFound` (a :class:`~healer.errors.SourceUnavailable`) when
the binary is not on PATH; :class:`~healer.errors.SourceUnavailable` when the process exits before
it is ready, or it is not ready within the timeout (the end of its log is quoted).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from healer.errors import BinaryNotFound, SourceUnavailable

__all__ = ["LocalServer", "find_binary", "free_port", "local_prometheus", "local_server", "stop_process"]

#: How much of a failed server's log goes into the error.
_LOG_TAIL = 2000


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def find_binary(name: str, *, package: str) -> str:
    """The path of ``name`` on PATH; raises BinaryNotFound naming the Debian ``package``."""
    found = shutil.which(name)
    if not found:
        raise BinaryNotFound(name, package=package)
    return found


def stop_process(process: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """Terminate ``process``; kill it when it has not exited after ``timeout`` seconds."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@dataclass
class LocalServer:
    """A running server: ``url`` is its base URL (``http://127.0.0.1:<port>``); ``log`` its log file."""

    url: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    def log_tail(self) -> str:
        """The end of the server's log (for errors)."""
        try:
            return self.log.read_text(errors="replace")[-_LOG_TAIL:]
        except OSError:
            return ""


@contextlib.contextmanager
def local_server(
    command: Callable[[int], Sequence[str]],
    *,
    log: Path,
    ready_path: str,
    name: str,
    ready_timeout: float = 30.0,
    port: int | None = None,
) -> Iterator[LocalServer]:
    """Run ``command(port)`` (argv listening on 127.0.0.1:port, a free port unless given), its
    output appended to ``log``; yield once ``GET <ready_path>`` answers 200; stop it on exit.

    Args:
        command: builds the argv from the port.
        log: file receiving the process's stdout and stderr.
        ready_path: path polled every 0.1 s, e.g. ``/-/ready``.
        name: the server's name in errors (``prometheus``, ``victoria-metrics``).
        ready_timeout: seconds to wait for readiness.

    Raises:
        SourceUnavailable: the process exited, or was not ready within ``ready_timeout`` seconds.
    """
    port = port or free_port()
    with log.open("ab") as out:
        process = subprocess.Popen(list(command(port)), stdout=out, stderr=subprocess.STDOUT)
        server = LocalServer(url=f"http://127.0.0.1:{port}", port=port, process=process, log=log)
        try:
            _wait_ready(server, ready_path, name, ready_timeout)
            yield server
        finally:
            stop_process(process)


def _wait_ready(server: LocalServer, ready_path: str, name: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise SourceUnavailable(f"{name} exited ({server.process.returncode}): {server.log_tail()}")
        try:
            if httpx.get(f"{server.url}{ready_path}", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass  # not listening yet
        time.sleep(0.1)
    raise SourceUnavailable(f"{name} not ready after {timeout:g} s: {server.log_tail()}")


@contextlib.contextmanager
def local_prometheus(
    *,
    config: Path,
    data: Path,
    log: Path,
    extra_args: Sequence[str] = (),
    ready_timeout: float = 30.0,
    port: int | None = None,
    binary: str | None = None,
) -> Iterator[LocalServer]:
    """Run ``prometheus`` (``binary``, default the one on PATH: Debian package ``prometheus``) with
    ``config`` and its TSDB in ``data`` on loopback; yield once ``/-/ready`` answers; stop it on
    exit. Raises as :func:`local_server`."""
    binary = binary or find_binary("prometheus", package="prometheus")
    with local_server(
        lambda port: [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
            *extra_args,
        ],
        log=log,
        ready_path="/-/ready",
        name="prometheus",
        ready_timeout=ready_timeout,
        port=port,
    ) as server:
        yield server
