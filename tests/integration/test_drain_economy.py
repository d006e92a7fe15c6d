"""A 110-pod drain under a ``maxUnavailable: 1`` PodDisruptionBudget costs about the minimum.

Real HTTP to the Kubernetes API emulator with the official client; replacements become Ready
0.1 s after each eviction (``healer_dev.drain_scenario``). Issue 19 measured 2,180 API calls (1,770
evictions answered 429, one pod POSTed 60 times) and 600 s for this drain before.
"""

from __future__ import annotations

from healer_dev.drain_scenario import run_drain

READINESS = 0.1  # seconds from an eviction to its replacement's readiness


def test_a_budget_held_drain_sends_one_eviction_per_pod_and_follows_readiness() -> None:
    run = run_drain(pods=110, readiness_seconds=READINESS, job_interval_seconds=10, budget_wait_seconds=60)
    assert run.minimum == 112  # one list, one accepted eviction per pod, the final list
    assert run.requests <= 1.5 * run.minimum, run.by_kind
    assert run.evictions == {201: 110}  # never a POST the budget refused
    assert run.posts_per_pod_max == 1
    assert run.steps == 1  # the job interval (10 s) never entered the drain's time
    assert run.wall_seconds < 3 * 110 * READINESS + 5  # bounded by the replacements' readiness


def test_with_the_default_budget_wait_a_drain_spans_job_intervals_within_the_bound() -> None:
    """The default wait (5 s per step, then the next drain job) still never POSTs a refused
    eviction; each extra step adds a pod list, a budget list, a watch and the final list."""
    run = run_drain(pods=110, readiness_seconds=READINESS, job_interval_seconds=1, budget_wait_seconds=5)
    assert run.evictions == {201: 110}
    assert run.posts_per_pod_max == 1
    assert run.requests <= 1.5 * run.minimum, run.by_kind
    assert run.requests <= run.pods + 4 * run.steps  # per step: 2 pod lists, a budget list, a watch
