"""What Alertmanager's webhook sends (alerts mode's receiver, ``POST /api/v1/alertmanager/webhook``).

The payload is Alertmanager's webhook message, version ``"4"`` (upstream:
``prometheus/alertmanager`` ``notify/webhook/webhook.go``, ``Message``: the template data plus
``version``, ``groupKey`` and ``truncatedAlerts``)::

    {"version": "4", "groupKey": "{}:{alertname=\\"GpuTooHot\\"}", "truncatedAlerts": 0,
     "status": "firing" | "resolved", "receiver": "healer", "externalURL": "http://am:9093",
     "groupLabels": {...}, "commonLabels": {...}, "commonAnnotations": {...},
     "alerts": [{"status": "firing" | "resolved", "labels": {...}, "annotations": {...},
                 "startsAt": "2026-12-03T17:00:00.123Z", "endsAt": "0001-01-01T00:00:00Z",
                 "generatorURL": "...", "fingerprint": "..."}]}

healer reads only what it needs to decide whether to look now: the alerts of its own rules
(``healer_rule`` label) and, for the log, the node each one names. Nothing here is a fact about a
node: the early tick reads Prometheus like any tick. Unknown fields are ignored (a newer
Alertmanager may add some); a missing or mistyped field that healer reads is an error naming it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from healer.ruleset.export import RULE_LABEL

__all__ = ["NotificationError", "WebhookSummary", "read_notification"]

#: Names listed in a summary at most (a notification may carry thousands of alerts).
MAX_NAMED = 20


class NotificationError(ValueError):
    """The body is not an Alertmanager webhook message healer can read; the message names the
    field (``alerts.0.status: ...``)."""


class _Alert(BaseModel):
    model_config = ConfigDict(extra="ignore")

    status: Literal["firing", "resolved"]
    labels: dict[str, str]


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    version: Literal["4"] = Field(description="Alertmanager's webhook protocol version.")
    alerts: list[_Alert]
    receiver: str = ""
    truncatedAlerts: int = Field(0, ge=0)


@dataclass(frozen=True)
class WebhookSummary:
    """One notification, as healer reads it.

    ``alerts``: alerts in the body; ``truncated``: alerts Alertmanager left out (``max_alerts``);
    ``healer_alerts``: those of healer's rules (with a ``healer_rule`` label), firing or resolved;
    ``rules`` and ``nodes``: the rules and the node label values they name, sorted, at most
    :data:`MAX_NAMED` each (unchecked: a name here need not be a Node).
    """

    receiver: str
    alerts: int
    truncated: int
    healer_alerts: int
    rules: tuple[str, ...]
    nodes: tuple[str, ...]


def read_notification(body: bytes, *, node_labels: Callable[[str], Sequence[str]]) -> WebhookSummary:
    """Read an Alertmanager webhook body (JSON bytes).

    ``node_labels(rule)``: the labels that name a node in ``rule``'s alerts, in order (the rule's
    ``node_labels``); the first one an alert has is the node it names.

    Raises:
        NotificationError: not JSON, not version 4, or a field healer reads is missing or mistyped.
    """
    try:
        message = _Message.model_validate_json(body)
    except ValidationError as exc:
        raise NotificationError(
            "not an Alertmanager webhook message (version 4): "
            + "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}"
                for e in exc.errors(include_input=False, include_url=False)[:5]
            )
        ) from None
    ours = [a for a in message.alerts if a.labels.get(RULE_LABEL)]
    rules = {a.labels[RULE_LABEL] for a in ours}
    nodes = set()
    for alert in ours:
        label = next((n for n in node_labels(alert.labels[RULE_LABEL]) if alert.labels.get(n)), None)
        if label is not None:
            nodes.add(alert.labels[label])
    return WebhookSummary(
        receiver=message.receiver,
        alerts=len(message.alerts),
        truncated=message.truncatedAlerts,
        healer_alerts=len(ours),
        rules=tuple(sorted(rules)[:MAX_NAMED]),
        nodes=tuple(sorted(nodes)[:MAX_NAMED]),
    )
