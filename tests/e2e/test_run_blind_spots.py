"""`healer run` on the real control plane shows where its rules cannot see: a vGPU-like node whose
exporter sends no GPU temperature, and a GPU node from which no dcgm-exporter series comes at all,
are blind for the temperature rule (the JSON API, /metrics, the fleet and node pages), never
healthy; a node that exports everything has no blind spot.
"""

from __future__ import annotations

import re

import httpx

from healer_dev.prometheus import ScrapeTarget
from tests.e2e.harness import World
from tests.services import prometheus_server, text_exporter, wait_until

RULES = """
groups:
  - name: gpu
    interval: 1s
    rules:
      - name: GpuTooHot
        expr: max by (Hostname, gpu, UUID) (DCGM_FI_DEV_GPU_TEMP) > 78
        for: 2s
        unit: degrees C
        actions: [quarantine]
      - name: TensorCoresIdle
        expr: max by (Hostname, gpu, UUID) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE) < 0.01
        for: 10m
        actions: [notify]
"""


def dcgm(host: str, *, temperature: bool) -> str:
    out = []
    for name, value in (("DCGM_FI_DEV_GPU_TEMP", 45), ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 0.4)):
        if name == "DCGM_FI_DEV_GPU_TEMP" and not temperature:
            continue
        out.append(f"# TYPE {name} gauge")
        out += [f'{name}{{Hostname="{host}",UUID="GPU-{host}-{i}",gpu="{i}"}} {value}' for i in range(2)]
    return "\n".join(out) + "\n"


def test_blind_nodes_are_shown_as_blind_not_healthy(world: World) -> None:
    full, vgpu, silent = world.add_nodes(3, pool="h100")
    world.rules(RULES)
    db = f"sqlite:///{world.tmp_path / 'healer.db'}"
    with (
        text_exporter(lambda: dcgm(full, temperature=True)) as a,
        text_exporter(lambda: dcgm(vgpu, temperature=False)) as b,
        prometheus_server(
            [ScrapeTarget(a, job="dcgm-exporter"), ScrapeTarget(b, job="dcgm-exporter")]
        ) as prom,
    ):
        prom.wait_for_samples(f'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{Hostname="{vgpu}"}}')
        healer = world.start(world.config(db=db, prometheus_url=prom.url))

        def observed() -> list[dict[str, object]] | None:
            healer.alive()
            try:
                got = httpx.get(f"{healer.url}/api/v1/blind-spots", timeout=5).json()
            except httpx.HTTPError:
                return None
            return list(got["spots"]) if got.get("observed_at") else None

        spots = wait_until(observed, timeout=90, what="healer's first blind-spot observation")
        # Only this test's nodes (the control plane is shared by the worker's tests).
        found = {(s["node"], s["rule"], s["scope"]) for s in spots if str(s["node"]).startswith(world.prefix)}
        assert found == {
            (vgpu, "GpuTooHot", "gpu 0"),
            (vgpu, "GpuTooHot", "gpu 1"),
            (silent, "GpuTooHot", "node"),
            (silent, "TensorCoresIdle", "node"),
        }, healer.tail()

        metrics = httpx.get(f"{healer.url}/metrics", timeout=5).text
        assert re.search(rf'healer_blind_spots\{{node="{vgpu}",rule="GpuTooHot"\}} 2\.0', metrics), metrics[
            -2000:
        ]
        assert f'node="{full}"' not in "".join(
            x for x in metrics.splitlines() if x.startswith("healer_blind_spots")
        )

        fleet = httpx.get(f"{healer.url}/", timeout=10).text
        panel = re.search(r'data-testid="blind-spots"(.*?)</section>', fleet, re.S)
        assert panel is not None and vgpu in panel.group(1) and silent in panel.group(1)
        assert full not in panel.group(1)

        page = httpx.get(f"{healer.url}/nodes/{vgpu}", timeout=10)
        assert page.status_code == 200, page.text[:500]
        section = re.search(r'data-testid="node-blind-spots"(.*?)</section>', page.text, re.S)
        assert section is not None and "DCGM_FI_DEV_GPU_TEMP" in section.group(1)
        assert re.search(
            r"blind spots: \d+ place\(s\) on \d+ node\(s\) where a rule cannot see", healer.tail(20000)
        )
