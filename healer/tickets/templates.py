"""Payload templates: Jinja2 (sandboxed) rendering JSON bodies for providers.

A template is a name, never a path: a file directly in the directory the settings name
(``tickets.templates_dir``), else a built-in (``generic.json.j2``, ``slack.json.j2``,
``jira.json.j2``, shipped in ``healer/tickets/templates/``). Templates
get the context built by :mod:`healer.tickets.payloads` and must emit every value through the
``tojson`` filter: label values come from metrics and are attacker-controllable, and ``tojson``
turns any text into a valid JSON string. The output is parsed before it is sent, so a template
that produces broken JSON fails here, naming the template and line, instead of at the provider.

Filters besides Jinja's sandboxed built-ins:

- ``tojson``: JSON text of a value (strict: NaN and ±Inf are refused, non-ASCII escaped).
- ``slack_escape``: escape ``&``, ``<`` and ``>`` as Slack's mrkdwn requires.
- ``clip(n)``: at most ``n`` characters, with an ellipsis when cut.
"""

from __future__ import annotations

import json
import traceback
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from jinja2 import BaseLoader, StrictUndefined, TemplateError, TemplateNotFound, TemplateSyntaxError
from jinja2.environment import Environment
from jinja2.sandbox import SandboxedEnvironment

from healer.errors import TicketError
from healer.ruleset.schema import template_name_problem

#: Bumped when a field is removed or changes meaning (adding fields is compatible).
PAYLOAD_VERSION = "1"

BUILTIN_PACKAGE = "healer.tickets"
BUILTIN_DIR = "templates"


def builtin_templates() -> list[str]:
    """Names of the templates shipped with healer."""
    root = resources.files(BUILTIN_PACKAGE).joinpath(BUILTIN_DIR)
    return sorted(p.name for p in root.iterdir() if p.name.endswith(".j2"))


#: Largest template file read, bytes (the built-ins are about 2 KiB).
MAX_TEMPLATE_BYTES = 256 * 1024


class _Loader(BaseLoader):
    """Templates by name only: a file directly in ``templates_dir`` (when set), else a built-in.

    Names are checked (:func:`~healer.ruleset.schema.template_name_problem`) before anything is
    opened, and a file that resolves outside the directory (a symlink), is too large or is not
    UTF-8 text is refused with a :class:`TicketError`.
    """

    def __init__(self, templates_dir: Path | None) -> None:
        self.templates_dir = templates_dir

    def get_source(self, environment: Environment, template: str) -> tuple[str, str | None, Any]:
        problem = template_name_problem(template)
        if problem:
            raise TicketError(f"ticket template: {problem}")
        if self.templates_dir is not None:
            root = self.templates_dir.resolve()
            path = (root / template).resolve()
            if path.parent != root:
                raise TicketError(f"ticket template {template} resolves outside {self.templates_dir}")
            if path.is_file():
                return _read(path, template)
        resource = resources.files(BUILTIN_PACKAGE).joinpath(BUILTIN_DIR, template)
        if not resource.is_file():
            raise TemplateNotFound(template)
        return resource.read_text(encoding="utf-8"), template, lambda: True


def _read(path: Path, name: str) -> tuple[str, str, Any]:
    try:
        stat = path.stat()
        if stat.st_size > MAX_TEMPLATE_BYTES:
            raise TicketError(f"ticket template {name} is larger than {MAX_TEMPLATE_BYTES} bytes")
        data = path.read_bytes()[: MAX_TEMPLATE_BYTES + 1]
    except OSError as exc:
        raise TemplateNotFound(name) from exc
    try:
        source = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TicketError(f"ticket template {name} is not UTF-8 text (byte {exc.start})") from None
    if "\x00" in source:
        raise TicketError(f"ticket template {name} is not text (it contains NUL bytes)")

    def uptodate() -> bool:
        try:
            return path.stat().st_mtime == stat.st_mtime
        except OSError:
            return False

    return source, str(path), uptodate


def _tojson(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=True, allow_nan=False, sort_keys=False)
    except (TypeError, ValueError) as exc:
        raise TicketError(f"tojson: {exc}") from exc


def _slack_escape(value: Any) -> str:
    return str(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _clip(value: Any, length: int = 200) -> str:
    text = str(value)
    return text if len(text) <= length else text[: max(0, length - 1)] + "…"


@lru_cache(maxsize=8)
def environment(templates_dir: Path | None = None) -> SandboxedEnvironment:
    """The sandboxed environment for ``templates_dir`` (templates are cached and reloaded when
    their file changes)."""
    env = SandboxedEnvironment(
        loader=_Loader(templates_dir),
        undefined=StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        auto_reload=True,
        extensions=["jinja2.ext.do"],
    )
    env.filters["tojson"] = _tojson
    env.filters["slack_escape"] = _slack_escape
    env.filters["clip"] = _clip
    return env


def _template_line(exc: BaseException, filename: str | None) -> int | None:
    """The template line a rendering error came from (Jinja rewrites tracebacks to template lines)."""
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if filename and frame.filename == filename:
            line = frame.lineno
    return line


def render(template: str, context: dict[str, Any], *, templates_dir: Path | None = None) -> str:
    """Render the template named ``template`` (a file in ``templates_dir``, else a built-in) with
    ``context``; return the JSON text (checked to parse).

    Raises:
        TicketError: not a name, not found, not UTF-8 text or too large, syntax error, runtime error
            (undefined variable, sandbox violation) or output that is not JSON; the message names
            the template and its line.
    """
    env = environment(templates_dir)
    try:
        tmpl = env.get_template(template)
    except TemplateNotFound:
        raise TicketError(
            f"ticket template {template!r} not found (built-in: {', '.join(builtin_templates())})"
        ) from None
    except TemplateSyntaxError as exc:
        raise TicketError(f"ticket template {template} line {exc.lineno}: {exc.message}") from None
    try:
        text = tmpl.render(context)
    except TicketError as exc:
        line = _template_line(exc, tmpl.filename)
        raise TicketError(f"ticket template {template} line {line}: {exc}") from None
    except (TemplateError, TypeError, ValueError, KeyError, AttributeError) as exc:
        line = _template_line(exc, tmpl.filename)
        raise TicketError(
            f"ticket template {template} line {line}: {exc.__class__.__name__}: {exc}"
        ) from None
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        raise TicketError(
            f"ticket template {template} renders invalid JSON at output line {exc.lineno} "
            f"column {exc.colno}: {exc.msg} (use the tojson filter for every value)"
        ) from None
    return text
