"""Regenerate the initial migration from the models (pre-release only: there is one migration).

Usage: python scripts/regen_migration.py
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from alembic import command

from healer.store.migrate import MIGRATIONS_DIR, alembic_config

target = MIGRATIONS_DIR / "versions" / "0001_initial_schema.py"
target.unlink(missing_ok=True)
with tempfile.TemporaryDirectory() as tmp:
    cfg = alembic_config(f"sqlite:///{Path(tmp) / 'gen.db'}")
    command.revision(cfg, message="initial schema", autogenerate=True, rev_id="0001")
subprocess.run(["ruff", "format", "-q", str(target)], check=True)
subprocess.run(["ruff", "check", "--fix", "-q", str(target)], check=False)
print(f"wrote {target}")
