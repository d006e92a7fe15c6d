"""The ``healer`` command starts fast: answering ``--version`` or ``--help`` loads no Kubernetes
client, web framework, database toolkit nor dev tooling; dev commands say what is missing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import healer
from healer.cli import simulate
from healer_dev.simulator.fleet import LabelStyle

#: Top-level modules a command loads only when it runs.
HEAVY = {"kubernetes", "fastapi", "starlette", "sqlalchemy", "uvicorn", "alembic", "api", "healer_dev"}


def _imported(
    *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run ``python -X importtime -m healer ARGS``; return the result and the top-level packages it
    imported (read from the interpreter's own import log on stderr)."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "healer", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
    )
    names = {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in result.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    return result, names


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["ticket", "--help"]])
def test_version_and_help_load_no_heavy_dependency(args: list[str]) -> None:
    result, imported = _imported(*args)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "healer" in imported  # the log was read
    assert imported & HEAVY == set()


def test_operator_commands_load_no_kubernetes_client_nor_web_framework(tmp_path: Path) -> None:
    env = {"HEALER_DATABASE__URL": f"sqlite:///{tmp_path / 'healer.db'}"}
    upgraded, _ = _imported("db", "upgrade", env=env)
    assert upgraded.returncode == 0, upgraded.stderr[-2000:]
    result, imported = _imported("breaker", "status", env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("circuit breaker: closed")
    assert imported & {"kubernetes", "fastapi", "starlette", "uvicorn", "api", "healer_dev"} == set()


def test_version_prints_the_version() -> None:
    result, _ = _imported("--version")
    assert result.stdout == f"healer {healer.__version__}\n"


def test_simulate_offers_the_simulator_label_styles() -> None:
    assert [s.value for s in simulate.LabelStyle] == [s.value for s in LabelStyle]


def test_dev_command_without_dev_tooling_says_what_is_missing() -> None:
    blocker = (
        "import sys\n"
        "class NoDevTooling:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'healer_dev':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, NoDevTooling())\n"
        "from healer.cli import app\n"
        "app(['simulate', '--nodes', '1'], prog_name='healer')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", blocker], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2
    assert "`healer simulate` needs healer's development tooling (the healer_dev package)" in result.stderr
