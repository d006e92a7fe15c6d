"""``scripts/device-check.sh`` in one command, on the recorded H100 fixture (issue 32): every fact the
default rules read, beside the simulator's assumption; a clear error without NVML. And the NVML
recordings of a real H200 (docs/device-checks/) replayed: the agent serves what it served there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from healer_dev.agent_fixture import write_fixture
from healer_dev.device_check import rule_metrics

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "device-check.sh"
H200 = REPO / "docs" / "device-checks" / "2026-12-04-NVIDIA-H200"
CORPUS = REPO / "tests" / "fixtures" / "exposition-corpus"
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
        "--bundle-command", "echo Driver Version : 570.133.20",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    # The log bundle the agent would attach to a ticket, as the controller decodes it.
    bundle = next(line for line in lines if line.startswith("log bundle: "))
    assert "(limit 65,536)" in bundle and bundle.endswith("; echo Driver Version : 570.133.20: exit 0")
    text = (tmp_path / "out" / "log-bundle.txt").read_text()
    assert "=== NVIDIA driver Xid lines (1) ===" in text and "Driver Version : 570.133.20" in text
    assert "NVRM: Xid (PCI:0000:ab:00): 48, " in text
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


def samples(metrics: str) -> list[str]:
    return [line for line in metrics.splitlines() if line.startswith("DCGM_")]


def test_a_real_h200_recording_replays_to_what_the_agent_served_on_it(tmp_path: Path) -> None:
    """The corpus sample of the H200 at full load is the agent's own output on that GPU (its node
    name aside); replayed from the recording, the agent serves it again, and the simulator, since
    that run, assumes what the hardware showed: a busy GPU is power-capped (clock event reasons 0x4)."""
    (tmp_path / "kmsg").write_text("")
    done = run(
        "--recorded", f"{H200}-bf16-load.nvml.json", "--out", str(tmp_path / "out"),
        "--kmsg", str(tmp_path / "kmsg"), "--sysfs", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "GPUs: 1 x NVIDIA H200" in done.stdout.splitlines()
    served = samples((tmp_path / "out" / "metrics.prom").read_text())
    published = (CORPUS / "h200-healer-agent-bf16-load.prom").read_text()
    assert served == samples(published.replace('Hostname="gpu-h200-02"', 'Hostname="device-check"'))
    rows = {line.split()[0]: line for line in done.stdout.splitlines() if line.startswith("DCGM_")}
    reasons = rows["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"].split()
    assert reasons[1:6] == ["present", "gauge", "bitmask", "yes", "4"]
    assert reasons[-1] == "ok"  # was "outside simulated healthy range (note)" on the day (the .txt)
    assert "outside simulated healthy range" in Path(f"{H200}-bf16-load.txt").read_text()
    assert rows["DCGM_FI_DEV_GPU_TEMP"].split()[6] == "60"
