"""Persistence: SQLAlchemy 2.0 models, sessions and repositories (repositories never commit)."""
