"""Moved to :mod:`healer.model.findings`; re-exported while other branches still import it here."""

from healer.model.findings import Finding, TickFindings, UnresolvedSeries, json_safe_value

__all__ = ["Finding", "TickFindings", "UnresolvedSeries", "json_safe_value"]
