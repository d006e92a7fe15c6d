"""Rendered reports (HTML pages written to files or served by the dashboard)."""
