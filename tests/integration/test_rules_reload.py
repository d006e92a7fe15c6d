"""A running controller's rule set: reloads on change or on request; a bad reload keeps the old
rules running and is recorded for the dashboard's Rules page (switches.ruleset)."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from healer.errors import RuleError
from healer.rules_holder import RulesHolder
from healer.store import nodes as repo

NOW = datetime(2026, 6, 1, tzinfo=UTC)
GOOD = """
groups:
  - name: thermal
    interval: 30s
    rules:
      - {name: GpuTooHot, expr: "DCGM_FI_DEV_GPU_TEMP > 78", for: 5m}
"""
BETTER = GOOD.replace("> 78", "> 80").replace("GpuTooHot", "GpuHot")
BAD = GOOD.replace("for: 5m", "for: 5 minutes")


def _touch(path: Path, text: str) -> None:
    path.write_text(text)
    st = path.stat()
    os.utime(path, (st.st_atime, st.st_mtime + 5))  # a visible change even within one mtime tick


def test_reload_on_change_and_rejected_reload_keeps_the_old_rules(
    tmp_path: Path, session_factory: sessionmaker[Session]
) -> None:
    rules = tmp_path / "thermal.yaml"
    rules.write_text(GOOD)
    holder = RulesHolder([tmp_path], session_factory=session_factory, clock=lambda: NOW)
    assert [r.name for r in holder.ruleset.rules] == ["GpuTooHot"]
    assert holder.reload_if_changed() is None

    _touch(rules, BAD)
    assert holder.reload_if_changed() is False
    assert [r.name for r in holder.ruleset.rules] == ["GpuTooHot"], "the old rules keep running"
    with session_factory() as s:
        status = repo.get_switch(s, repo.SWITCH_RULESET)
    (rejected,) = status["rejected"]
    assert "thermal.yaml:6" in rejected["error"] and "for" in rejected["error"]

    _touch(rules, BETTER)
    assert holder.reload_if_changed() is True
    assert [r.name for r in holder.ruleset.rules] == ["GpuHot"]
    with session_factory() as s:
        assert repo.get_switch(s, repo.SWITCH_RULESET)["rejected"] == []


def test_requested_reload_happens_without_a_file_change(
    tmp_path: Path, session_factory: sessionmaker[Session]
) -> None:
    (tmp_path / "thermal.yaml").write_text(GOOD)
    holder = RulesHolder([tmp_path], session_factory=session_factory, clock=lambda: NOW)
    holder.request_reload()
    assert holder.reload_if_changed() is True
    assert holder.reload_if_changed() is None


def test_the_controller_does_not_start_on_bad_rules(tmp_path: Path) -> None:
    (tmp_path / "thermal.yaml").write_text(BAD)
    with pytest.raises(RuleError, match="for"):
        RulesHolder([tmp_path], session_factory=None, clock=lambda: NOW)
