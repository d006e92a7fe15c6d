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
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from healer.errors import SourceUnavailable

#: Keep every block whatever its age: retention counts back from the newest block, and generated
#: data may span years (tests are laid out one after the other).
_RETENTION = "36500d"


def _binary(name: str) -> str:
    found = shutil.which(name)
    if not found:
        raise SourceUnavailable(f"{name} not found on PATH (Debian/Ubuntu package 'prometheus')")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def create_blocks(openmetrics_text: str, data_dir: Path) -> None:
    """Write ``openmetrics_text`` as TSDB blocks under ``data_dir`` with promtool."""
    data_dir.mkdir(parents=True, exist_ok=True)
    source = data_dir.parent / "input.om"
    source.write_text(openmetrics_text)
    done = subprocess.run(
        [_binary("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(source), str(data_dir)],
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
        port = _free_port()
        log_path = workdir / "prometheus.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [
                    _binary("prometheus"),
                    f"--config.file={workdir / 'prometheus.yml'}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--storage.tsdb.retention.time={_RETENTION}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            url = f"http://127.0.0.1:{port}"
            try:
                _wait_ready(url, process, log_path, ready_timeout)
                yield url
            finally:
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _wait_ready(url: str, process: subprocess.Popen[bytes], log_path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SourceUnavailable(f"prometheus exited: {log_path.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/-/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SourceUnavailable(f"prometheus not ready after {timeout:g} s: {log_path.read_text()[-2000:]}")
