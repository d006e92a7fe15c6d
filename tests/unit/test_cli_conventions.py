"""One CLI convention: ``-o table|wide|json|yaml`` on listing commands, ISO 8601 UTC times, flags
without a type metavar, exit codes in ``healer --help``, and ``healer serve`` exiting 0 on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from healer.cli import app
from healer.store import nodes as repo
from healer.store.migrate import upgrade
from healer.store.session import make_engine, make_sessionmaker, transaction
from tests.services import free_port, wait_until

runner = CliRunner()
SINCE = datetime(2026, 12, 1, 14, 5, 0, tzinfo=UTC)


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'healer.db'}"
    upgrade(url)
    engine = make_engine(url)
    with transaction(make_sessionmaker(engine)) as session:
        node = repo.get_or_create_node(session, "gpu-node-007", now=SINCE, pool="h100")
        node.state = "quarantined"
    engine.dispose()
    return url


def _cli(db_url: str, *args: str) -> str:
    result = runner.invoke(app, list(args), env={"HEALER_DATABASE__URL": db_url})
    assert result.exit_code == 0, result.output
    return result.output


def test_node_list_speaks_table_json_and_yaml_with_iso_utc_times(db_url: str) -> None:
    table = _cli(db_url, "node", "list")
    assert table.splitlines()[0].split() == ["NODE", "STATE", "SINCE", "POOL", "INCIDENT", "RULE"]
    assert "gpu-node-007  quarantined  2026-12-01T14:05:00Z  h100" in table
    [as_json] = json.loads(_cli(db_url, "node", "list", "-o", "json"))
    assert as_json["node"] == "gpu-node-007" and as_json["since"] == "2026-12-01T14:05:00Z"
    assert yaml.safe_load(_cli(db_url, "node", "list", "--output", "yaml")) == [as_json]
    assert json.loads(_cli(db_url, "node", "list", "--json")) == [as_json]  # deprecated alias


@pytest.mark.parametrize(
    "args",
    [
        ["ticket", "list"],
        ["ticket", "stats"],
        ["breaker", "status"],
        ["node", "list", "--all"],
        ["node", "show", "gpu-node-007"],
        ["incident", "list"],
    ],
)
def test_every_listing_command_takes_o_json_and_yaml(db_url: str, args: list[str]) -> None:
    as_json = json.loads(_cli(db_url, *args, "-o", "json"))
    assert yaml.safe_load(_cli(db_url, *args, "-o", "yaml")) == as_json


@pytest.mark.parametrize(
    "args",
    [
        ["run"],
        ["evaluate"],
        ["node", "list"],
        ["node", "show"],
        ["incident", "list"],
        ["incident", "show"],
        ["ticket", "list"],
        ["breaker", "status"],
        ["demo"],
    ],
)
def test_help_shows_no_bool_metavar_and_documents_exit_codes(args: list[str]) -> None:
    result = runner.invoke(app, [*args, "--help"])
    assert result.exit_code == 0
    assert "<bool>" not in result.output
    top = runner.invoke(app, ["--help"]).output
    assert "Exit status:" in top
    assert "`healer db upgrade`" in top and "-o table|wide|json|yaml" in top


def test_serve_exits_0_on_sigterm(db_url: str, tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEALER_")}
    env |= {"HEALER_DATABASE__URL": db_url, "HEALER_RULES_PATHS": json.dumps([str(tmp_path / "none")])}
    process = subprocess.Popen(
        [sys.executable, "-m", "healer", "serve", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        wait_until(
            lambda: (
                process.poll() is not None
                or httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
            ),
            timeout=120,
            what="healer serve to answer /healthz",
        )
        assert process.poll() is None
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output.decode()
