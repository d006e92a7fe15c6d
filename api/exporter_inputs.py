"""The Rules page's check of the rules' inputs: metrics they read that no target exports now.

One range query of a single point at ``now`` through the dashboard's Prometheus adapter (its short
timeout: a slow Prometheus never holds the page); the structure of each rule's expression decides
which absent metrics matter (:mod:`healer.ruleset.inputs`). ``healer doctor exporters`` prints the
same with the counters CSV line that adds each field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from api.schemas import RulesOut
from healer.errors import SourceError
from healer.ruleset.inputs import PromqlSyntax, RuleInputs, check_rule, presence_query
from healer.ruleset.schema import RuleSet
from healer.sources.prometheus_range import PrometheusRange


@dataclass(frozen=True)
class InputsCheck:
    """``by_rule``: rule → its absent inputs (rules with none are left out); ``error``: why the
    check could not run (no rule set, Prometheus unreachable), None when it ran."""

    by_rule: dict[str, RuleInputs] = field(default_factory=dict)
    error: str | None = None

    @property
    def blind(self) -> list[str]:
        """Rules reading a required metric no target exports (they find nothing)."""
        return [name for name, c in self.by_rule.items() if c.blind]


def check_inputs(prometheus: PrometheusRange, ruleset: RuleSet | None, *, now: datetime) -> InputsCheck:
    """Which inputs of ``ruleset``'s rules no target exports at ``now``."""
    if ruleset is None or not ruleset.rules:
        return InputsCheck(error="no rule set loaded in this process")
    try:
        query = presence_query([r.expr for r in ruleset.rules])
        series = prometheus.query_range(query, start=now, end=now, step_seconds=1)
        present = {s.labels.get("__name__", "") for s in series}
        checks = [check_rule(r.name, r.expr, present) for r in ruleset.rules]
    except SourceError as exc:
        return InputsCheck(error=str(exc))  # the adapter's messages carry no credentials
    except PromqlSyntax as exc:  # promtool checked the rules; a syntax only it knows, say so
        return InputsCheck(error=f"a rule's expression could not be read: {exc}")
    absent = [c for c in checks if c.required or c.events or c.optional or c.hardware]
    return InputsCheck(by_rule={c.rule: c for c in absent})


def with_inputs(page: RulesOut, check: InputsCheck) -> RulesOut:
    """``page`` with each rule's required absent inputs and the check's error, if any."""
    rules = [
        r.model_copy(update={"absent_inputs": [str(i) for i in c.required]})
        if (c := check.by_rule.get(r.name)) is not None
        else r
        for r in page.rules
    ]
    return page.model_copy(update={"rules": rules, "inputs_error": check.error})
