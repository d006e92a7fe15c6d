"""Alembic migrations, run from code (``healer db upgrade``) with the URL from settings.

Replicas may start together, each running the migrations (``healer run --upgrade-db``, an init
container per pod). On PostgreSQL the upgrade holds a session-level advisory lock, so they run one
after another: the first migrates, the next finds the schema at head and does nothing (Alembic
itself takes no lock; without one the second fails on ``CREATE TABLE`` of a table that now
exists). SQLite serves one replica and is migrated by it alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import pool, text

from healer.errors import StoreError
from healer.store.session import make_engine

#: migrations/ sits at the repository top level, beside healer/.
MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"
#: The advisory lock's key, a bigint every replica agrees on ("healer" + "mi" in ASCII).
MIGRATION_LOCK_KEY = 0x6865616C65726D69 & 0x7FFF_FFFF_FFFF_FFFF


def alembic_config(url: str) -> Config:
    """An Alembic config pointing at ``migrations/`` with ``url`` as the database."""
    if not (MIGRATIONS_DIR / "env.py").is_file():
        raise StoreError(f"migrations not found at {MIGRATIONS_DIR}")
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.attributes["configure_logger"] = False
    return cfg


@contextlib.contextmanager
def migration_lock(url: str) -> Iterator[None]:
    """Hold PostgreSQL's advisory lock ``MIGRATION_LOCK_KEY`` (waiting for it) on a connection of
    its own for the duration; nothing to hold on other databases. The lock goes with the
    connection, also when the process dies."""
    if not url.startswith("postgresql"):
        yield
        return
    engine = make_engine(url, poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
            conn.commit()  # the lock is the session's, not the transaction's: do not sit idle in one
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK_KEY})
                conn.commit()
    finally:
        engine.dispose()


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the database at ``url`` to ``revision`` (default: the newest), one replica at a time."""
    cfg = alembic_config(url)
    with migration_lock(url):
        command.upgrade(cfg, revision)
