"""Hostile rule files: alias bombs, deep nesting, odd tags, huge or binary files.

``healer rules validate`` (a subprocess, under a 1.5 GiB address-space limit) must answer every
one with ``file:line: message`` lines and exit 1, never a traceback; the controller's reload
(:class:`~healer.rules_holder.RulesHolder`, as ``healer run`` uses it) must reject them, keep the
running rules, show the rejection on the dashboard's Rules page, and load the next good change.
"""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from healer.rules_holder import RulesHolder
from tests.integration.test_api_support import VIEWER_TOKEN, bearer, build_app, http_client

GOOD = """
groups:
  - name: thermal
    rules:
      - {name: GpuTooHot, expr: "DCGM_FI_DEV_GPU_TEMP > 78", for: 5m, annotations: {summary: hot}}
"""


def alias_bomb() -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    return "\n".join([*lines, "groups: *a9", ""])


HOSTILE: dict[str, bytes] = {
    "bomb.yaml": alias_bomb().encode(),
    "deep.yaml": b"groups: " + b"[" * 20000 + b"]" * 20000 + b"\n",
    "deep-map.yaml": b"groups:\n" + b"".join(b"  " * i + b"k:\n" for i in range(1, 200)),
    "int-tag.yaml": b"groups: !!int abc\n",
    "float-tag.yaml": b"groups:\n  - name: !!float xyz\n",
    "python-tag.yaml": b"groups: !!python/object/apply:os.system ['true']\n",
    "big.yaml": GOOD.encode() + b"# " + b"x" * (600 * 1024) + b"\n",
    "binary.yaml": bytes(range(256)) * 8,
}
PROBLEM_LINE = re.compile(r"^(?P<file>[^:]+\.yaml)(:\d+(:\d+)?)?: \S")


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (1536 * 1024 * 1024, 1536 * 1024 * 1024))


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_validate_answers_file_line_message(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_bytes(HOSTILE[name])
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "healer", "rules", "validate", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_limit_memory,
    )
    elapsed = time.monotonic() - started
    out = result.stdout + result.stderr
    assert result.returncode == 1, out[:2000]
    assert "Traceback" not in out and "Error:" not in out.split(": ", 1)[0]
    problems = [line for line in out.splitlines() if line and not line.startswith("warning:")]
    assert problems, out[:2000]
    for line in problems:
        assert PROBLEM_LINE.match(line) and line.startswith(str(path)), line[:300]
    assert elapsed < 60


def test_a_rejected_reload_is_shown_and_retried_on_the_next_change(
    tmp_path: Path, session_factory: sessionmaker[Session]
) -> None:
    rules = tmp_path / "thermal.yaml"
    rules.write_text(GOOD)
    holder = RulesHolder([tmp_path], session_factory=session_factory, clock=lambda: datetime.now(UTC))
    app = build_app(session_factory, ruleset_provider=lambda: holder.ruleset)
    for i, name in enumerate(sorted(HOSTILE)):
        rules.write_bytes(HOSTILE[name])
        st = rules.stat()
        os.utime(rules, (st.st_atime, st.st_mtime + 5 * (i + 1)))
        assert holder.reload_if_changed() is False, name
        assert [r.name for r in holder.ruleset.rules] == ["GpuTooHot"], "the old rules keep running"
        assert holder.reload_if_changed() is None  # not retried until the file changes again
        with http_client(app) as client:
            page = client.get("/rules", headers=bearer(VIEWER_TOKEN))
        assert page.status_code == 200
        assert "thermal.yaml" in page.text and "Traceback" not in page.text
    rules.write_text(GOOD.replace("GpuTooHot", "GpuHot"))
    os.utime(rules, (rules.stat().st_atime, rules.stat().st_mtime + 1000))
    assert holder.reload_if_changed() is True
    assert [r.name for r in holder.ruleset.rules] == ["GpuHot"]
