"""``scripts/device-check.sh`` in one command, on the recorded H100 fixture (issue 32): every fact the
default rules read, beside the simulator's assumption; a clear error without NVML."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from healer_dev.agent_fixture import write_fixture
from healer_dev.device_check import rule_metrics

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "device-check.sh"
VENV = str(Path(sys.executable).parents[1])


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "HEALER_VENV": VENV, **(env or {})},
        cwd="/",  # one command from anywhere
    )


def test_each_fact_the_rules_read_stands_beside_the_simulators_assumption(tmp_path: Path) -> None:
    node = write_fixture(tmp_path / "node", gpus=8, hcas=2)
    node.log_xid(5, 48, "An uncorrectable double bit error (DBE) has been detected", usec=9_000_000)
    done = run(
        "--recorded", str(node.root / "nvml.json"), "--out", str(tmp_path / "out"),
        "--kmsg", str(node.kmsg), "--sysfs", str(node.root / "sys"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "GPUs: 8 x NVIDIA H100 80GB HBM3" in lines
    assert f"kernel log: 3 records from {node.kmsg}, 1 Xid lines (last: Xid 48 on 00000000:AB:00.0)" in lines
    assert f"InfiniBand hw_counters: 14 files on 2 port(s) under {node.root / 'sys'}" in lines
    rows = {line.split()[0]: line for line in lines if line.startswith("DCGM_")}
    assert set(rows) == set(rule_metrics())
    temp = rows["DCGM_FI_DEV_GPU_TEMP"].split()
    assert temp[1:6] == ["present", "gauge", "degrees", "C", "yes"]
    assert temp[6] == "63..66"  # the recorded GPUs; the simulator's healthy range follows
    assert rows["DCGM_FI_DEV_GPU_TEMP"].endswith("ok")
    assert "typed gauge here, counter by dcgm-exporter" in rows["DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"]
    assert "not simulated" in rows["DCGM_FI_DEV_GPU_RECOVERY_ACTION"]
    assert "DCGM profiling module only, not in NVML" in rows["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"]
    # What NVML answered is kept as a recording: a fixture taken from the hardware it ran on.
    recorded = json.loads((tmp_path / "out" / "nvml-recording.json").read_text())
    assert recorded["calls"]["nvmlDeviceGetName [0]"] == {"value": "NVIDIA H100 80GB HBM3"}
    assert "DCGM_FI_DEV_GPU_TEMP{" in (tmp_path / "out" / "metrics.prom").read_text()


def test_without_nvml_it_says_why_and_exits_2(tmp_path: Path) -> None:
    done = run("--recorded", str(tmp_path / "missing.json"), "--kmsg", str(tmp_path / "kmsg"))
    assert done.returncode == 2
    # What does not need NVML is still read and said.
    assert f"kernel log: cannot read {tmp_path / 'kmsg'}: No such file or directory" in done.stdout
    assert f"error: NVML not available: recorded device {tmp_path / 'missing.json'}: " in done.stdout
    done = run("--kmsg", str(tmp_path / "kmsg"), env={"HEALER_VENV": str(tmp_path / "no-venv")})
    assert done.returncode == 2
    assert done.stderr == f"error: no virtual environment at {tmp_path / 'no-venv'} (set HEALER_VENV)\n"
