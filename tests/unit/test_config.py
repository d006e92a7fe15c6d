"""Settings: defaults that work locally, YAML file, HEALER_ environment, errors that name the field."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from healer.config import load_settings
from healer.errors import ConfigError


def test_defaults_give_a_working_local_setup(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("HEALER_")]:
        monkeypatch.delenv(key)
    s = load_settings()
    assert s.database.url.startswith("sqlite:///")
    assert s.safety.dry_run is True, "a new install records, it does not act"
    assert s.rules_paths == [Path("rules")]
    assert s.detection.mode == "query", "healer queries Prometheus unless told to read its alerts"


def test_file_then_environment_then_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "healer.yaml"
    config.write_text("safety: {max_unhealthy: 3, dry_run: false}\nprometheus: {url: http://prom:9090}\n")
    monkeypatch.setenv("HEALER_SAFETY__MAX_UNHEALTHY", "5")
    s = load_settings(config)
    assert (s.safety.max_unhealthy, s.safety.dry_run, s.prometheus.url) == (5, False, "http://prom:9090")
    assert load_settings(config, safety={"max_unhealthy": 7}).safety.max_unhealthy == 7


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("safety: {max_unhealty: 3}\n", "safety.max_unhealty: Extra inputs are not permitted"),
        ("tickets: {provders: []}\n", "tickets.provders: Extra inputs are not permitted"),
        ("safty: {}\n", "safty: Extra inputs are not permitted"),
        ("detection: {mode: push}\n", "detection.mode: Input should be 'query' or 'alerts'"),
        ("safety: {max_unhealthy: -1}\n", "safety.max_unhealthy: Input should be greater than or equal to 0"),
        ("database: {url: 'mysql://x'}\n", "database.url: Value error, only sqlite:// and postgresql"),
        (
            "kubernetes: {lease_duration_seconds: 10, renew_interval_seconds: 10}\n",
            "renew_interval_seconds must be shorter than lease_duration_seconds",
        ),
    ],
)
def test_bad_settings_name_the_file_and_field(tmp_path: Path, text: str, problem: str) -> None:
    config, message = _load_error(tmp_path, text)
    assert message.startswith(f"{config}: ")
    assert problem in message


def _load_error(tmp_path: Path, text: str) -> tuple[Path, str]:
    """The settings file written with ``text`` and the message of the ConfigError loading it."""
    config = tmp_path / "healer.yaml"
    config.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_settings(config)
    return config, str(err.value)


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.yaml: config file not found"):
        load_settings(tmp_path / "nope.yaml")


def test_detection_mode_picks_the_source(monkeypatch: pytest.MonkeyPatch) -> None:
    from healer import wiring
    from healer.sources.alerts import PrometheusAlertsSource
    from healer.sources.base import AlertStateSource

    for key in [k for k in os.environ if k.startswith("HEALER_")]:
        monkeypatch.delenv(key)
    with wiring.prometheus_source(load_settings()) as query:
        assert not isinstance(query, AlertStateSource)
    settings = load_settings(detection={"mode": "alerts", "stale_after_intervals": 5})
    with wiring.prometheus_source(settings) as alerts:
        assert isinstance(alerts, PrometheusAlertsSource) and isinstance(alerts, AlertStateSource)
        assert alerts.stale_after_intervals == 5


def test_the_alertmanager_token_needs_alerts_mode(tmp_path: Path) -> None:
    config, message = _load_error(tmp_path, "detection:\n  alertmanager_token_file: /secrets/token\n")
    assert message.startswith(f"{config}: ") and "detection" in message
    assert "the Alertmanager receiver wakes alerts mode only; set detection.mode: alerts" in message
    (tmp_path / "alerts.yaml").write_text(
        "detection:\n  mode: alerts\n  alertmanager_token_file: /secrets/token\n"
    )
    assert load_settings(tmp_path / "alerts.yaml").detection.alertmanager_token_file == Path("/secrets/token")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("prometheus:\n  url: http://x:9090\n safety: [\n", ":3:2: not valid YAML: "),
        ("- a\n- b\n", ": the top level must be a mapping of settings"),
        ("just words\n", ": the top level must be a mapping of settings"),
    ],
)
def test_a_malformed_file_is_one_error_naming_it(tmp_path: Path, text: str, problem: str) -> None:
    config, message = _load_error(tmp_path, text)
    assert message.startswith(f"{config}{problem}")


def test_an_empty_file_means_the_defaults(tmp_path: Path) -> None:
    config = tmp_path / "healer.yaml"
    config.write_text("")
    assert load_settings(config).safety.dry_run == load_settings().safety.dry_run


def test_a_bad_environment_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEALER_SAFETY__DRY_RUN", "maybe")
    with pytest.raises(ConfigError) as err:
        load_settings()
    message = str(err.value)
    assert message.startswith("HEALER_SAFETY__DRY_RUN: safety.dry_run: Input should be a valid boolean")


def test_the_cli_says_invalid_settings_in_two_lines_and_exits_2(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from healer.cli import app

    config = tmp_path / "healer.yaml"
    config.write_text("prometheus:\n  url: http://x:9090\n safety: [\n")
    result = CliRunner().invoke(app, ["--config", str(config), "rules", "show"])
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0] == "error: invalid settings"
    assert result.stderr.splitlines()[1].startswith(f"{config}:3:2: not valid YAML")
    assert len(result.stderr.splitlines()) == 2  # no traceback


def test_a_variable_naming_no_settings_group_is_an_error_not_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    """A misspelt group (``SAFTEY``) would otherwise leave its setting at the default without a word
    (pydantic-settings ignores it): here dry-run would have stayed on."""
    monkeypatch.setenv("HEALER_SAFTEY__DRY_RUN", "false")
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert (
        str(err.value)
        == "HEALER_SAFTEY__DRY_RUN: no settings group 'saftey' (did you mean HEALER_SAFETY__...?)"
    )
    monkeypatch.delenv("HEALER_SAFTEY__DRY_RUN")
    monkeypatch.setenv("HEALER_SAFETY__DRY_RUN", "false")
    monkeypatch.setenv("HEALER_CONFIG_HINT", "not a setting")  # no `__`: not a setting, left alone
    assert load_settings().safety.dry_run is False
