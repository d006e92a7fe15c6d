"""Routers: ``pages`` (HTML and operator forms), ``api_v1`` (JSON), ``ops`` (health, metrics)."""
