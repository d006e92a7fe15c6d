"""The real node_exporter (Debian package ``prometheus-node-exporter``) reading a sysfs tree.

Started with only its InfiniBand collector and ``--path.sysfs=<root>``: it reads
``<root>/class/infiniband/...`` on every scrape, so whoever writes the tree (the simulator's
:class:`~healer_dev.simulator.sysfs.SysfsTree`, a test) decides what it exports.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx

from healer_dev.prometheus import free_port, stop_process, wait_until

#: Why node_exporter cannot be used, in one line, for the demo's fallback notice.
MISSING = "node_exporter not found (Debian package prometheus-node-exporter)"


def binary() -> str | None:
    """The node_exporter executable on PATH (Debian's name first), or None."""
    return shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")


@contextlib.contextmanager
def run_node_exporter(sysfs_root: Path, *, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Run node_exporter (InfiniBand collector only) on ``sysfs_root``; yield its ``host:port``.

    ``port`` 0 picks a free one. Stops the process on exit.

    Raises:
        RuntimeError: node_exporter is not installed, or it exited before answering (its stderr).
        TimeoutError: it did not answer within 15 s.
    """
    found = binary()
    if found is None:
        raise RuntimeError(MISSING)
    address = f"{host}:{port or free_port()}"
    process = subprocess.Popen(
        [
            found,
            f"--path.sysfs={sysfs_root}",
            "--collector.disable-defaults",
            "--collector.infiniband",
            f"--web.listen-address={address}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:

        def ready() -> bool:
            if process.poll() is not None:
                raise RuntimeError(
                    process.stderr.read().decode() if process.stderr else "node_exporter exited"
                )
            return httpx.get(f"http://{address}/metrics", timeout=2).status_code == 200

        wait_until(ready, timeout=15, what="node_exporter ready")
        yield address
    finally:
        stop_process(process)
        if process.stderr:
            process.stderr.close()
