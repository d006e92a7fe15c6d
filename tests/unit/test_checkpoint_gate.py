"""Checkpoint before eviction (``healer.actions.checkpoint``): who waits and who may go, from the
pod's annotations and the time alone (``ask=False``: nothing is written)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kubernetes import client as k8s

from healer.actions.checkpoint import CheckpointKeys, gate, wait_seconds

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
KEYS = CheckpointKeys.for_domain("healer.dev")


def at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(name: str, *, gpus: int = 1, labels: dict[str, str] | None = None, **annotations: str) -> k8s.V1Pod:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else None
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=name, namespace="ml", labels=labels, annotations=annotations or None),
        spec=k8s.V1PodSpec(
            containers=[k8s.V1Container(name="c", resources=k8s.V1ResourceRequirements(limits=limits))]
        ),
    )


def asked(name: str) -> k8s.V1Pod:
    """Asked at T0 for incident 7, no answer yet."""
    return _with(name, {KEYS.requested: at(0), KEYS.deadline: at(300), KEYS.incident: "7"})


def _with(name: str, notes: dict[str, str]) -> k8s.V1Pod:
    p = pod(name)
    p.metadata.annotations = notes
    return p


def run(pods: list[k8s.V1Pod], now: float, **kw: object):  # type: ignore[no-untyped-def]
    options = {"rule_seconds": 300.0, "label_seconds": 600.0, **kw}
    return gate(
        None,  # type: ignore[arg-type]
        pods,
        incident=7,
        now=T0 + timedelta(seconds=now),
        keys=KEYS,
        request_timeout=1,
        ask=False,
        **options,  # type: ignore[arg-type]
    )


def test_who_is_asked() -> None:
    def seconds(p: k8s.V1Pod, rule: float) -> float:
        return wait_seconds(p, rule_seconds=rule, label_seconds=600, keys=KEYS)

    assert seconds(pod("trainer"), 300) == 300
    assert seconds(pod("logger", gpus=0), 300) == 0
    assert seconds(pod("trainer"), 0) == 0
    assert seconds(pod("opted", gpus=0, labels={KEYS.label: "true"}), 0) == 600
    assert seconds(pod("opted", gpus=0, labels={KEYS.label: "true"}), 300) == 300


def test_a_new_request_waits_and_an_answer_or_the_deadline_releases() -> None:
    fresh = run([pod("a")], now=0)
    assert fresh.waiting == ["ml/a"] and fresh.times["ml/a"] == {"requested_at": at(0), "deadline": at(300)}
    assert run([asked("b")], now=100).waiting == ["ml/b"]
    answered = run(
        [_with("c", {KEYS.requested: at(0), KEYS.deadline: at(300), KEYS.incident: "7", KEYS.done: at(90)})],
        now=100,
    )
    assert [p.metadata.name for p in answered.ready] == ["c"]
    assert answered.times["ml/c"]["acknowledged_at"] == at(90)
    late = run([asked("d")], now=300)
    assert [p.metadata.name for p in late.ready] == ["d"] and late.times["ml/d"]["deadline_passed_at"] == at(
        300
    )


def test_an_old_answer_does_not_count_and_another_incident_asks_again() -> None:
    stale = _with(
        "e", {KEYS.requested: at(50), KEYS.deadline: at(350), KEYS.incident: "7", KEYS.done: at(10)}
    )
    assert run([stale], now=100).waiting == ["ml/e"]
    other = _with("f", {KEYS.requested: at(0), KEYS.deadline: at(300), KEYS.incident: "6", KEYS.done: at(5)})
    again = run([other], now=100)
    assert again.waiting == ["ml/f"] and again.times["ml/f"]["requested_at"] == at(100)


def test_never_past_the_drains_own_deadline() -> None:
    capped = run([pod("g")], now=0, latest=T0 + timedelta(seconds=60))
    assert capped.times["ml/g"]["deadline"] == at(60)
    over = run([pod("h")], now=61, latest=T0 + timedelta(seconds=60))
    assert [p.metadata.name for p in over.ready] == ["h"]
