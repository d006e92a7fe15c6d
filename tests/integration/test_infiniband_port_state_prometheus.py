"""InfinibandPortNotActive on the real node_exporter reading a generated sysfs, served to a real
Prometheus (issue 25: is a port "Disabled" on purpose not a fault?).

Not from what node_exporter exports. The kernel writes a port's ``state`` and ``phys_state``
from the driver's ``query_port``. For RoCE (Ethernet link layer) mlx5 reports ``1: DOWN`` /
``3: Disabled`` unless its netdev is running *and* has carrier (Linux
``drivers/infiniband/hw/mlx5/main.c``, ``mlx5_query_port_roce``; bnxt_re's ``bnxt_re_query_port``
likewise): a ConnectX RoCE port that lost its link reads exactly as one an operator set down, and
the rule cannot tell RoCE from InfiniBand ports (node_exporter exports no link layer). An
InfiniBand port without a link partner polls (``2: Polling``). So the rule fires on every port not
ACTIVE, and a port unused on purpose is left out by the operator's InfiniBand device filter
(settings ``infiniband.device_exclude``; rules/README.md, "Which InfiniBand devices count").

node_exporter (infiniband collector) exports ``state`` as ``node_infiniband_state_id`` and
``phys_state`` as ``node_infiniband_physical_state_id`` (the number before the colon).
"""

from __future__ import annotations

import pytest

from tests.exposition import findings, load_pack
from tests.node_exporter import node_exporter
from tests.services import ScrapeTarget, prometheus_server

pytestmark = pytest.mark.prometheus

NODE = "gpu-node-21"


def test_a_port_that_goes_down_fires_and_a_disabled_one_is_left_out_by_its_device() -> None:
    with node_exporter() as ib:
        for hca in ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"):
            ib.sysfs.add_hca(hca)
        ib.sysfs.set_state("mlx5_2", 1, phys=3)  # set down on purpose before anything looked
        with prometheus_server(
            [ScrapeTarget(ib.address, labels={"node": NODE}, job="node-exporter")]
        ) as prom:
            prom.wait_for_samples('node_infiniband_state_id{device="mlx5_3"} == 4')
            pack = load_pack(exclude="mlx5_2")  # the operator leaves the unused port out
            assert findings(prom, pack["InfinibandPortNotActive"]) == {}

            ib.sysfs.set_state("mlx5_0", 1)  # InfiniBand: the cable is pulled, the port polls
            ib.sysfs.set_state("mlx5_1", 1, phys=3)  # RoCE on mlx5: the link is lost
            prom.wait_for_samples('node_infiniband_physical_state_id{device="mlx5_1"} == 3')
            prom.wait_for_samples('node_infiniband_state_id{device="mlx5_0"} == 1')

            # The RoCE port that lost its link and the port set down on purpose look alike.
            states = {
                (s["metric"]["__name__"], s["metric"]["device"]): s["value"][1]
                for s in prom.query('{__name__=~"node_infiniband_(physical_)?state_id"}')
            }
            for metric in ("node_infiniband_state_id", "node_infiniband_physical_state_id"):
                assert states[(metric, "mlx5_1")] == states[(metric, "mlx5_2")], metric
            assert states[("node_infiniband_physical_state_id", "mlx5_0")] == "2"  # Polling

            assert findings(prom, pack["InfinibandPortNotActive"]) == {
                (NODE, "mlx5_0:1"): "1",
                (NODE, "mlx5_1:1"): "1",
            }
            # Without the operator's exclusion the unused port is a finding too: nothing tells it apart.
            assert set(findings(prom, load_pack()["InfinibandPortNotActive"])) == {
                (NODE, "mlx5_0:1"),
                (NODE, "mlx5_1:1"),
                (NODE, "mlx5_2:1"),
            }
