"""``healer backtest --from/--to``: absolute and relative times."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from healer.cli.backtest import parse_time

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("now", NOW),
        ("-7d", NOW - timedelta(days=7)),
        ("now-6h", NOW - timedelta(hours=6)),
        ("-1h30m", NOW - timedelta(minutes=90)),
        ("2026-11-24T00:00:00Z", datetime(2026, 11, 24, tzinfo=UTC)),
        ("2026-11-24", datetime(2026, 11, 24, tzinfo=UTC)),
        ("2026-11-24T01:00:00+01:00", datetime(2026, 11, 24, tzinfo=UTC)),
    ],
)
def test_times(text: str, expected: datetime) -> None:
    assert parse_time(text, NOW) == expected


def test_nonsense_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        parse_time("last tuesday", NOW)


@pytest.mark.parametrize("option", ["--from", "--to"])
def test_a_bad_time_names_the_option_and_the_forms_it_takes(option: str) -> None:
    from typer.testing import CliRunner

    from healer.cli import app

    result = CliRunner().invoke(app, ["backtest", option, "yesterday"])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {option} 'yesterday' is not a time: use ISO 8601")
    assert "-7d" in result.stderr
    assert "Invalid isoformat" not in result.stderr
