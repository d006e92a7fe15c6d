"""Ticket providers the rules ask for but the settings lack, and the start-up check built on it.

A rule's ``ticket: {provider: NAME}`` action is how an acting healer asks for the part it took out
of service to be repaired. When ``NAME`` is not in ``tickets.providers`` the ticket is recorded and
never delivered: healer would cordon and drain nodes and tell nobody. With ``safety.dry_run: false``
that is refused at start-up (:func:`refuse_acting_without_providers`) unless the operator sets
``safety.allow_missing_providers: true``; in dry-run nothing is acted on, so it is only logged.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from healer.config import Settings, TicketSettings
from healer.errors import ConfigError
from healer.ruleset.schema import Rule

#: Rule names listed per missing provider before the message says "and N more".
_NAMED_RULES = 3


@dataclass(frozen=True)
class MissingProvider:
    """A provider named by ``rules`` (in file order) that ``tickets.providers`` does not configure."""

    provider: str
    rules: tuple[str, ...]


def missing_providers(rules: Iterable[Rule], tickets: TicketSettings) -> list[MissingProvider]:
    """Every ticket provider the rules name that is not configured, sorted by provider name.

    Pure: reads only its arguments. Escalation providers of configured providers are not checked,
    nor shadow rules (``mode: shadow``: they open no ticket).
    """
    configured = {p.name for p in tickets.providers}
    wanted: dict[str, list[str]] = {}
    for rule in rules:
        if rule.mode == "shadow":
            continue
        for action in rule.actions:
            if action.kind == "ticket" and action.provider not in configured:
                names = wanted.setdefault(action.provider, [])
                if rule.name not in names:
                    names.append(rule.name)
    return [MissingProvider(name, tuple(wanted[name])) for name in sorted(wanted)]


def describe(missing: MissingProvider) -> str:
    """One line naming the provider and the rules that ask for it."""
    shown = ", ".join(missing.rules[:_NAMED_RULES])
    more = len(missing.rules) - _NAMED_RULES
    rules = f"{shown} and {more} more" if more > 0 else shown
    who = f"rules {rules} open" if len(missing.rules) > 1 else f"rule {rules} opens"
    return f"{who} tickets with provider {missing.provider!r}, which tickets.providers does not configure"


def refuse_acting_without_providers(rules: Iterable[Rule], settings: Settings) -> None:
    """Refuse to act when a rule's tickets could never be delivered.

    Raises:
        ConfigError: ``safety.dry_run`` is off, ``safety.allow_missing_providers`` is not set, and
            a rule names an unconfigured provider; one line per missing provider.
    """
    if settings.safety.dry_run or settings.safety.allow_missing_providers:
        return
    missing = missing_providers(rules, settings.tickets)
    if missing:
        raise ConfigError(
            "\n".join(
                f"{describe(m)}: healer would take nodes out of service and never ask for their repair; "
                "configure the provider, or set safety.dry_run: true, "
                "or accept it with safety.allow_missing_providers: true"
                for m in missing
            )
        )
