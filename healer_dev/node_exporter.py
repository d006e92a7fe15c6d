"""The real node_exporter (Debian package ``prometheus-node-exporter``) reading a sysfs tree.

Started with only its InfiniBand collector and ``--path.sysfs=<root>``: it reads
``<root>/class/infiniband/...`` on every scrape, so whoever writes the tree (the simulator's
:class:`~healer_dev.simulator.sysfs.SysfsTree`, a test) decides what it exports.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx

from healer.errors import BinaryNotFound
from healer_dev.prometheus import free_port, stop_process


def binary() -> str | None:
    """The node_exporter executable on PATH (Debian's name first), or None."""
    return shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")


@dataclass
class _Started:
    process: subprocess.Popen[bytes]
    address: str
    log: IO[bytes]  # its stderr: a file, not a pipe (nobody reads a pipe while it runs; a full one blocks it)


def _start(found: str, root: Path, host: str, taken: set[int]) -> _Started:
    port = free_port()
    while port in taken:
        port = free_port()
    taken.add(port)
    address = f"{host}:{port}"
    log = tempfile.TemporaryFile()  # noqa: SIM115 - closed with the process, in run_node_exporters
    process = subprocess.Popen(
        [
            found,
            f"--path.sysfs={root}",
            "--collector.disable-defaults",
            "--collector.infiniband",
            f"--web.listen-address={address}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    return _Started(process, address, log)


def _ready(started: _Started, timeout: float) -> bool:
    """True once it answers; False when it exited because its port was taken meanwhile.

    Raises:
        RuntimeError: it exited for another reason (its log).
        TimeoutError: no answer within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if started.process.poll() is not None:
            started.log.seek(0)
            log = started.log.read().decode(errors="replace").strip()
            if "address already in use" in log:
                return False
            raise RuntimeError(f"node_exporter exited: {log}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://{started.address}/metrics", timeout=2).status_code == 200:
                return True
        time.sleep(0.1)
    raise TimeoutError(f"node_exporter on {started.address} did not answer within {timeout:.0f}s")


@contextlib.contextmanager
def run_node_exporters(sysfs_roots: Sequence[Path], *, host: str = "127.0.0.1") -> Iterator[list[str]]:
    """Run one node_exporter (InfiniBand collector only) per sysfs root, all started at once; yield
    their ``host:port`` in the same order (free ports; one taken by someone else meanwhile is
    replaced, up to 3 times). Stops every process on exit.

    Raises:
        BinaryNotFound: node_exporter is not installed.
        RuntimeError: one exited before answering (its log).
        TimeoutError: one did not answer within 15 s.
    """
    found = binary()
    if found is None:
        raise BinaryNotFound("prometheus-node-exporter", package="prometheus-node-exporter")
    taken: set[int] = set()
    started: list[_Started] = []
    try:
        for root in sysfs_roots:
            started.append(_start(found, root, host, taken))
        for i, root in enumerate(sysfs_roots):
            for _ in range(3):
                if _ready(started[i], timeout=15):
                    break
                started[i].log.close()
                started[i] = _start(found, root, host, taken)
            else:
                raise RuntimeError(f"node_exporter for {root}: no free port after 3 tries")
        yield [s.address for s in started]
    finally:
        for s in started:
            stop_process(s.process)
            s.log.close()


@contextlib.contextmanager
def run_node_exporter(sysfs_root: Path, *, host: str = "127.0.0.1") -> Iterator[str]:
    """Run node_exporter (InfiniBand collector only) on ``sysfs_root``; yield its ``host:port``
    (a free port). See :func:`run_node_exporters`."""
    with run_node_exporters([sysfs_root], host=host) as (address,):
        yield address
