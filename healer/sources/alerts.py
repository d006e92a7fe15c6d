"""Alerts mode's source: Prometheus evaluates healer's exported rules; healer reads their alerts.

``detection.mode: alerts``. Prometheus loads the file ``healer rules export`` writes and evaluates
it on its own schedule; each tick healer sends one request, ``GET /api/v1/rules?type=alert``, and
turns the pending and firing alerts of its rules (found by the ``healer_rule`` label) into the
same per-rule results query mode gets from one query per rule, marked ``judged`` (Prometheus
applied ``for`` and ``keep_firing_for``): :func:`healer.engine.evaluation.evaluate` does the rest.

Why ``/api/v1/rules`` (and not the ``ALERTS`` series or ``/api/v1/alerts``): one answer carries,
per rule, its alerts (labels, state, ``activeAt``, the expression's value, ``keepFiringSince``)
*and* the rule's own health (``health``, ``lastError``, ``lastEvaluation``) from the same
snapshot of Prometheus's rule manager. ``ALERTS`` has neither the value (always 1) nor health, and
is a stored series subject to the 5-minute lookback; ``/api/v1/alerts`` has no health. The
answer grows with the rules and what fires, not with the fleet.

A healer rule is not judged this tick (``SourceError``, the rule frozen: neither fires nor
resolves, as a failed query in query mode) when:

- the request fails (timeout, transport, 5xx, not a Prometheus answer): every rule unavailable;
- Prometheus has no alerting rule labelled ``healer_rule=<name>``, or more than one: unavailable;
- its ``healer_rule_digest`` annotation differs from the rule healer loaded (the file in
  Prometheus was exported from other rules): unavailable;
- its ``health`` is ``err`` (the evaluation fails in Prometheus; ``lastError`` is in the message):
  :class:`~healer.errors.QueryError`, the rule's health is ``error``;
- it was never evaluated (``health: unknown``) or its ``lastEvaluation`` is more than
  ``stale_after_intervals`` group intervals before the tick (rule evaluation stopped or lags):
  unavailable. Prometheus's clock and healer's are compared: keep both on NTP.

Alert labels are the expression's labels plus ``alertname`` and the rule's static labels
(``severity``, the rule's ``labels``, ``healer_rule``); those are removed again, so a series has
the same key, node and GPU as in query mode. (An expression label named like a static label is
overwritten by Prometheus: keep rule ``labels`` names apart from the expressions' labels.)

vmalert (VictoriaMetrics) answers the same endpoint in the same shape; where it differs, healer
reads it explicitly (checked against a real vmalert 1.79 in ``tests/integration``):

- it adds ``alertgroup`` (the group's name) to every alert's labels: removed too, on an answer
  from vmalert (its rule entries carry ``group_id``, Prometheus's do not) when the value is the
  group's name;
- the rule's hold is ``keepFiringFor`` (Prometheus 2.42+) or ``keep_firing_for`` (vmalert 1.94+),
  seconds. An engine that reports none for a rule whose ``keep_firing_for`` is set evaluated the
  rule without it (vmalert before 1.94 rejects the field: export with ``--no-keep-firing-for``):
  healer then holds the rule's firing alerts itself (``QueryResult.engine_keeps_firing``). A hold
  other than the rule's: unavailable, as another version of the rule;
- ``value`` is printed as a plain number (``"86"``, Prometheus ``"8.6e+01"``), ``lastEvaluation``
  of a rule never evaluated is the zero time, ``interval`` is seconds (as Prometheus): same reading.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from healer.config import DetectionSettings, PrometheusSettings
from healer.engine.evaluation import AlertState, QueryResult, Sample
from healer.errors import QueryError, SourceError, SourceUnavailable
from healer.ruleset.export import ALERT_NAME_LABEL, DIGEST_ANNOTATION, RULE_LABEL, rule_digest
from healer.ruleset.schema import Rule
from healer.sources.base import Deadline
from healer.sources.prometheus import PrometheusSource, _excerpt

__all__ = ["PrometheusAlertsSource"]

_STATES = {"firing": True, "pending": False}
#: The label vmalert adds to every alert: the name of the rule's group.
VMALERT_GROUP_LABEL = "alertgroup"


class PrometheusAlertsSource(PrometheusSource):
    """Reads the alerts of healer's rules from a Prometheus that evaluates them (alerts mode).

    Args: as :class:`~healer.sources.prometheus.PrometheusSource`, plus ``stale_after_intervals``:
    a rule last evaluated more than this many group intervals before the tick is stale.

    ``queries_sent`` counts the HTTP requests (one per tick).
    """

    def __init__(self, url: str, *, stale_after_intervals: float = 3.0, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self.stale_after_intervals = stale_after_intervals
        self._rules_endpoint = f"{self.url}/api/v1/rules"

    @classmethod
    def from_settings(
        cls, settings: PrometheusSettings, detection: DetectionSettings | None = None
    ) -> PrometheusAlertsSource:
        return cls(
            settings.url,
            stale_after_intervals=(detection or DetectionSettings()).stale_after_intervals,
            timeout_seconds=settings.timeout_seconds,
            tick_deadline_seconds=settings.tick_deadline_seconds,
            verify_tls=settings.verify_tls,
            headers=settings.headers,
        )

    def __enter__(self) -> PrometheusAlertsSource:
        return self

    def alert_states(
        self, rules: Iterable[Rule], *, at: datetime, deadline: Deadline | None = None
    ) -> dict[str, QueryResult | SourceError]:
        """Each rule's pending and firing alerts at ``at`` (aware UTC, healer's tick time), or why
        it cannot be judged this tick (see the module docstring). Never raises a SourceError."""
        rules = list(rules)
        try:
            groups = self._fetch(deadline)
        except SourceError as exc:
            return dict.fromkeys((r.name for r in rules), exc)
        found: dict[str, list[tuple[Mapping[str, Any], Mapping[str, Any]]]] = {}
        for group in groups:
            for prom_rule in group.get("rules") or []:
                name = (prom_rule.get("labels") or {}).get(RULE_LABEL)
                if prom_rule.get("type") == "alerting" and name:
                    found.setdefault(str(name), []).append((group, prom_rule))
        out: dict[str, QueryResult | SourceError] = {}
        for rule in rules:
            try:
                out[rule.name] = self._judge(rule, found.get(rule.name, []), at)
            except SourceError as exc:
                out[rule.name] = exc
            except (KeyError, TypeError, ValueError) as exc:
                out[rule.name] = SourceUnavailable(
                    f"{self._where}: malformed /api/v1/rules entry for {rule.name} "
                    f"({type(exc).__name__}: {exc})"
                )
        return out

    def _fetch(self, deadline: Deadline | None) -> list[Mapping[str, Any]]:
        budget = self.timeout_seconds
        if deadline is not None:
            budget = min(budget, deadline.remaining())
            if budget <= 0:
                raise SourceUnavailable(f"{self._where}: tick deadline passed before reading /api/v1/rules")
        status, body = self._get(self._rules_endpoint, {"type": "alert"}, budget, what="/api/v1/rules")
        try:
            doc = json.loads(body)
        except ValueError:
            raise SourceUnavailable(
                f"{self._where}: HTTP {status}, /api/v1/rules answer is not JSON: {_excerpt(body)!r}"
            ) from None
        if not isinstance(doc, dict) or doc.get("status") != "success" or status != 200:
            error = doc.get("error") if isinstance(doc, dict) else None
            raise SourceUnavailable(
                f"{self._where}: HTTP {status} from /api/v1/rules: {error or _excerpt(body)!r}"
            )
        try:
            groups = doc["data"]["groups"]
            if not isinstance(groups, list):
                raise TypeError("groups is not a list")
        except (KeyError, TypeError) as exc:
            raise SourceUnavailable(
                f"{self._where}: malformed /api/v1/rules answer: {_excerpt(body)!r}"
            ) from exc
        return groups

    def _judge(
        self, rule: Rule, copies: list[tuple[Mapping[str, Any], Mapping[str, Any]]], at: datetime
    ) -> QueryResult:
        if not copies:
            raise SourceUnavailable(
                f"{self._where}: no alerting rule labelled {RULE_LABEL}={rule.name!r} in Prometheus: "
                "load the file `healer rules export` writes (rule_files, or a PrometheusRule)"
            )
        if len(copies) > 1:
            where = ", ".join(f"{g.get('file')}:{g.get('name')}" for g, _ in copies)
            raise SourceUnavailable(
                f"{self._where}: {len(copies)} alerting rules labelled {RULE_LABEL}={rule.name!r} ({where}): "
                "load healer's rule file once"
            )
        group, prom_rule = copies[0]
        digest = (prom_rule.get("annotations") or {}).get(DIGEST_ANNOTATION)
        if digest != rule_digest(rule):
            raise SourceUnavailable(
                f"{self._where}: Prometheus evaluates another version of {rule.name} "
                f"({DIGEST_ANNOTATION} {digest!r}, healer's rule {rule_digest(rule)!r}): "
                "re-export (`healer rules export`) and reload Prometheus"
            )
        health = prom_rule.get("health")
        if health == "err":
            raise QueryError(
                f"{self._where}: Prometheus fails to evaluate {rule.name}: {prom_rule.get('lastError')}"
            )
        last = api_time(prom_rule.get("lastEvaluation"))
        if health != "ok" or last is None:
            raise SourceUnavailable(f"{self._where}: Prometheus has not evaluated {rule.name} yet")
        interval = float(group.get("interval") or 0)
        age = (at - last).total_seconds()
        if interval > 0 and age > self.stale_after_intervals * interval:
            raise SourceUnavailable(
                f"{self._where}: Prometheus last evaluated {rule.name} {age:.0f}s before this tick "
                f"(its group runs every {interval:g}s): rule evaluation is stopped or lagging"
            )
        engine_keeps_firing = self._engine_hold(rule, prom_rule)
        static = set(prom_rule.get("labels") or {}) | {ALERT_NAME_LABEL}
        group_label = (VMALERT_GROUP_LABEL, str(group.get("name"))) if "group_id" in prom_rule else None
        samples = []
        for alert in prom_rule.get("alerts") or []:
            state = _STATES.get(str(alert.get("state")))
            if state is None:
                continue  # inactive (resolved, kept for Alertmanager): not a finding
            labels = {
                k: str(v)
                for k, v in (alert.get("labels") or {}).items()
                if k not in static and (k, str(v)) != group_label
            }
            samples.append(
                Sample(
                    labels=labels,
                    value=float(alert["value"]),
                    alert=AlertState(
                        firing=state,
                        active_at=api_time(alert.get("activeAt")),
                        keep_firing_since=api_time(alert.get("keepFiringSince")),
                    ),
                )
            )
        return QueryResult(samples=samples, judged=True, engine_keeps_firing=engine_keeps_firing)

    def _engine_hold(self, rule: Rule, prom_rule: Mapping[str, Any]) -> bool:
        """True when the engine applies ``rule``'s ``keep_firing_for`` itself, False when it
        reports no hold for it (healer holds); raises SourceUnavailable on another hold."""
        reported = prom_rule.get("keepFiringFor", prom_rule.get("keep_firing_for"))
        hold = float(reported or 0)
        if hold == rule.keep_firing_for:
            return True
        if hold == 0:
            return False
        raise SourceUnavailable(
            f"{self._where}: the engine holds {rule.name} for {hold:g}s after it clears "
            f"(keep_firing_for), healer's rule {rule.keep_firing_for:g}s: re-export "
            "(`healer rules export`) and reload it"
        )


def api_time(text: object) -> datetime | None:
    """An RFC 3339 time from the API (nanoseconds cut to microseconds); None when absent or zero."""
    if not isinstance(text, str) or not text or text.startswith("0001-01-01"):
        return None
    return _parse_time(text)


@functools.lru_cache(maxsize=4096)
def _parse_time(text: str) -> datetime:
    """Cached: the alerts of one evaluation share their ``activeAt`` stamps."""
    head, _, rest = text.partition(".")
    if rest:
        digits = "".join(c for c in rest if c.isdigit())
        zone = rest[len(digits) :]
        text = f"{head}.{digits[:6]}{zone}"
    return datetime.fromisoformat(text.replace("Z", "+00:00"))
