"""A node full of pods under one PodDisruptionBudget, drained on the Kubernetes API emulator.

Used by ``bench/drain_bench.py`` and by the test that holds the drain's API economy
(``tests/integration/test_drain_economy.py``). The node ``gpu-0`` runs ``pods`` replicas of one
ReplicaSet selected by a budget with ``maxUnavailable: 1``; a second node takes the replacements.
A replacement becomes Running and Ready ``readiness_seconds`` after its pod was evicted (a thread
calls :meth:`KubernetesEmulator.reschedule_evicted` on that cadence), so the budget allows the
next eviction only then, as the disruption controller would report it.

The drain runs as the controller's drain job would: one :func:`healer.actions.drain.drain_step`
every ``job_interval_seconds`` until it reports ``done``. The minimum the API server must see is
one pod list, one accepted eviction per pod and the final list (``pods + 2`` requests).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime

from kubernetes import client as k8s

from healer.actions.drain import drain_step
from healer.model.drain import DrainOptions
from healer_dev.k8s_emulator import KubernetesEmulator
from healer_dev.k8s_emulator.objects import node, pod, pod_disruption_budget

NODE, SPARE = "gpu-0", "gpu-1"


@dataclass(frozen=True)
class DrainRun:
    """What one drain cost: requests by method and path kind, evictions by HTTP code, seconds."""

    pods: int
    requests: int
    by_kind: dict[str, int]
    evictions: dict[int, int]
    posts_per_pod_max: int
    steps: int
    wall_seconds: float
    readiness_seconds: float

    @property
    def minimum(self) -> int:
        """One pod list, one accepted eviction per pod, the final list."""
        return self.pods + 2

    @property
    def ratio(self) -> float:
        return self.requests / self.minimum


def _kind(method: str, path: str) -> str:
    if path.endswith("/eviction"):
        return f"{method} eviction"
    if "poddisruptionbudgets" in path:
        return f"{method} pdb{' watch' if 'watch=' in path else ''}"
    if "/pods" in path:
        return f"{method} pods"
    return f"{method} other"


def run_drain(
    *,
    pods: int = 110,
    readiness_seconds: float = 0.05,
    job_interval_seconds: float = 10.0,
    budget_wait_seconds: float = 5.0,
    max_steps: int = 100,
) -> DrainRun:
    """Drain ``pods`` pods under a ``maxUnavailable: 1`` budget; returns the cost (see module)."""
    objects = [node(NODE), node(SPARE)]
    objects += [
        pod(f"web-{i:03d}", node_name=NODE, labels={"app": "web"}, owner=("ReplicaSet", "web-5d8f7"))
        for i in range(pods)
    ]
    objects.append(pod_disruption_budget("web", match_labels={"app": "web"}, max_unavailable=1))
    options = DrainOptions(timeout_seconds=3600, budget_wait_seconds=budget_wait_seconds)
    stop = threading.Event()
    with KubernetesEmulator() as emu:
        emu.load(objects)

        def kubelet() -> None:  # replacements become Ready readiness_seconds after an eviction
            while not stop.wait(readiness_seconds):
                emu.reschedule_evicted(SPARE)

        helper = threading.Thread(target=kubelet, name="replacements", daemon=True)
        helper.start()
        emu.requests.clear()
        started = time.monotonic()
        steps = 0
        try:
            with emu.api_client() as api:
                core, policy = k8s.CoreV1Api(api), k8s.PolicyV1Api(api)
                while steps < max_steps:
                    step_started = time.monotonic()
                    steps += 1
                    report = drain_step(
                        core,
                        policy,
                        NODE,
                        started_at=datetime.now(UTC),
                        now=datetime.now(UTC),
                        options=options,
                        request_timeout=10,
                    )
                    if report.done:
                        break
                    time.sleep(max(0.0, job_interval_seconds - (time.monotonic() - step_started)))
        finally:
            stop.set()
            helper.join(timeout=5)
        wall = time.monotonic() - started
        requests = list(emu.requests)
        evictions = Counter(e.code for e in emu.evictions)
        per_pod = Counter(e.pod for e in emu.evictions)
    return DrainRun(
        pods=pods,
        requests=len(requests),
        by_kind=dict(Counter(_kind(m, p) for m, p in requests)),
        evictions=dict(evictions),
        posts_per_pod_max=max(per_pod.values(), default=0),
        steps=steps,
        wall_seconds=wall,
        readiness_seconds=readiness_seconds,
    )
