"""A throwaway Prometheus over generated data: ``promtool tsdb create-blocks-from openmetrics``
turns OpenMetrics text into TSDB blocks, and a ``prometheus`` process (no scrape jobs) serves them
on a free loopback port until the context exits. Used by ``healer rules test``, so the rules'
PromQL is evaluated by Prometheus itself.

Needs ``promtool`` and ``prometheus`` on PATH (Debian package ``prometheus``).

Errors: :class:`~healer.errors.SourceUnavailable` when a binary is missing, promtool rejects the
data, or Prometheus does not become ready within ``ready_timeout`` seconds (its log is quoted).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from healer.errors import SourceUnavailable
from healer.sources.local_server import find_binary, local_prometheus

#: Keep every block whatever its age: retention counts back from the newest block, and generated
#: data may span years (tests are laid out one after the other).
_RETENTION = "36500d"


def create_blocks(openmetrics_text: str, data_dir: Path) -> None:
    """Write ``openmetrics_text`` as TSDB blocks under ``data_dir`` with promtool."""
    data_dir.mkdir(parents=True, exist_ok=True)
    source = data_dir.parent / "input.om"
    source.write_text(openmetrics_text)
    done = subprocess.run(
        [
            find_binary("promtool", package="prometheus"),
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            str(source),
            str(data_dir),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SourceUnavailable(
            f"promtool tsdb create-blocks-from openmetrics: {done.stderr.strip()[-2000:]}"
        )


@contextlib.contextmanager
def scratch_prometheus(openmetrics_text: str, *, ready_timeout: float = 30.0) -> Iterator[str]:
    """Yield the base URL of a Prometheus serving ``openmetrics_text``; stop it and delete its data
    on exit."""
    workdir = Path(tempfile.mkdtemp(prefix="healer-scratch-prom-"))
    try:
        create_blocks(openmetrics_text, workdir / "data")
        (workdir / "prometheus.yml").write_text("global: {}\n")
        with local_prometheus(
            config=workdir / "prometheus.yml",
            data=workdir / "data",
            log=workdir / "prometheus.log",
            extra_args=[f"--storage.tsdb.retention.time={_RETENTION}"],
            ready_timeout=ready_timeout,
        ) as server:
            yield server.url
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
