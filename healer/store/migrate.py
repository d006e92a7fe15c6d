"""Alembic migrations, run from code (``healer db upgrade``) with the URL from settings."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from healer.errors import StoreError

#: migrations/ sits at the repository top level, beside healer/.
MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


def alembic_config(url: str) -> Config:
    """An Alembic config pointing at ``migrations/`` with ``url`` as the database."""
    if not (MIGRATIONS_DIR / "env.py").is_file():
        raise StoreError(f"migrations not found at {MIGRATIONS_DIR}")
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.attributes["configure_logger"] = False
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the database at ``url`` to ``revision`` (default: the newest)."""
    command.upgrade(alembic_config(url), revision)
