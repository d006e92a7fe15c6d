"""The rule set as Prometheus evaluates it: a rule file, or a Prometheus Operator ``PrometheusRule``.

Used by ``healer rules export`` and by alerts mode (``detection.mode: alerts``), where Prometheus
evaluates the exported file and healer reads its pending and firing alerts
(:mod:`healer.sources.alerts`). Pure: builds plain data, writes nothing.

Each healer rule becomes one Prometheus alerting rule (format: Prometheus docs, "Alerting rules";
``keep_firing_for`` needs Prometheus 2.42+):

- ``alert``: the rule name; ``expr``, ``for`` and ``keep_firing_for`` as healer evaluates them;
- ``labels``: ``severity``, the rule's own ``labels``, and :data:`RULE_LABEL` (``healer_rule``:
  the rule's name), by which healer finds its rules among every other alert;
- ``annotations``: the rule's own, plus :data:`DIGEST_ANNOTATION`, a digest of what decides a
  finding (``expr``, ``for``, ``keep_firing_for``): alerts mode refuses a rule whose copy in
  Prometheus differs from the rule healer loaded (an export not reloaded).

Every group gets an ``interval`` (the group's, else ``scheduler.default_interval_seconds``), so
Prometheus evaluates each group as often as healer's query mode would.

``keep_firing_for=False`` leaves ``keep_firing_for`` out, for engines that reject the field
(vmalert before 1.94, e.g. Debian's 1.79; Prometheus before 2.42). The digest still covers it:
alerts mode then sees that the engine reports no hold for the rule and holds firing alerts itself
(:mod:`healer.sources.alerts`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from healer.ruleset.durations import format_duration
from healer.ruleset.schema import Rule, RuleSet

#: The label naming healer's rule on every exported alert (and so on ``ALERTS`` and Alertmanager).
RULE_LABEL = "healer_rule"
#: The annotation carrying :func:`rule_digest`.
DIGEST_ANNOTATION = "healer_rule_digest"
#: Labels Prometheus adds to an alert beyond the expression's own: stripped again in alerts mode.
ALERT_NAME_LABEL = "alertname"

PROMETHEUS_RULE_API_VERSION = "monitoring.coreos.com/v1"


def rule_digest(rule: Rule) -> str:
    """sha256 (first 16 hex digits) of the rule's ``expr``, ``for`` and ``keep_firing_for`` (seconds)."""
    body = json.dumps([rule.expr, rule.for_, rule.keep_firing_for], separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def alert_labels(rule: Rule) -> dict[str, str]:
    """The static labels Prometheus puts on every alert of ``rule`` (besides ``alertname``)."""
    return {"severity": rule.severity, **rule.labels, RULE_LABEL: rule.name}


def prometheus_rule_groups(
    ruleset: RuleSet, *, default_interval_seconds: float | None, keep_firing_for: bool = True
) -> list[dict[str, Any]]:
    """The ``groups`` list of a Prometheus rule file (also a ``PrometheusRule``'s ``spec.groups``).

    A group without an ``interval`` gets ``default_interval_seconds``; None writes none for it
    (Prometheus's global ``evaluation_interval`` then applies). ``keep_firing_for=False``: the
    field is left out (see the module docstring)."""
    groups: list[dict[str, Any]] = []
    for group in ruleset.groups:
        rules: list[dict[str, Any]] = []
        for rule in group.rules:
            item: dict[str, Any] = {"alert": rule.name, "expr": rule.expr}
            if rule.for_:
                item["for"] = format_duration(rule.for_)
            if rule.keep_firing_for and keep_firing_for:
                item["keep_firing_for"] = format_duration(rule.keep_firing_for)
            item["labels"] = alert_labels(rule)
            item["annotations"] = {**rule.annotations, DIGEST_ANNOTATION: rule_digest(rule)}
            rules.append(item)
        out: dict[str, Any] = {"name": group.name}
        interval = group.interval or default_interval_seconds
        if interval:
            out["interval"] = format_duration(interval)
        out["rules"] = rules
        groups.append(out)
    return groups


def prometheus_rule_file(
    ruleset: RuleSet, *, default_interval_seconds: float | None, keep_firing_for: bool = True
) -> dict[str, Any]:
    """A Prometheus rule file (``rule_files:`` of prometheus.yml; ``promtool check rules`` accepts
    it; vmalert reads it too, with ``keep_firing_for=False`` before vmalert 1.94)."""
    return {
        "groups": prometheus_rule_groups(
            ruleset, default_interval_seconds=default_interval_seconds, keep_firing_for=keep_firing_for
        )
    }


def prometheus_rule_object(
    ruleset: RuleSet,
    *,
    default_interval_seconds: float,
    name: str = "healer-rules",
    namespace: str | None = None,
    labels: Mapping[str, str] | None = None,
    keep_firing_for: bool = True,
) -> dict[str, Any]:
    """A ``monitoring.coreos.com/v1`` ``PrometheusRule`` for the Prometheus Operator.

    ``labels`` go on the object's metadata: they must match the ``ruleSelector`` of the
    ``Prometheus`` resource (kube-prometheus-stack selects ``release: <its release name>``).
    """
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    metadata["labels"] = {"app.kubernetes.io/name": "healer", **(labels or {})}
    return {
        "apiVersion": PROMETHEUS_RULE_API_VERSION,
        "kind": "PrometheusRule",
        "metadata": metadata,
        "spec": {
            "groups": prometheus_rule_groups(
                ruleset, default_interval_seconds=default_interval_seconds, keep_firing_for=keep_firing_for
            )
        },
    }
