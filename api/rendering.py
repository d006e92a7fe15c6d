"""Jinja2 templates (autoescape on for every template) and the page render helper."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, FileSystemLoader
from starlette.responses import Response

TEMPLATES_DIR = Path(__file__).parent / "templates"
STATIC_DIR = Path(__file__).parent / "static"


def format_duration(seconds: float | None) -> str:
    """``3725`` → ``1h 2m``; compact, for ages and times to acknowledge."""
    if seconds is None:
        return "-"
    seconds = max(0, int(seconds))
    days, rem = divmod(seconds, 86400)
    hours, rem = divmod(rem, 3600)
    minutes, secs = divmod(rem, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m {secs}s"
    return f"{secs}s"


def format_time(value: datetime | str | None) -> str:
    """An aware datetime (or its ISO 8601 text, as a switch records it) as ``2026-03-01 12:30:05Z``
    (UTC, second precision); text that is no time is shown as it is."""
    if value is None:
        return "-"
    if isinstance(value, str):
        try:
            return format_time(datetime.fromisoformat(value))
        except ValueError:
            return value
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def format_value(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.6g}"


def _tojson_compact(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def make_environment() -> Environment:
    """The template environment. Autoescape is on for every template, whatever its extension:
    label values, reasons and notes come from metrics, the cluster or users."""
    env = Environment(loader=FileSystemLoader(TEMPLATES_DIR), autoescape=True, auto_reload=False)
    env.filters["duration"] = format_duration
    env.filters["time"] = format_time
    env.filters["num"] = format_value
    env.filters["compact_json"] = _tojson_compact
    return env


_templates = Jinja2Templates(env=make_environment())


def render(request: Request, name: str, context: dict[str, Any], *, status_code: int = 200) -> Response:
    """Render template ``name`` with ``context`` plus what every page needs (caller, CSRF token)."""
    state = request.scope.get("state", {})
    identity = state.get("identity")
    csrf_id = state.get("csrf_id")
    auth = getattr(request.app.state, "auth", None)
    base = {
        "identity": identity,
        "csrf_token": auth.csrf_token(csrf_id, state.get("session_id"))
        if auth is not None and csrf_id
        else "",
        "path": request.url.path,
    }
    return _templates.TemplateResponse(request, name, {**base, **context}, status_code=status_code)
