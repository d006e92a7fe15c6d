"""The node agent's /metrics, read from a generated node (sysfs hw_counters, a kernel log, a
recorded H100), scraped by a real Prometheus, fires the default rules (issue 32).

What the stock exporters miss: a rising ``local_ack_timeout_err`` (node_exporter 1.5 exports no
``hw_counters``) fires InfinibandTransportRetries, and an Xid the driver logs while dcgm-exporter
is down fires GpuFatalXid and GpuFatalXidRecent from the agent's kernel log reading alone.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from healer.nodeagent.exposition import serve
from healer.nodeagent.facts import HostFacts
from healer_dev.agent_fixture import AgentFixture, gpu_uuid, write_fixture
from tests.exposition import all_findings, findings, load_pack
from tests.services import ScrapeTarget, prometheus_server

pytestmark = pytest.mark.prometheus

NODE = "gpu-node-32"
XID_79 = "pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[AgentFixture, str]]:
    """A generated healthy node and its agent's /metrics address (host:port)."""
    fixture = write_fixture(tmp_path / "node", gpus=8, hcas=4, uptime_seconds=3600)
    server, thread = serve(HostFacts.fixture(NODE, fixture.root), address="127.0.0.1", port=0)
    try:
        yield fixture, f"127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _closed_port() -> str:
    """A loopback address nothing listens on: dcgm-exporter, down."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_rising_ack_timeouts_and_an_xid_while_dcgm_exporter_is_down_fire_the_default_rules(
    agent: tuple[AgentFixture, str],
) -> None:
    fixture, address = agent
    pack = load_pack(exclude="mlx5_3")  # the operator's filter leaves the storage HCA out
    targets = [
        ScrapeTarget(address, job="healer-agent", labels={"node": NODE}),
        ScrapeTarget(_closed_port(), job="dcgm-exporter", labels={"node": NODE}),
    ]
    with prometheus_server(targets) as prom:
        prom.wait_for_samples('healer_agent_source_up{source="nvml"} == 1')
        prom.wait_for_samples('up{job="dcgm-exporter"} == 0')
        # A healthy node: the agent's facts fire nothing; only the dead exporter is reported.
        assert set(all_findings(prom, pack)) == {"ExporterTargetDown"}

        # A cable going bad: ACK timeouts on mlx5_1 climb; the storage HCA mlx5_3 too, filtered out.
        for value in (3, 9):
            fixture.set_hw_counter("mlx5_1", "local_ack_timeout_err", value)
            fixture.set_hw_counter("mlx5_3", "local_ack_timeout_err", value)
            prom.wait_for_samples(
                "healer_agent_infiniband_hw_counters_total"
                f'{{device="mlx5_1",counter="local_ack_timeout_err"}} == {value}'
            )
        assert findings(prom, pack["InfinibandTransportRetries"]) == {(NODE, "mlx5_1:1"): "9"}

        # The driver logs Xid 79 for GPU 3 while dcgm-exporter is down: the kernel log still tells.
        fixture.log_xid(3, 79, XID_79, usec=3_590_000_000)  # 10 s before the fixture's uptime
        prom.wait_for_samples("DCGM_FI_DEV_XID_ERRORS == 79")
        assert findings(prom, pack["GpuFatalXid"]) == {(NODE, "3"): "79"}
        assert findings(prom, pack["GpuFatalXidRecent"]) == {(NODE, "3"): "1"}
        xid = prom.query("DCGM_FI_DEV_XID_ERRORS")[0]["metric"]
        assert xid["UUID"] == gpu_uuid(3)
        assert xid["pci_bus_id"] == "00000000:5D:00.0"
        assert xid["err_code"] == "79"
        assert xid["err_msg"] == XID_79
        assert set(all_findings(prom, pack)) == {
            "ExporterTargetDown",
            "InfinibandTransportRetries",
            "GpuFatalXid",
            "GpuFatalXidRecent",
        }

        # Xid 45 (preemptive cleanup) after it: the sticky gauge shows 45, the window still 79.
        fixture.log_xid(3, 45, "pid=4242, name=python, Ch 00000008", usec=3_595_000_000)
        prom.wait_for_samples("DCGM_FI_DEV_XID_ERRORS == 45")
        assert findings(prom, pack["GpuFatalXid"]) == {}
        assert findings(prom, pack["GpuFatalXidRecent"]) == {(NODE, "3"): "1"}

        # Five minutes later (dcgm-exporter's window) the window has emptied.
        fixture.set_uptime(3600 + 300)
        prom.wait_for_samples('absent(DCGM_EXP_XID_ERRORS_COUNT{xid="79"}) == 1')
        assert findings(prom, pack["GpuFatalXidRecent"]) == {}
