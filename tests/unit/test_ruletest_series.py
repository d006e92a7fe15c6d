"""promtool's input_series notation, expanded as promtool documents it
(prometheus/prometheus docs/configuration/unit_testing_rules.md), and written as OpenMetrics."""

from __future__ import annotations

import math

import pytest

from healer.ruletest.series import Series, SeriesError, expand_values, openmetrics, parse_selector


@pytest.mark.parametrize(
    ("text", "values"),
    [
        ("1+1x3", [1.0, 2.0, 3.0, 4.0]),  # a+bxn: n + 1 values
        ("-2+4x3", [-2.0, 2.0, 6.0, 10.0]),
        ("1-1x3", [1.0, 0.0, -1.0, -2.0]),
        ("1x4", [1.0] * 5),  # axn: n + 1 times a
        ("1 _x3", [1.0, None, None, None]),  # _xn: n missing
        ("1 2 _ 4", [1.0, 2.0, None, 4.0]),
        ("1e3 0.5", [1000.0, 0.5]),
    ],
)
def test_values_expand_as_promtool_documents(text: str, values: list[float | None]) -> None:
    assert expand_values(text) == values


def test_special_values() -> None:
    got = expand_values("Inf -Inf NaN")
    assert got[0] == math.inf and got[1] == -math.inf and got[2] is not None and math.isnan(got[2])


def test_a_bad_token_is_named() -> None:
    with pytest.raises(SeriesError, match="'oops'"):
        expand_values("1 oops")


def test_selectors() -> None:
    assert parse_selector('m{b="2", a="x\\"y"}') == ("m", (("a", 'x"y'), ("b", "2")))
    assert parse_selector('{__name__="up", job="dcgm"}') == ("up", (("job", "dcgm"),))
    assert parse_selector("plain") == ("plain", ())
    with pytest.raises(SeriesError):
        parse_selector('{job="x"}')


def test_openmetrics_keeps_families_together_and_skips_missing_samples() -> None:
    a = Series("m", (("n", "1"),), (1.0, None, 3.0))
    b = Series("k", (), (math.inf,))
    c = Series("m", (("n", "2"),), (5.0,))
    text = openmetrics([(a, 100.0, 60.0), (b, 0.0, 60.0), (c, 100.0, 60.0)])
    assert text.splitlines() == [
        "# TYPE k gauge",
        "k +Inf 0.000",
        "# TYPE m gauge",
        'm{n="1"} 1.0 100.000',
        'm{n="1"} 3.0 220.000',
        'm{n="2"} 5.0 100.000',
        "# EOF",
    ]
