"""Rules whose input metrics no target exports, read from a real Prometheus: ``healer doctor
exporters`` and the dashboard's Rules page (and ``/api/v1/rules``).

The fleet's dcgm-exporter runs a 4.x exporter with a counters CSV that lacks field 112 (the clock
event reasons) and the NVLink counters, and (4.4.1+) emits no Xid series since no GPU had an Xid.
So GpuHardwareSlowdown and GpuPowerBrake can find nothing: the check names them, the metric, and the
counters CSV line of each exporter line that adds it. GpuTooHot does without the thermal-margin
field (its fallback), and the absent Xid series is normal: neither is flagged.
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from healer.clock import utc_now
from healer.ruleset.loading import load_ruleset
from healer.sources.prometheus_range import PrometheusRange
from tests.integration.test_api_support import build_app, http_client
from tests.services import PrometheusServer, ScrapeTarget, prometheus_server, text_exporter

pytestmark = pytest.mark.prometheus

REPO = Path(__file__).resolve().parents[2]
SLOWDOWN_METRIC = ["DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"]


def exposition() -> str:
    """A 4.x dcgm-exporter whose CSV lacks field 112 and the NVLink counters; no Xid yet."""
    labels = (
        'DCGM_FI_DRIVER_VERSION="570.133.20",Hostname="gpu-a",UUID="GPU-{i}",device="nvidia{i}",'
        'gpu="{i}",modelName="NVIDIA-H100-80GB-HBM3",pci_bus_id="00000000:1{i}:00.0"'
    )
    out = []
    for name, value in (
        ("DCGM_FI_DEV_GPU_TEMP", 45),
        ("DCGM_FI_DEV_ROW_REMAP_FAILURE", 0),
        ("DCGM_FI_DEV_ROW_REMAP_PENDING", 0),
        ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 0),
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.9),
        ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 0.4),
    ):
        out.append(f"# TYPE {name} gauge")
        out += [f"{name}{{{labels.format(i=i)}}} {value}" for i in range(2)]
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def prom() -> Iterator[PrometheusServer]:
    with text_exporter(exposition) as address, prometheus_server([ScrapeTarget(address)]) as server:
        server.wait_for_samples("DCGM_FI_DEV_GPU_TEMP")
        yield server


def doctor(prom: PrometheusServer, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HEALER_RULES_PATHS": json.dumps([str(REPO / "rules")])}
    return subprocess.run(
        [sys.executable, "-m", "healer", "doctor", "exporters", "--prometheus", prom.url, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,  # the default --counters is deploy/dcgm-exporter
    )


def test_doctor_names_the_rule_the_metric_and_the_csv_line(prom: PrometheusServer) -> None:
    done = doctor(prom, "-o", "json")
    assert done.returncode == 3, done.stderr
    out = json.loads(done.stdout)
    absent = {(a["rule"], tuple(a["metric"])): a for a in out["absent"]}
    slowdown = absent[("GpuHardwareSlowdown", tuple(SLOWDOWN_METRIC))]
    assert slowdown["needed"] == "required"
    assert any(
        w.startswith("counters-4.x.csv:")
        and w.endswith("DCGM_FI_DEV_CLOCKS_EVENT_REASONS, gauge, Current clock event reasons (bitmask).")
        for w in slowdown["added_by"]
    ), slowdown
    assert any(
        w.startswith("counters-3.x.csv:") and "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS" in w
        for w in slowdown["added_by"]
    )
    assert {"GpuHardwareSlowdown", "GpuPowerBrake", "NvlinkErrorBurst", "NvlinkRecoveryErrors"} <= set(
        out["blind_rules"]
    )
    # Does without: the thermal margin (fallback) and the Xid gauge (absent until the first Xid).
    assert "GpuTooHot" not in out["blind_rules"] and "GpuFatalXid" not in out["blind_rules"]
    assert absent[("GpuFatalXid", ("DCGM_FI_DEV_XID_ERRORS",))]["needed"] == "until first event"
    margin = ("DCGM_FI_DEV_GPU_TEMP_LIMIT", "DCGM_FI_DEV_GPU_TEMP_MARGIN_CELSIUS")
    assert absent[("GpuTooHot", margin)]["needed"] == "fallback"
    # The recovery-action field is commented out in the 4.x CSV (not every exporter has it).
    recovery = absent[("GpuRecoveryActionRequired", ("DCGM_FI_DEV_GPU_RECOVERY_ACTION",))]
    assert any("(commented out: uncomment it)" in w for w in recovery["added_by"])
    # An H100 fleet has no NVLink5 counters: normal, not blind (the NVLink5 Xid rule judges those
    # GPUs); each is named with the hardware that reports it and the 4.x CSV line that adds it.
    assert "Nvlink5LinkErrors" not in out["blind_rules"]
    effective = absent[("Nvlink5LinkErrors", ("DCGM_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS",))]
    assert effective["needed"] == "NVLink5 (Blackwell) GPUs only"
    assert [w.split(":")[0] for w in effective["added_by"]] == ["counters-4.x.csv"]
    # node_exporter's families are not a CSV's business.
    ib = absent[("InfinibandPortNotActive", ("node_infiniband_state_id",))]
    assert ib["added_by"] == ["node_exporter (its collector for this family must be on)"]
    # The node agent's hw_counters: off by default, so a fleet without it is not blind; the doctor
    # says where they come from.
    assert "InfinibandTransportRetries" not in out["blind_rules"]
    retries = absent[("InfinibandTransportRetries", ("healer_agent_infiniband_hw_counters_total",))]
    assert retries["needed"] == "nodes running healer's node agent, with InfiniBand HCAs"
    assert retries["added_by"][0].startswith("the node agent's /metrics")

    table = doctor(prom)
    assert table.returncode == 3
    row = next(x for x in table.stdout.splitlines() if x.startswith("GpuHardwareSlowdown"))
    assert row.split()[1:5] == [
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "or",
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        "required",
    ]
    assert "rules read a metric no target exports and find nothing: " in table.stdout


@pytest.fixture
def dashboard(prom: PrometheusServer, session_factory: sessionmaker[Session]) -> Iterator[httpx.Client]:
    pack = load_ruleset([REPO / "rules"])
    app = build_app(
        session_factory,
        clock=utc_now,  # "absent now" is asked at the page's now: the real one here
        ruleset_provider=lambda: pack,
        prometheus=PrometheusRange(prom.url, timeout_seconds=3),
    )
    with http_client(app) as client:
        yield client


def test_rules_page_flags_rules_whose_inputs_are_absent(dashboard: httpx.Client) -> None:
    page = dashboard.get("/rules")
    assert page.status_code == 200
    panel = re.search(
        r'<section class="panel bad-panel" data-testid="inputs-absent">(.*?)</section>', page.text, re.S
    )
    assert panel is not None, page.text
    text = html.unescape(re.sub(r"<[^>]+>", " ", panel.group(1)))
    assert (
        "GpuHardwareSlowdown : DCGM_FI_DEV_CLOCKS_EVENT_REASONS or DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
        in " ".join(text.split())
    )
    assert "GpuTooHot" not in text and "GpuFatalXid" not in text
    # The flag sits in the rule's own row, beside its health (visible, not a tooltip).
    rows = {
        m.group(1): m.group(0)
        for m in re.finditer(r'<tr>\s*<td><a href="/\?rule=(\w+)">.*?</tr>', page.text, re.S)
    }
    assert 'data-testid="rule-inputs-absent"' in rows["GpuPowerBrake"]
    assert 'data-testid="rule-inputs-absent"' not in rows["GpuTooHot"]

    rules = {r["name"]: r for r in dashboard.get("/api/v1/rules").json()["rules"]}
    assert rules["GpuHardwareSlowdown"]["absent_inputs"] == [" or ".join(SLOWDOWN_METRIC)]
    assert rules["GpuTooHot"]["absent_inputs"] == [] and rules["GpuFatalXid"]["absent_inputs"] == []
