"""The InfiniBand device filter set once in the settings, on the real node_exporter reading a
generated sysfs and a real Prometheus: a management HCA that flaps is no finding when the setting
excludes it, and a finding by default; the rules ``healer rules export`` writes (alerts mode) carry
the same filter (rules/README.md, "Which InfiniBand devices count").
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from healer.config import load_settings
from healer.ruleset.loading import load_ruleset
from healer.ruleset.schema import Rule
from tests.conftest import REPO
from tests.exposition import findings
from tests.healer_cli import run_healer
from tests.node_exporter import node_exporter
from tests.services import ScrapeTarget, prometheus_server, wait_until

pytestmark = pytest.mark.prometheus

NODE = "gpu-node-31"
COMPUTE, MANAGEMENT = "mlx5_0", "mlx5_1"


def pack_under(monkeypatch: pytest.MonkeyPatch, **env: str) -> dict[str, Rule]:
    """The default pack as healer loads it with the settings given by ``HEALER_*`` variables."""
    for key in list(os.environ):
        if key.startswith("HEALER_"):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = load_settings()
    ruleset = load_ruleset([REPO / "rules"], device_filter=settings.infiniband.device_filter())
    return {r.name: r for r in ruleset.rules}


def test_a_flapping_management_hca_counts_only_when_the_setting_does_not_exclude_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    exclude = {"HEALER_INFINIBAND__DEVICE_EXCLUDE": MANAGEMENT}
    exported = run_healer("rules", "export", str(REPO / "rules"), env={"PATH": os.environ["PATH"], **exclude})
    assert exported.returncode == 0, exported.stderr
    rule_file = tmp_path / "healer.rules.yml"
    # Prometheus evaluates the groups every 2 s instead of the pack's 30 s: the filter is the
    # rules' own, the interval only how soon the test sees them fire.
    assert "\n  interval: 30s\n" in exported.stdout
    every_2s = exported.stdout.replace("\n  interval: 30s\n", "\n  interval: 2s\n")
    rule_file.write_text(every_2s, encoding="utf-8")

    with node_exporter() as ib:
        ib.sysfs.add_hca(COMPUTE)
        ib.sysfs.add_hca(MANAGEMENT)
        target = ScrapeTarget(ib.address, labels={"node": NODE}, job="node-exporter")
        with prometheus_server([target], rule_files=[rule_file]) as prom:
            # a baseline inside the rules' 10-minute window before anything moves
            prom.wait_for_samples("min(count_over_time(node_infiniband_link_downed_total[1m])) >= 3")

            ib.sysfs.set_counter(MANAGEMENT, "link_downed", 3)  # the management link flaps
            prom.wait_for_samples(f'node_infiniband_link_downed_total{{device="{MANAGEMENT}"}} == 3')

            excluded = pack_under(monkeypatch, **exclude)
            assert findings(prom, excluded["InfinibandLinkDowned"]) == {}
            default = pack_under(monkeypatch)
            assert findings(prom, default["InfinibandLinkDowned"]) == {(NODE, f"{MANAGEMENT}:1"): "3"}

            # Alerts mode: Prometheus evaluates the exported rules. The compute HCA's flap fires,
            # the management HCA's never does.
            ib.sysfs.set_counter(COMPUTE, "link_downed", 1)
            alerts = prom.wait_for_samples(
                'ALERTS{alertname="InfinibandLinkDowned", alertstate="firing"}', timeout=90
            )
            assert {a["metric"]["device"] for a in alerts} == {COMPUTE}
            wait_until(
                lambda: (
                    findings(prom, default["InfinibandLinkDowned"]).keys()
                    == {(NODE, f"{COMPUTE}:1"), (NODE, f"{MANAGEMENT}:1")}
                ),
                timeout=10,
                what="both flaps seen by the default pack",
            )
            firing = prom.query('ALERTS{alertname="InfinibandLinkDowned"}')
            assert {a["metric"]["device"] for a in firing} == {COMPUTE}
