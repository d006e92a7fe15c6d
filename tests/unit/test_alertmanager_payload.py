"""Alertmanager's webhook message as healer reads it (healer.sources.alertmanager)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from healer.sources.alertmanager import NotificationError, read_notification


def alert(status: str = "firing", **labels: str) -> dict[str, Any]:
    """One alert as Alertmanager 0.25 sends it (notify/webhook: template.Alert)."""
    return {
        "status": status,
        "labels": labels,
        "annotations": {"summary": "GPU 3 too hot"},
        "startsAt": "2026-12-03T17:00:00.123456789Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus:9090/graph?g0.expr=...",
        "fingerprint": "c6eadffa33fcdf37",
    }


def notification(*alerts: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A webhook message as Alertmanager 0.25 sends it (notify/webhook: ``Message``, version 4)."""
    return {
        "receiver": "healer",
        "status": "firing",
        "alerts": list(alerts),
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "version": "4",
        "groupKey": '{}:{alertname="GpuTooHot"}',
        "truncatedAlerts": 0,
        **extra,
    }


def message(*alerts: dict[str, Any], **extra: Any) -> bytes:
    return json.dumps(notification(*alerts, **extra)).encode()


def node_labels(rule: str) -> tuple[str, ...]:
    return ("node",) if rule == "NodeRule" else ("Hostname", "instance")


def test_names_healer_rules_and_their_nodes() -> None:
    body = message(
        alert(alertname="GpuTooHot", healer_rule="GpuTooHot", Hostname="gpu-01", instance="10.0.0.1:9400"),
        alert("resolved", alertname="GpuTooHot", healer_rule="GpuTooHot", instance="10.0.0.2:9400"),
        alert(alertname="X", healer_rule="NodeRule", node="gpu-03", Hostname="not-this"),
        alert(alertname="Watchdog"),  # not one of healer's
        truncatedAlerts=7,
        somethingNew={"a": 1},
    )
    summary = read_notification(body, node_labels=node_labels)
    assert summary.receiver == "healer"
    assert (summary.alerts, summary.healer_alerts, summary.truncated) == (4, 3, 7)
    assert summary.rules == ("GpuTooHot", "NodeRule")
    assert summary.nodes == ("10.0.0.2:9400", "gpu-01", "gpu-03")


def test_names_at_most_twenty_nodes() -> None:
    alerts = [alert(healer_rule="R", Hostname=f"gpu-{i:03d}") for i in range(100)]
    summary = read_notification(message(*alerts), node_labels=node_labels)
    assert summary.healer_alerts == 100
    assert len(summary.nodes) == 20


@pytest.mark.parametrize(
    ("body", "names"),
    [
        (b"not json", "Invalid JSON"),
        (b"[]", "body: Input should be an object"),
        (message(alert(), version="3"), "version: Input should be '4'"),
        (json.dumps({"version": "4"}).encode(), "alerts: Field required"),
        (message(alert("pending")), "alerts.0.status: Input should be 'firing' or 'resolved'"),
        (
            message({"status": "firing", "labels": {"n": 1}}),
            "alerts.0.labels.n: Input should be a valid string",
        ),
        (message({"status": "firing"}), "alerts.0.labels: Field required"),
    ],
)
def test_a_malformed_body_names_the_field(body: bytes, names: str) -> None:
    with pytest.raises(NotificationError, match="not an Alertmanager webhook message") as caught:
        read_notification(body, node_labels=node_labels)
    assert names in str(caught.value)
