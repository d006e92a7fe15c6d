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
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

import httpx

from healer_dev.prometheus import free_port, stop_process, wait_until

#: Why node_exporter cannot be used, in one line, for the demo's fallback notice.
MISSING = "node_exporter not found (Debian package prometheus-node-exporter)"


def binary() -> str | None:
    """The node_exporter executable on PATH (Debian's name first), or None."""
    return shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")


@contextlib.contextmanager
def run_node_exporters(sysfs_roots: Sequence[Path], *, host: str = "127.0.0.1") -> Iterator[list[str]]:
    """Run one node_exporter (InfiniBand collector only) per sysfs root, all started at once; yield
    their ``host:port`` in the same order. Stops every process on exit.

    Raises:
        RuntimeError: node_exporter is not installed, or one exited before answering (its stderr).
        TimeoutError: one did not answer within 15 s.
    """
    found = binary()
    if found is None:
        raise RuntimeError(MISSING)
    started: list[tuple[subprocess.Popen[bytes], str]] = []
    # stderr to a file, not a pipe: nobody reads a pipe while it runs, and a full one would block it
    with tempfile.TemporaryFile() as log:
        try:
            for root in sysfs_roots:
                address = f"{host}:{free_port()}"
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
                started.append((process, address))
            for process, address in started:
                wait_until(
                    lambda p=process, a=address: _answers(p, a, log),
                    timeout=15,
                    what=f"node_exporter on {address}",
                )
            yield [address for _, address in started]
        finally:
            for process, _ in started:
                stop_process(process)


def _answers(process: subprocess.Popen[bytes], address: str, log: IO[bytes]) -> bool:
    if process.poll() is not None:
        log.seek(0)
        raise RuntimeError(f"node_exporter exited: {log.read().decode(errors='replace').strip()}")
    return httpx.get(f"http://{address}/metrics", timeout=2).status_code == 200


@contextlib.contextmanager
def run_node_exporter(sysfs_root: Path, *, host: str = "127.0.0.1") -> Iterator[str]:
    """Run node_exporter (InfiniBand collector only) on ``sysfs_root``; yield its ``host:port``
    (a free port). See :func:`run_node_exporters`."""
    with run_node_exporters([sysfs_root], host=host) as (address,):
        yield address
