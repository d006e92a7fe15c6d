"""Which ticket providers the rules need but the settings lack, and when that stops healer acting."""

from __future__ import annotations

import pytest

from healer.config import ProviderSettings, Settings, TicketSettings
from healer.errors import ConfigError
from healer.ruleset.schema import Rule
from healer.tickets.coverage import (
    MissingProvider,
    describe,
    missing_providers,
    refuse_acting_without_providers,
)


def _rule(name: str, *providers: str) -> Rule:
    actions: list[object] = ["quarantine", *({"ticket": {"provider": p}} for p in providers)]
    return Rule.model_validate({"name": name, "expr": "up == 0", "actions": actions})


RULES = [
    _rule("GpuTooHot", "default"),
    _rule("XidFatal", "default", "oncall"),
    _rule("NvlinkBurst", "default"),
    _rule("IbFlap", "default"),
    _rule("Quiet"),
]


def _tickets(*names: str) -> TicketSettings:
    return TicketSettings(
        providers=[ProviderSettings(name=n, url=f"https://{n}.example/hook") for n in names]
    )


def test_lists_each_unconfigured_provider_with_the_rules_that_name_it() -> None:
    assert missing_providers(RULES, _tickets("oncall")) == [
        MissingProvider("default", ("GpuTooHot", "XidFatal", "NvlinkBurst", "IbFlap"))
    ]
    assert missing_providers(RULES, _tickets()) == [
        MissingProvider("default", ("GpuTooHot", "XidFatal", "NvlinkBurst", "IbFlap")),
        MissingProvider("oncall", ("XidFatal",)),
    ]
    assert missing_providers(RULES, _tickets("default", "oncall")) == []


def test_describe_names_the_rules_and_the_provider_on_one_line() -> None:
    assert describe(MissingProvider("oncall", ("XidFatal",))) == (
        "rule XidFatal opens tickets with provider 'oncall', which tickets.providers does not configure"
    )
    assert describe(MissingProvider("default", ("A", "B", "C", "D", "E"))) == (
        "rules A, B, C and 2 more open tickets with provider 'default', "
        "which tickets.providers does not configure"
    )


def test_acting_without_the_provider_is_refused_unless_overridden() -> None:
    acting = Settings(safety={"dry_run": False})
    with pytest.raises(ConfigError) as refused:
        refuse_acting_without_providers(RULES, acting)
    lines = str(refused.value).splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "rules GpuTooHot, XidFatal, NvlinkBurst and 1 more open tickets with provider 'default', which "
        "tickets.providers does not configure",
        "rule XidFatal opens tickets with provider 'oncall', which tickets.providers does not configure",
    ]
    assert all("safety.allow_missing_providers: true" in line for line in lines)
    # Dry-run acts on nothing; the override is the operator's explicit choice; configured is fine.
    refuse_acting_without_providers(RULES, Settings())
    refuse_acting_without_providers(
        RULES, Settings(safety={"dry_run": False, "allow_missing_providers": True})
    )
    refuse_acting_without_providers(
        RULES,
        Settings(
            safety={"dry_run": False},
            tickets={"providers": [{"name": n, "url": "https://x.example"} for n in ("default", "oncall")]},
        ),
    )


def test_a_shadow_rule_needs_no_provider() -> None:
    from healer.config import TicketSettings
    from healer.ruleset.schema import Rule
    from healer.tickets.coverage import missing_providers

    shadow = Rule.model_validate(
        {
            "name": "Try",
            "expr": "up == 0",
            "mode": "shadow",
            "actions": ["quarantine", {"ticket": {"provider": "acme"}}],
        }
    )
    acting = shadow.model_copy(update={"mode": "acting", "name": "Act"})
    assert missing_providers([shadow], TicketSettings()) == []
    assert [m.rules for m in missing_providers([shadow, acting], TicketSettings())] == [("Act",)]
