"""Remediation ladders: which repair steps a finding gets, in which order. Pure.

A rule's ``ladder`` (``healer.ruleset.schema``) lists the steps (``reset-gpu``, ``reboot``,
``ticket``, ``notify``), each with a timeout; a rule that sets none but says how to ``classify``
its findings gets the default ladder of the finding's class (medik8s ``escalatingRemediations``;
NVIDIA NVSentinel's reset → reboot → replace):

=============== ==========================================
class           default ladder
=============== ==========================================
reset           reset-gpu (10m) → reboot (30m) → ticket
reboot          reboot (30m) → ticket
fatal-replace   ticket
unknown         ticket ("contact support")
=============== ==========================================

Classes come from the Xid catalog (``rules/catalog/xid-catalog.yaml``, :mod:`healer.ruleset.xid_catalog`)
for ``xid-value``/``xid-label`` rules, and from the driver's recovery action
(``nvmlDeviceGpuRecoveryAction_t``: 1 GPU reset, 2 node reboot, 4 drain and reset; 3 drain
peer-to-peer traffic has no repair step of its own, so it is ``unknown``) for ``recovery-action``.
A part (GPU UUID) that failed before after a repair goes straight to ``ticket``
(:func:`ladder_for`'s ``repeat``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from healer.model.findings import Finding
from healer.ruleset.schema import (
    LadderStep,
    RebootStep,
    ResetGpuStep,
    Rule,
    TicketAction,
    TicketStep,
)
from healer.ruleset.xid_catalog import XidCatalog

FindingClass = Literal["reset", "reboot", "fatal-replace", "unknown"]

#: Strongest first: a node with a reset-class and a reboot-class finding needs the reboot.
_STRENGTH: dict[str, int] = {"fatal-replace": 0, "unknown": 1, "reboot": 2, "reset": 3}

#: nvmlDeviceGpuRecoveryAction_t (nvml.h): the driver's verdict → class.
RECOVERY_ACTION_CLASS: dict[int, FindingClass] = {1: "reset", 2: "reboot", 4: "reset"}


def _code(value: float | str | None) -> int | None:
    try:
        number = float(value) if value is not None else math.nan
    except ValueError:
        return None
    if not math.isfinite(number) or number <= 0:
        return None
    return round(number)


def finding_class(rule: Rule, finding: Finding, catalog: XidCatalog | None) -> FindingClass:
    """What ``finding`` says the node needs, read as its rule's ``classify`` says; ``unknown`` when
    the rule does not classify, the value is not a code, or the code is not in ``catalog``."""
    if rule.classify == "recovery-action":
        code = _code(finding.value)
        return RECOVERY_ACTION_CLASS.get(code, "unknown") if code is not None else "unknown"
    if rule.classify in ("xid-value", "xid-label") and catalog is not None:
        raw = finding.value if rule.classify == "xid-value" else finding.labels.get("xid")
        code = _code(raw)
        if code is None:
            return "unknown"
        found = catalog.classify(code)
        if found == "application":  # the workload's fault: the rule should not fire; replace is wrong
            return "unknown"
        return found
    return "unknown"


def default_ladder(
    cls: FindingClass, *, provider: str = "default", template: str | None = None
) -> tuple[LadderStep, ...]:
    """The default ladder of a class (module table), ending with a ticket to ``provider``."""
    ticket = TicketStep(provider=provider, template=template)
    if cls == "reset":
        return (ResetGpuStep(), RebootStep(), ticket)
    if cls == "reboot":
        return (RebootStep(), ticket)
    return (ticket,)


def strongest_class(classes: Sequence[FindingClass]) -> FindingClass:
    """The class needing the strongest repair (replace > unknown > reboot > reset)."""
    return min(classes, key=lambda c: _STRENGTH[c]) if classes else "unknown"


def has_ladder(rule: Rule) -> bool:
    """The rule remediates by a ladder (its own, or its class's default)."""
    return rule.ladder is not None or rule.classify is not None


def ladder_for(
    rule: Rule,
    findings: Sequence[Finding],
    catalog: XidCatalog | None,
    *,
    repeat: bool = False,
) -> tuple[tuple[LadderStep, ...], str]:
    """The ladder for ``rule``'s ``findings`` on one node, and why it was chosen.

    ``repeat``: a part of these findings failed before after a repair (the parts ledger): only the
    ladder's ticket steps remain (a default ticket when it has none). Returns ``((), reason)`` for
    a rule without a ladder.
    """
    tickets = [a for a in rule.actions if isinstance(a, TicketAction)]
    provider = tickets[0].provider if tickets else "default"
    template = tickets[0].template if tickets else None
    if rule.ladder is not None:
        steps, why = tuple(rule.ladder), f"rule {rule.name}'s ladder"
    elif rule.classify is not None:
        cls = strongest_class([finding_class(rule, f, catalog) for f in findings if f.rule == rule.name])
        steps, why = (
            default_ladder(cls, provider=provider, template=template),
            f"class {cls} ({rule.classify})",
        )
    else:
        return (), "no ladder"
    if repeat:
        kept = tuple(s for s in steps if s.kind == "ticket") or (
            TicketStep(provider=provider, template=template),
        )
        return kept, "the part failed before after a repair: straight to replacement"
    return steps, why


def describe(steps: Sequence[LadderStep]) -> str:
    """``reset-gpu (10m) → reboot (30m) → ticket (7d)``."""
    return " → ".join(step.label() for step in steps)
