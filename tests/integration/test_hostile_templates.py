"""Ticket templates only by name: a rule cannot send a file of its choice to the provider, and a
binary template fails one delivery clearly instead of crashing the delivery job.

Real rule files through ``healer rules validate`` (a subprocess), real settings files, and real
delivery to the stand-in provider over loopback on SQLite and PostgreSQL.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from healer.config import load_settings
from healer.errors import ConfigError
from healer.store.models import Ticket
from healer.tickets.delivery import deliver_due
from healer_dev.provider import Receiver
from tests.integration.test_ticket_delivery import new_ticket

RULE = """\
groups:
  - name: g
    rules:
      - name: Hot
        expr: up == 0
        annotations: {{summary: down}}
        actions:
          - ticket: {{provider: default, template: {template}}}
"""


@pytest.mark.parametrize("template", ["/etc/passwd", "../../etc/shadow", "sub/x.json.j2", "'..'"])
def test_rules_validate_refuses_template_paths_with_file_and_line(tmp_path: Path, template: str) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULE.format(template=template))
    result = subprocess.run(
        [sys.executable, "-m", "healer", "rules", "validate", str(rules)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    out = result.stdout + result.stderr
    assert f"{rules}:8:" in out and "template must be a name" in out, out
    assert "Traceback" not in out


def test_settings_refuse_template_paths(tmp_path: Path) -> None:
    provider = {"name": "acme", "url": "http://127.0.0.1:9/", "template": "/etc/passwd"}
    with pytest.raises(ConfigError, match="template must be a name"):
        load_settings(tickets={"providers": [provider]})
    with pytest.raises(ConfigError, match="template must be a name"):
        load_settings(
            tickets={"providers": [{**provider, "template": "ok.j2", "escalation_template": "../x"}]}
        )


@pytest.mark.parametrize(
    ("template", "error"),
    [
        ("blob.json.j2", "not UTF-8 text"),
        ("/etc/passwd", "must be a name"),  # a path stored by an older version
        ("mine.json.j2", None),
    ],
)
def test_delivery_by_name_from_the_templates_dir(
    session_factory: sessionmaker[Session], tmp_path: Path, template: str, error: str | None
) -> None:
    (tmp_path / "blob.json.j2").write_bytes(bytes(range(256)) * 16)
    (tmp_path / "mine.json.j2").write_text('{"mine": {{ node.name | tojson }}}')
    ticket_id = new_ticket(session_factory, template=template)
    with Receiver() as rcv, httpx.Client() as client:
        settings = load_settings(
            tickets={
                "templates_dir": str(tmp_path),
                "providers": [{"name": "acme", "url": rcv.url}],
            }
        )
        report = deliver_due(
            session_factory=session_factory, settings=settings, now=datetime.now(UTC), client=client
        )
        with session_factory() as s:
            ticket = s.get(Ticket, ticket_id)
            assert ticket is not None
        if error is None:
            assert report.delivered == 1
            assert rcv.requests[0].json == {"mine": "gpu-node-1"}
        else:
            assert report.failed == 1 and not rcv.requests  # nothing sent
            assert error in (ticket.last_error or ""), ticket.last_error
            assert "root:" not in (ticket.last_error or "")
