"""How ``healer rules test`` tells promtool's test files from healer's, and resolves their
``rule_files`` as promtool does (relative to the test file's folder, absolute paths and globs kept)."""

from __future__ import annotations

from pathlib import Path

import pytest

from healer.ruletest.promtool import resolve_rule_files, rule_file_kind


def test_rule_files_resolve_against_the_test_files_folder(tmp_path: Path) -> None:
    test = tmp_path / "tests" / "t.yml"
    got = resolve_rule_files(test, ["a.yml", "../rules/*.yml", "/etc/x.yml", ""])
    assert got == [
        str(tmp_path / "tests" / "a.yml"),
        str(tmp_path / "rules" / "*.yml"),  # the glob is promtool's to expand
        "/etc/x.yml",
        "",  # promtool warns that it matches nothing
    ]


def test_relative_test_paths_resolve_to_the_same_files_from_anywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve_rule_files(Path("tests/t.yml"), ["a.yml"]) == [str(tmp_path / "tests" / "a.yml")]


def test_rule_file_kinds(tmp_path: Path) -> None:
    prom = tmp_path / "prom.yml"
    prom.write_text(
        "groups:\n  - name: g\n    rules:\n      - {record: r, expr: '1'}\n      - {alert: A, expr: '1'}\n"
    )
    healer = tmp_path / "healer.yml"
    healer.write_text("groups:\n  - name: g\n    rules:\n      - {name: GpuTooHot, expr: '1'}\n")
    empty = tmp_path / "empty.yml"
    empty.write_text("groups: []\n")
    broken = tmp_path / "broken.yml"
    broken.write_text("groups: [\n")
    assert rule_file_kind(prom) == "prometheus"
    assert rule_file_kind(healer) == "healer"
    assert rule_file_kind(empty) is None
    assert rule_file_kind(broken) is None
    assert rule_file_kind(tmp_path / "missing.yml") is None
