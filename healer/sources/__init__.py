"""Metrics sources: the Prometheus adapter (``prometheus``) and the interface the tick uses (``base``)."""
