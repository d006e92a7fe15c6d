"""Operator commands on a database without healer's schema: one line saying how to create it, a
non-zero exit, and nothing created (no empty SQLite file left behind)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

COMMANDS = [
    ["pause", "--reason", "maintenance"],
    ["resume"],
    ["node", "list"],
    ["node", "release", "gpu-node-001"],
    ["node", "show", "gpu-node-001"],
    ["incident", "list"],
    ["incident", "show", "1"],
    ["ticket", "list"],
    ["ticket", "stats"],
    ["ticket", "close", "1", "--reason", "done"],
    ["ticket", "retry", "1"],
    ["breaker", "status"],
    ["breaker", "reset"],
]


def _healer(*args: str, db_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "healer", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "HEALER_DATABASE__URL": db_url},
    )


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_a_command_without_a_database_says_in_one_line_how_to_create_it(
    tmp_path: Path, args: list[str]
) -> None:
    db = tmp_path / "healer.db"
    result = _healer(*args, db_url=f"sqlite:///{db}")
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "no healer schema" in lines[0]
    assert "`healer db upgrade`" in lines[0]
    assert not db.exists()
    assert list(tmp_path.iterdir()) == []


def test_an_existing_empty_database_file_is_left_as_it_was(tmp_path: Path) -> None:
    db = tmp_path / "healer.db"
    db.write_bytes(b"")
    result = _healer("node", "list", db_url=f"sqlite:///{db}")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"error: the database has no healer schema; create it with `healer db upgrade` (sqlite:///{db})"
    ]
    assert db.read_bytes() == b""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["healer.db"]
