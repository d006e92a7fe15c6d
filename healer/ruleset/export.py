"""The rule set as Prometheus evaluates it: a rule file, or a Prometheus Operator ``PrometheusRule``.

Used by ``healer rules export`` and by alerts mode (``detection.mode: alerts``), where Prometheus
evaluates the exported file and healer reads its pending and firing alerts
(:mod:`healer.sources.alerts`). Pure: builds plain data, writes nothing.

Each healer rule becomes one Prometheus alerting rule (format: Prometheus docs, "Alerting rules";
``keep_firing_for`` needs Prometheus 2.42+):

- ``alert``: the rule name; ``expr``, ``for`` and ``keep_firing_for`` as healer evaluates them;
- ``labels``: ``severity``, the rule's own ``labels``, and :data:`RULE_LABEL` (``healer_rule``:
  the rule's name), by which healer finds its rules among every other alert;
- ``annotations``: the rule's own; healer's keys that differ from their defaults
  (:data:`HEALER_ANNOTATIONS`: ``healer_actions: "quarantine, drain: {timeout: 1h}, ticket"``...;
  the pool is the rule's own, else its group's); and :data:`DIGEST_ANNOTATION`, a digest of what
  decides a finding (``expr``, ``for``, ``keep_firing_for``): alerts mode refuses a rule whose
  copy in Prometheus differs from the rule healer loaded (an export not reloaded).

A group's recording rules (from a Prometheus rule file) come first in it, as ``record``, ``expr``
and ``labels``, so its alerting rules read what they record at the same evaluation.

Every group gets an ``interval`` (the group's, else ``scheduler.default_interval_seconds``), so
Prometheus evaluates each group as often as healer's query mode would.

The file loads back as the same rules (:mod:`healer.ruleset.prometheus_import` reads it: the
exact inverse), except that a group without an interval has the one written, and a group's pool
comes back as each of its rules' own.

``keep_firing_for=False`` leaves ``keep_firing_for`` out, for engines that reject the field
(vmalert before 1.94, e.g. Debian's 1.79; Prometheus before 2.42). The digest still covers it:
alerts mode then sees that the engine reports no hold for the rule and holds firing alerts itself
(:mod:`healer.sources.alerts`).
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Mapping
from typing import Any, Literal

from ruamel.yaml import YAML

from healer.ruleset.durations import format_duration
from healer.ruleset.schema import PoolSpec, Rule, RuleSet, step_options

#: The label naming healer's rule on every exported alert (and so on ``ALERTS`` and Alertmanager).
RULE_LABEL = "healer_rule"
#: The annotation carrying :func:`rule_digest`.
DIGEST_ANNOTATION = "healer_rule_digest"
#: Labels Prometheus adds to an alert beyond the expression's own: stripped again in alerts mode.
ALERT_NAME_LABEL = "alertname"

PROMETHEUS_RULE_API_VERSION = "monitoring.coreos.com/v1"

#: healer's keys of a rule with no Prometheus field of their own → the annotation that carries
#: each, and how its value is written: ``list`` and ``mapping`` as a YAML flow sequence or mapping
#: without its brackets (``quarantine, drain: {timeout: 1h}``; ``name: h100, node_selector: {...}``),
#: ``text`` as the value itself. Annotation names are Prometheus label names (Prometheus 2 refuses
#: others).
HEALER_ANNOTATIONS: dict[str, tuple[str, Literal["list", "mapping", "text"]]] = {
    "actions": ("healer_actions", "list"),
    "ladder": ("healer_ladder", "list"),
    "node_labels": ("healer_node_labels", "list"),
    "gpu_label": ("healer_gpu_label", "text"),
    "unit": ("healer_unit", "text"),
    "kind": ("healer_kind", "text"),
    "mode": ("healer_mode", "text"),
    "sticky": ("healer_sticky", "text"),
    "classify": ("healer_classify", "text"),
    "pool": ("healer_pool", "mapping"),
    # Written only where the rule's labels carry an organisation's own severity (page, P1: a
    # label like any other), which then is ``labels.severity`` and healer's is this annotation.
    "severity": ("healer_severity", "text"),
}


def rule_digest(rule: Rule) -> str:
    """sha256 (first 16 hex digits) of the rule's ``expr``, ``for`` and ``keep_firing_for`` (seconds)."""
    body = json.dumps([rule.expr, rule.for_, rule.keep_firing_for], separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def alert_labels(rule: Rule) -> dict[str, str]:
    """The static labels Prometheus puts on every alert of ``rule`` (besides ``alertname``)."""
    return {"severity": rule.severity, **rule.labels, RULE_LABEL: rule.name}


def healer_annotations(rule: Rule, pool: PoolSpec | None) -> dict[str, str]:
    """The annotations of :data:`HEALER_ANNOTATIONS` for ``rule``'s keys that differ from their
    defaults; ``pool`` is the rule's pool (its own, else its group's)."""
    out: dict[str, str] = {}
    for field, (name, shape) in HEALER_ANNOTATIONS.items():
        value: Any = pool if field == "pool" else getattr(rule, field)
        if field == "severity":
            if "severity" not in rule.labels:
                continue  # labels.severity says it (alert_labels)
        elif value == Rule.model_fields[field].get_default(call_default_factory=True):
            continue
        if field in ("actions", "ladder"):
            text = ", ".join(_step_text(step) for step in value)
        elif shape == "list":
            text = _flow(list(value))[1:-1]
        elif shape == "mapping":
            text = _flow(value.model_dump(exclude_none=True))[1:-1]
        else:
            text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        out[name] = text
    return out


def _step_text(step: Any) -> str:
    """``quarantine``; ``drain: {timeout: 1h, force: true}`` (a YAML flow pair)."""
    options = step_options(step, everything=False)
    return f"{step.kind}: {_flow(options)}" if options else str(step.kind)


def _flow(value: Any) -> str:
    """``value`` (a list or mapping) as one line of YAML flow style, quoted where YAML needs it."""
    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = True
    yaml.width = 1 << 16
    yaml.sort_base_mapping_type_on_output = False  # type: ignore[assignment]  # the schema's order
    buf = io.StringIO()
    yaml.dump(value, buf)
    return buf.getvalue().strip()


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
        for record in group.records:
            recording: dict[str, Any] = {"record": record.record, "expr": record.expr}
            if record.labels:
                recording["labels"] = dict(record.labels)
            rules.append(recording)
        for rule in group.rules:
            item: dict[str, Any] = {"alert": rule.name, "expr": rule.expr}
            if rule.for_:
                item["for"] = format_duration(rule.for_)
            if rule.keep_firing_for and keep_firing_for:
                item["keep_firing_for"] = format_duration(rule.keep_firing_for)
            item["labels"] = alert_labels(rule)
            item["annotations"] = {
                **rule.annotations,
                **healer_annotations(rule, rule.pool or group.pool),
                DIGEST_ANNOTATION: rule_digest(rule),
            }
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
