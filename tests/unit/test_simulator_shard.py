"""``healer simulate --shard K/N --started-at T``: N processes serve one fleet (the benchmarks at
10,240 nodes), each listing every N-th node in its file_sd, all on one scenario clock."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.services import free_port, wait_until


def test_a_shard_lists_every_nth_node_on_the_shared_clock(tmp_path: Path) -> None:
    sd, port = tmp_path / "sd.json", free_port()
    started_at = time.time() - 100
    command = [sys.executable, "-m", "healer", "simulate", "--nodes=8", f"--port={port}"]
    command += ["--shard=1/4", f"--started-at={started_at}", f"--file-sd={sd}"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(sd.is_file, timeout=60, what="the shard's file_sd")
        paths = {group["labels"]["__metrics_path__"] for group in json.loads(sd.read_text())}
        assert paths == {f"/nodes/gpu-node-0{i}/{e}/metrics" for i in (1, 5) for e in ("dcgm", "node")}
        status = httpx.get(f"http://127.0.0.1:{port}/status", timeout=10).json()
        assert status["nodes"] == 8  # the whole fleet: any node still answers
        assert 100 <= status["elapsed_seconds"] < 160  # scenario time counted from --started-at
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_shard_outside_the_fleet_is_refused() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "healer", "simulate", "--nodes=8", "--shard=4/4"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "expected K/N with 0 <= K < N" in done.stderr
