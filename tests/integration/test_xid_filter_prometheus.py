"""The one-selection Xid filter (``render_value_match``) keeps exactly what one comparison per
code joined by ``or`` keeps, on a real Prometheus: same series, same labels, same values.

A tiny exporter serves the Xid gauge on 220 GPUs, GPU n holding Xid n (0..199), plus a NaN, a
+Inf, a negative and a few non-catalog large codes.
"""

from __future__ import annotations

import pytest

from healer.ruleset.xid_catalog import load_xid_catalog, render_value_match
from tests.conftest import REPO
from tests.exposition import Pages, serve
from tests.services import ScrapeTarget, prometheus_server

pytestmark = pytest.mark.prometheus

XID = "DCGM_FI_DEV_XID_ERRORS"
VALUES = [*map(float, range(200)), float("nan"), float("inf"), -1.0, 999.0, 154.5, 1e6]


def _or_chain(codes: list[int]) -> str:
    """The rule pack's previous form: one comparison per code (or run), joined by ``or``."""
    runs: list[tuple[int, int]] = []
    for code in sorted(set(codes)):
        if runs and code == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], code)
        else:
            runs.append((code, code))
    return " or ".join(f"{XID} == {a}" if a == b else f"({XID} >= {a} <= {b})" for a, b in runs)


def _exposition() -> str:
    lines = [f"# TYPE {XID} gauge"]
    for gpu, value in enumerate(VALUES):
        text = "NaN" if value != value else "+Inf" if value == float("inf") else repr(value)
        lines.append(f'{XID}{{Hostname="gpu-node-01",gpu="{gpu}",err_code="{gpu}"}} {text}')
    return "\n".join(lines) + "\n"


def test_the_filter_form_keeps_what_the_or_chain_keeps() -> None:
    catalog = load_xid_catalog(REPO / "rules" / "catalog" / "xid-catalog.yaml")
    code_sets = {
        "actionable": catalog.codes("fatal-replace", "reboot", "reset", corroborate=False),
        "corroborate": catalog.codes(corroborate=True),
        "catalog": catalog.codes(),
    }
    with (
        serve(Pages({"/metrics": _exposition()})) as address,
        prometheus_server([ScrapeTarget(address, "/metrics", job="dcgm-exporter")]) as prom,
    ):
        assert len(prom.wait_for_samples(XID)) == len(VALUES)
        for name, codes in code_sets.items():

            def answer(expr: str) -> dict[str, str]:
                return {s["metric"]["gpu"]: s["value"][1] for s in prom.query(f"max by (gpu) ({expr})")}

            new, old = answer(render_value_match(XID, codes)), answer(_or_chain(codes))
            assert new == old, name
            assert {int(g) for g in new} == set(codes), name  # GPU n holds Xid n
            assert all(float(v) == int(g) for g, v in new.items()), name
