"""A real vmalert process evaluating rule files against a VictoriaMetrics, for the tests and benchmarks.

Uses the ``vmalert`` binary on PATH (Debian package ``victoria-metrics``, which ships it). vmalert
reads Prometheus rule files, queries ``datasource_url`` (the Prometheus query API) and answers
``/api/v1/rules`` in Prometheus's shape, which healer's alerts mode reads
(:mod:`healer.sources.alerts`).

Flags that matter to healer:

* ``-datasource.queryTimeAlignment=false``: by default vmalert truncates each query's time to a
  multiple of the group interval; unaligned, a rule is queried at its group's ``lastEvaluation``,
  so query mode at that time sees exactly what vmalert saw (the benchmarks compare the two).
* ``-notifier.url``: vmalert 1.79 refuses to start without one; alerts go to a closed loopback
  port here (healer reads the API, not notifications), so its log lists failed sends.
* vmalert 1.79 does not know ``keep_firing_for`` (1.94 does): load the export written with
  ``healer rules export --no-keep-firing-for``; healer then holds firing alerts itself.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from healer.sources.local_server import find_binary, free_port, local_server

__all__ = ["VmalertServer", "vmalert_server"]


@dataclass
class VmalertServer:
    """A real vmalert process; ``url`` serves ``/api/v1/rules`` and ``/metrics``."""

    url: str
    process: subprocess.Popen[bytes]
    workdir: Path

    def reload(self) -> None:
        """Re-read the rule files now (``/-/reload``)."""
        httpx.get(f"{self.url}/-/reload", timeout=10).raise_for_status()


@contextlib.contextmanager
def vmalert_server(
    rule_files: Sequence[Path],
    *,
    datasource_url: str,
    evaluation_interval: str = "1s",
    extra_args: Sequence[str] = (),
    workdir: Path | None = None,
    port: int | None = None,
    ready_timeout: float = 30.0,
) -> Iterator[VmalertServer]:
    """Start vmalert evaluating ``rule_files`` against ``datasource_url`` (groups without their own
    ``interval`` every ``evaluation_interval``); stop it on exit.

    ``workdir`` keeps the log there (kept on exit); default a temporary directory removed on exit.
    ``extra_args`` are appended to the command line.
    """
    keep = workdir is not None
    workdir = workdir or Path(tempfile.mkdtemp(prefix="healer-vmalert-"))
    workdir.mkdir(parents=True, exist_ok=True)
    binary = find_binary("vmalert", package="victoria-metrics")
    nowhere = free_port()  # nothing listens there: notifications fail, nothing else does
    try:
        with local_server(
            lambda port: [
                binary,
                f"-httpListenAddr=127.0.0.1:{port}",
                *(f"-rule={p.resolve()}" for p in rule_files),
                f"-datasource.url={datasource_url}",
                f"-evaluationInterval={evaluation_interval}",
                "-datasource.queryTimeAlignment=false",
                f"-notifier.url=http://127.0.0.1:{nowhere}",
                "-loggerLevel=ERROR",
                *extra_args,
            ],
            log=workdir / "vmalert.log",
            ready_path="/health",
            name="vmalert",
            ready_timeout=ready_timeout,
            port=port,
        ) as local:
            yield VmalertServer(url=local.url, process=local.process, workdir=workdir)
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
